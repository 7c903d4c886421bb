"""Statements sent through a Django connection, read answer by answer.

Django's cursor sends a query string and waits for all of it. Here a query string of
several statements (Django binds parameters on the client by default, so they can share
one) has each answer handed on as soon as it is read, the rows of its last statement even
while the server finds them, and the caller may do other work while the server runs them
(`run_each`'s `meanwhile`): the request's first statement, authentication's, runs while the
request's body is validated. A first statement may also have others sent right behind it
(`first_row`'s `follow`, in libpq's pipeline mode): they run while the caller reads the
first one's answer and goes on, and wait on the connection for the caller to claim their
answers (`claim`, `read_claimed`) or for anything else sent there to discard them first
(`discard`). Everything runs as Django runs a query: inside the connection's execute
wrappers (the request's database deadline among them), with Django's database errors, and
logged where Django logs queries.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from django.db import connection
from psycopg import ClientCursor, capabilities, errors, generators
from psycopg.adapt import Transformer
from psycopg.pq import ExecStatus, PipelineStatus, TransactionStatus

#: The rows of a statement (None for one that returns none).
Answer = list[tuple[Any, ...]] | None
#: Called with a statement's place in its batch and its answer, as soon as that answer is in.
Arrival = Callable[[int, Answer], None]
#: Called with a statement's place and a batch of its rows, as they arrive (`run_each`).
Part = Callable[[int, list[tuple[Any, ...]]], None]
#: Called with the cursor once a first statement is sent: the statements to send behind
#: it, each one statement with its values in place, in groups that each leave as soon as
#: they are composed, or None (`first_row`).
Follow = Callable[[Any], "Iterable[list[str]] | None"]

#: Between the statements of one query string, on a line of its own: a statement that ends
#: in a `--` comment cannot swallow it.
SEPARATOR = "\n;\n"

# Where Django's debug cursor logs each statement.
_backends_log = logging.getLogger("django.db.backends")
logger = logging.getLogger("bailing_knowledge")


def answer_rows(cursor: Any) -> list[tuple[Any, ...]] | None:
    """The rows of the cursor's current result (a Django or a psycopg cursor), None for a
    statement that returns none.

    Asked of the result's status: psycopg builds `description` anew on every access. The
    benchmarks read the answers of their replays the same way."""
    raw = getattr(cursor, "cursor", cursor)
    result = raw.pgresult
    if result is None or result.status != ExecStatus.TUPLES_OK:
        return None
    return cursor.fetchall()


def run_each(
    cursor: Any,
    text: str,
    answered: Arrival,
    part: Part | None = None,
    batch: int = 0,
    *,
    meanwhile: Callable[[], None] | None = None,
) -> None:
    """Send the statements of the query string `text` in one round trip and hand each answer
    to `answered` as soon as it is read, with its place in `text`; with `part`, also each
    statement's rows, `batch` at a time (libpq 17+; else all at once), as they arrive.
    `meanwhile` is called once they are sent, before any answer is read: the server runs
    them while it works. It must not use the connection, which is busy with them: a
    statement it sent there would fail (it never waits on it). An error it raises, like one
    raised by `answered` or `part`, is raised once the server has answered them all. The
    text is sent as it is: where the driver would begin a transaction before it (autocommit
    off, none begun yet), the caller writes the `BEGIN`, as `SearchTransaction` does.

    Read this way, each answer is known by its statement, so a caller can tell which one
    failed (`SearchTransaction.answered`), which a driver cursor's `execute` does not say.
    The server sends a query string's answers together once its last statement has run,
    except what fills its output buffer: the rows of the last statement leave as it finds
    them, so a caller can work on them while it reads on. (A pipeline with a flush after
    each statement would hand every answer on early, but costs more than it saves:
    docs/performance.md.) The query runs as Django runs any: inside the connection's
    execute wrappers (the request's database deadline among them) and with Django's
    database errors. However it fails, every answer is read before this returns, so the
    connection is left ready for its next statement (unless the connection itself broke,
    which Django then discards). `answered` and `part` run while the connection is busy (and
    its lock held): they must not use it."""
    raw = getattr(cursor, "cursor", cursor)
    db = connection_of(cursor)

    def execute(sql: str, params: Any, many: bool, context: Any) -> None:
        with db.wrap_database_errors:
            _receive(raw, sql, answered, part, batch, meanwhile)

    run_wrapped(cursor, execute, text, None)


def first_row(
    cursor: Any,
    sql: str,
    params: Any,
    *,
    meanwhile: Callable[[], None] | None = None,
    follow: Follow | None = None,
) -> tuple[Any, ...] | None:
    """The first row of the statement `sql` (None if it has none), run as `run_each` runs
    one, with `meanwhile` called while the server runs it. Where parameters are bound on
    the server (`client_binding`), the statement goes through the cursor as usual and
    `meanwhile` is called first; so it is where the driver would begin a transaction with
    the statement (autocommit off, none begun yet), which only its own `execute` does.

    `follow` is called with `cursor` once the statement is sent, before `meanwhile`; the
    statements it returns (each one statement, values in place) are sent right behind it,
    in libpq's pipeline mode after a sync, so in a transaction of their own, and left
    pending on the connection (`claim`) once its answer is read. They come in groups, each
    sent as soon as it is composed: the server starts on the first while the next ones are
    (a generator's work between its groups). It must not use the connection. Only where
    nothing else may be running there: parameters bound on the client, autocommit, no
    transaction, nothing pending already; elsewhere it is not called."""
    db = connection_of(cursor)
    raw = getattr(cursor, "cursor", cursor)
    hurried = meanwhile is not None or follow is not None
    if not hurried or not client_binding(db) or _begins_transaction(raw.connection):
        if meanwhile is not None:
            meanwhile()
        cursor.execute(sql, params)
        return cursor.fetchone()
    with db.wrap_database_errors:
        text = raw.mogrify(sql, params)
    if follow is not None and _may_pipeline(db, raw.connection):
        found: list[tuple[Any, ...] | None] = []

        def piped(sql: str, params: Any, many: bool, context: Any) -> None:
            with db.wrap_database_errors:
                found.append(_first_in_pipeline(cursor, text, meanwhile, follow))

        run_wrapped(cursor, piped, text, None)
        return found[0]
    rows: list[tuple[Any, ...]] = []

    def answered(place: int, answer: Answer) -> None:
        rows.extend(answer or ())

    run_each(cursor, text, answered, meanwhile=meanwhile)
    return rows[0] if rows else None


def _begins_transaction(conn: Any) -> bool:
    """Whether psycopg would send a BEGIN before the next statement on `conn`."""
    return not conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE


def _receive(
    raw: Any,
    text: str,
    answered: Arrival,
    part: Part | None,
    batch: int,
    meanwhile: Callable[[], None] | None = None,
) -> None:
    conn = raw.connection
    pgconn = conn.pgconn
    reader = _Reader(raw, answered, part, batch)
    with conn.lock:
        pgconn.send_query(text.encode(reader.encoding))
        if part is not None and batch > 0 and capabilities.has_stream_chunked():
            pgconn.set_chunked_rows_mode(batch)
        conn.wait(generators.send(pgconn))
    if meanwhile is not None:
        # Without the connection's lock: a statement `meanwhile` sent here would wait for
        # it forever; without it, the driver refuses the statement at once.
        reader.attempt(meanwhile)
    with conn.lock:
        while (result := reader.fetch()) is not None:
            reader.take(result)
    if reader.failure is not None:
        raise reader.failure


# Results that carry rows, and those that are only a part of a statement's answer (read in
# chunks: `run_each`'s `part`).
_PARTS = (ExecStatus.TUPLES_CHUNK, ExecStatus.SINGLE_TUPLE)
_ROWS = (ExecStatus.TUPLES_OK, *_PARTS)


# Where statements sent behind a first one wait on the Django connection (`Pending`).
_PENDING = "bailing_knowledge_pending"


class Pending:
    """Statements sent behind a first one (`first_row`'s `follow`) whose answers have not
    been read: the connection is still in pipeline mode, busy with them.

    While they wait, this object is one of the connection's execute wrappers: any statement
    sent through Django discards them first (`discard`), so nothing else ever runs, or
    fails, behind them; only the caller that claims them exactly (`claim`) reads them."""

    def __init__(self, db: Any, statements: list[str]) -> None:
        self.db = db
        self.statements = tuple(statements)
        #: The driver connection they wait on: once Django has closed it, nothing does.
        self.conn = db.connection

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        discard(self.db)
        return execute(sql, params, many, context)


def _may_pipeline(db: Any, conn: Any) -> bool:
    return (
        capabilities.has_pipeline()
        and conn.autocommit
        and not db.in_atomic_block
        and conn.info.transaction_status == TransactionStatus.IDLE
        and conn.pgconn.pipeline_status == PipelineStatus.OFF
        and getattr(db, _PENDING, None) is None
    )


def _first_in_pipeline(
    cursor: Any, text: str, meanwhile: Callable[[], None] | None, follow: Follow
) -> tuple[Any, ...] | None:
    """`first_row` with statements sent behind it: the first and a sync (so that they
    begin a transaction of their own), `follow`'s statements and a sync, then `meanwhile`
    while the server works, then the first one's answer."""
    db = connection_of(cursor)
    raw = getattr(cursor, "cursor", cursor)
    conn = raw.connection
    pgconn = conn.pgconn
    reader = _Reader(raw, _keep_nothing, None)
    syncs = 0
    with conn.lock:
        pgconn.enter_pipeline_mode()
        try:
            pgconn.send_query_params(text.encode(reader.encoding), None)
            pgconn.pipeline_sync()
            syncs = 1
            conn.wait(generators.send(pgconn))
        except BaseException:
            if not conn.broken:
                _leave_pipeline(conn, syncs)
            raise
    sent: list[str] = []

    def send_followers() -> None:
        # Each group leaves as soon as it is composed: the server starts on it while the
        # next one is. A sync ends what was sent, however composing ends.
        try:
            for group in follow(cursor) or ():
                if group:
                    first = not sent
                    with conn.lock:
                        sent.extend(group)
                        for statement in group:
                            pgconn.send_query_params(statement.encode(reader.encoding), None)
                        started = time.perf_counter()
                        conn.wait(generators.send(pgconn))
                    if first:
                        _overlap.note(time.perf_counter() - started)
        finally:
            if sent:
                with conn.lock:
                    pgconn.pipeline_sync()
                    conn.wait(generators.send(pgconn))

    reader.attempt(send_followers)
    if meanwhile is not None:
        reader.attempt(meanwhile)
    try:
        with conn.lock:
            reader.read_pipelined(1)
        kept = reader.failure is None and bool(sent)
        if not kept:
            _drop(conn, 1 if sent else 0)
    except BaseException:
        if not conn.closed and conn.pgconn.pipeline_status != PipelineStatus.OFF:
            db.close()  # what is still in flight cannot be told apart from what follows
        raise
    if reader.failure is not None:
        raise reader.failure
    if sent:
        pending = Pending(db, sent)
        setattr(db, _PENDING, pending)
        db.execute_wrappers.append(pending)
    return reader.first_row


#: Sending statements ahead pays only where the server runs them while this process goes
#: on with its own work. Where the server runs on this machine and the processors are busy,
#: the kernel runs the server, woken by the write, on this process's processor instead, and
#: the write keeps the process off it until the server is done: milliseconds, where the
#: write takes microseconds otherwise (docs/performance.md). Past `AHEAD_STALLS` such first
#: writes among the last `AHEAD_WINDOW`, sending ahead pauses for `AHEAD_PAUSE_SECONDS`.
AHEAD_STALLED_SECONDS = 0.0005
AHEAD_WINDOW = 8
AHEAD_STALLS = 4
AHEAD_PAUSE_SECONDS = 10.0


class _Overlap:
    """What the first writes of statements sent ahead say of this process's processors."""

    def __init__(self) -> None:
        self.recent: deque[bool] = deque(maxlen=AHEAD_WINDOW)
        self.paused_until = 0.0
        # Threads of one process note theirs: counting the window while another appends
        # would raise.
        self._lock = threading.Lock()

    def note(self, seconds: float) -> None:
        with self._lock:
            self.recent.append(seconds >= AHEAD_STALLED_SECONDS)
            if sum(self.recent) < AHEAD_STALLS:
                return
            self.recent.clear()
            self.paused_until = time.monotonic() + AHEAD_PAUSE_SECONDS
        logger.info(
            "Statements sent ahead kept the database server on this process's processor: "
            "not sending ahead for %s s",
            AHEAD_PAUSE_SECONDS,
        )

    def pays(self) -> bool:
        return time.monotonic() >= self.paused_until


_overlap = _Overlap()


def sending_ahead_pays() -> bool:
    """Whether to send statements behind a first one (`first_row`'s `follow`) now: not for
    a while after most of the last ones stalled this process as they left (`_Overlap`)."""
    return _overlap.pays()


def _keep_nothing(place: int, answer: Answer) -> None:
    """An `Arrival` that keeps nothing: `_Reader.first_row` holds what `first_row` needs."""


def _leave_pipeline(conn: Any, syncs: int) -> None:
    """Read and drop every answer up to the `syncs`-th sync, then leave pipeline mode."""
    pgconn = conn.pgconn
    while syncs > 0:
        result = conn.wait(generators.fetch(pgconn))
        if result is not None and result.status == ExecStatus.PIPELINE_SYNC:
            syncs -= 1
    pgconn.exit_pipeline_mode()


def _drop(conn: Any, syncs: int) -> None:
    """Leave pipeline mode after the `syncs`-th sync, and roll back what the statements
    sent behind began."""
    with conn.lock:
        _leave_pipeline(conn, syncs)
    if conn.info.transaction_status != TransactionStatus.IDLE:
        conn.execute("ROLLBACK")


def pending_statements(db: Any) -> tuple[str, ...] | None:
    """The statements waiting on the Django connection `db` (`Pending`), if any."""
    pending = getattr(db, _PENDING, None)
    return None if pending is None else pending.statements


def claim(db: Any, statements: list[str]) -> Pending | None:
    """The pending statements of `db` if they are exactly `statements`, for `read_claimed`;
    others pending are discarded (None)."""
    pending = getattr(db, _PENDING, None)
    if pending is None:
        return None
    if pending.statements != tuple(statements) or pending.conn is not db.connection:
        discard(db)
        return None
    _forget(db, pending)
    return pending


def _forget(db: Any, pending: Pending) -> None:
    setattr(db, _PENDING, None)
    if pending in db.execute_wrappers:
        db.execute_wrappers.remove(pending)


def read_claimed(
    cursor: Any,
    pending: Pending,
    answered: Arrival,
    part: Part | None = None,
    batch: int = 0,
) -> None:
    """Read the answers of claimed statements as `run_each` reads those it sends: each
    handed to `answered` with its place, rows to `part` as they arrive; an error raised once
    all are read; inside the connection's execute wrappers. The connection then leaves
    pipeline mode."""
    raw = getattr(cursor, "cursor", cursor)
    db = connection_of(cursor)
    text = SEPARATOR.join(pending.statements)

    def execute(sql: str, params: Any, many: bool, context: Any) -> None:
        with db.wrap_database_errors:
            conn = raw.connection
            with conn.lock:
                reader = _Reader(raw, answered, part, batch)
                try:
                    reader.read_pipelined(len(pending.statements))
                finally:
                    if not conn.broken:
                        conn.pgconn.exit_pipeline_mode()
            if reader.failure is not None:
                raise reader.failure

    run_wrapped(cursor, execute, text, None)


def discard(db: Any) -> None:
    """Drop the statements pending on `db` (`Pending`), if any: their answers are read and
    the transaction they began is rolled back, inside the connection's execute wrappers
    (the request's deadline among them). A connection that cannot is closed."""
    pending = getattr(db, _PENDING, None)
    if pending is None:
        return
    _forget(db, pending)
    conn = db.connection
    if conn is None or conn is not pending.conn or conn.closed:
        return

    def execute(sql: str, params: Any, many: bool, context: Any) -> None:
        with db.wrap_database_errors:
            _drop(conn, 1)

    try:
        run_wrapped(_Of(db), execute, "ROLLBACK", None)
    except BaseException:
        db.close()
        raise


class _Of:
    """Stands for a cursor of the Django connection `db` where `run_wrapped` needs one:
    opening a real one could run Django's health check on the busy connection."""

    def __init__(self, db: Any) -> None:
        self.db = db


class _Reader:
    """Reads a query's results as they come and hands them on: each statement's rows to
    `part` as they arrive (read in chunks) and its answer to `answered`; the first error is
    kept (`failure`) while the rest is read, so the connection is left ready."""

    def __init__(self, raw: Any, answered: Arrival, part: Part | None, batch: int = 0) -> None:
        conn = raw.connection
        self.conn = conn
        self.pgconn = conn.pgconn
        self.encoding = conn.info.encoding
        self.loader = Transformer(raw)
        self.answered = answered
        self.part = part
        self.batch = batch
        self.failure: BaseException | None = None
        self.index = 0
        self.rows: list[tuple[Any, ...]] = []
        #: The first row of the first statement's answer (`first_row`).
        self.first_row: tuple[Any, ...] | None = None

    def attempt(self, work: Callable[[], None]) -> None:
        """Call `work`, keeping what it raises for once the server is done."""
        try:
            work()
        except BaseException as exc:
            self.failure = self.failure or exc

    def fetch(self) -> Any:
        """The next result (None at the end of a statement's, or of the query's)."""
        try:
            return self.conn.wait(generators.fetch(self.pgconn))
        except errors.Error as exc:
            failure = self.failure
            if failure is None:
                raise
            if not isinstance(failure, errors.Error):
                # The connection broke after the caller's own work failed: the broken
                # connection is what Django must see, to discard it.
                raise exc from failure
            # The connection broke after an error already in hand (a server that ends the
            # session sends its reason, then closes): that error is the cause.
            raise failure from exc

    def take(self, result: Any) -> None:
        """One result of the query: a statement's answer or a chunk of its rows."""
        status = result.status
        if status == ExecStatus.FATAL_ERROR:
            self.failure = self.failure or errors.error_from_result(result, encoding=self.encoding)
        elif self.failure is None and status != ExecStatus.PIPELINE_ABORTED:
            try:
                if status in _ROWS:
                    self.loader.set_pgresult(result)
                    loaded = self.loader.load_rows(0, result.ntuples, tuple)
                    if self.part is not None and loaded:
                        self.part(self.index, loaded)
                    if loaded and self.index == 0 and self.first_row is None:
                        self.first_row = loaded[0]
                    self.rows += loaded
                if status not in _PARTS:
                    answer = self.rows if status == ExecStatus.TUPLES_OK else None
                    self.answered(self.index, answer)
                    self.rows = []
            except BaseException as exc:  # raised once the server is done
                self.failure = exc
        if status not in _PARTS:
            self.index += 1

    def read_pipelined(self, statements: int) -> None:
        """Read the answers of `statements` statements sent in pipeline mode and the sync
        after them, their rows in chunks where `part` takes them (libpq 17+)."""
        chunked = self.part is not None and self.batch > 0 and capabilities.has_stream_chunked()
        for _ in range(statements):
            if chunked:
                self.pgconn.set_chunked_rows_mode(self.batch)
            while (result := self.fetch()) is not None:
                self.take(result)
        result = self.fetch()
        if result is None or result.status != ExecStatus.PIPELINE_SYNC:
            raise errors.InternalError("the pipeline's answers are out of step")


def connection_of(cursor: Any) -> Any:
    """The Django connection of `cursor` (a Django cursor), else the default one."""
    return getattr(cursor, "db", connection)


def run_wrapped(cursor: Any, execute: Callable[..., None], sql: str, params: Any) -> None:
    """`execute(sql, params, ...)` as Django's own cursor runs a statement (its
    `_execute_with_wrappers` is private): refused in a transaction that must roll back,
    inside the connection's execute wrappers, and logged where Django logs queries
    (`DEBUG`, `CaptureQueriesContext`)."""
    db = connection_of(cursor)
    db.validate_no_broken_transaction()
    call: Callable[..., None] = execute
    for wrapper in reversed(db.execute_wrappers):
        call = functools.partial(wrapper, call)
    started = time.monotonic()
    try:
        call(sql, params, False, {"connection": db, "cursor": cursor})
    finally:
        if db.queries_logged:
            _log(db, sql, params, time.monotonic() - started)


def _log(db: Any, sql: str, params: Any, elapsed: float) -> None:
    """Log a statement as Django's debug cursor does, with its parameters in place (composed
    on the client whatever the binding). Logging never replaces the statement's outcome."""
    try:
        text = sql if params is None else db.ops.compose_sql(sql, params)
    except Exception:  # a query that cannot be shown is logged as sent
        text = sql
    db.queries_log.append({"sql": text, "time": f"{elapsed:.3f}"})
    _backends_log.debug(
        "(%.3f) %s; args=%s; alias=%s",
        elapsed,
        text,
        params,
        db.alias,
        extra={"duration": elapsed, "sql": text, "params": params, "alias": db.alias},
    )


def client_binding(db: Any = None) -> bool:
    """Whether Django binds parameters on the client here (its default), on `db` (a Django
    connection; the default one if None)."""
    factory = getattr((db or connection).connection, "cursor_factory", None)
    return isinstance(factory, type) and issubclass(factory, ClientCursor)
