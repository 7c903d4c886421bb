"""Statements sent through a Django connection, read answer by answer.

Django's cursor sends a query string and waits for all of it. Here a query string of
several statements (Django binds parameters on the client by default, so they can share
one) has each answer handed on as soon as it is read, the rows of its last statement even
while the server finds them, and the caller may do other work while the server runs them
(`run_each`'s `meanwhile`): the request's first statement, authentication's, runs while the
request's body is validated. Everything runs as Django runs a query: inside the
connection's execute wrappers (the request's database deadline among them), with Django's
database errors, and logged where Django logs queries.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from django.db import connection
from psycopg import ClientCursor, capabilities, errors, generators
from psycopg.adapt import Transformer
from psycopg.pq import ExecStatus, TransactionStatus

#: The rows of a statement (None for one that returns none).
Answer = list[tuple[Any, ...]] | None
#: Called with a statement's place in its batch and its answer, as soon as that answer is in.
Arrival = Callable[[int, Answer], None]
#: Called with a statement's place and a batch of its rows, as they arrive (`run_each`).
Part = Callable[[int, list[tuple[Any, ...]]], None]

# Where Django's debug cursor logs each statement.
_backends_log = logging.getLogger("django.db.backends")


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
    cursor: Any, sql: str, params: Any, *, meanwhile: Callable[[], None] | None = None
) -> tuple[Any, ...] | None:
    """The first row of the statement `sql` (None if it has none), run as `run_each` runs
    one, with `meanwhile` called while the server runs it. Where parameters are bound on
    the server (`client_binding`), the statement goes through the cursor as usual and
    `meanwhile` is called first; so it is where the driver would begin a transaction with
    the statement (autocommit off, none begun yet), which only its own `execute` does."""
    db = connection_of(cursor)
    raw = getattr(cursor, "cursor", cursor)
    if meanwhile is None or not client_binding(db) or _begins_transaction(raw.connection):
        if meanwhile is not None:
            meanwhile()
        cursor.execute(sql, params)
        return cursor.fetchone()
    with db.wrap_database_errors:
        text = raw.mogrify(sql, params)
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
    encoding = conn.info.encoding
    loader = Transformer(raw)
    failure: BaseException | None = None
    rows: list[tuple[Any, ...]] = []
    with conn.lock:
        pgconn.send_query(text.encode(encoding))
        if part is not None and batch > 0 and capabilities.has_stream_chunked():
            pgconn.set_chunked_rows_mode(batch)
        conn.wait(generators.send(pgconn))
    if meanwhile is not None:
        # Without the connection's lock: a statement `meanwhile` sent here would wait for
        # it forever; without it, the driver refuses the statement at once.
        try:
            meanwhile()
        except BaseException as exc:  # raised once the server is done
            failure = exc
    with conn.lock:
        index = 0
        while True:
            try:
                result = conn.wait(generators.fetch(pgconn))
            except errors.Error as exc:
                if failure is None:
                    raise
                if not isinstance(failure, errors.Error):
                    # The connection broke after the caller's own work failed: the broken
                    # connection is what Django must see, to discard it.
                    raise exc from failure
                # The connection broke after an error already in hand (a server that ends
                # the session sends its reason, then closes): that error is the cause.
                raise failure from exc
            if result is None:
                break
            status = result.status
            if status == ExecStatus.FATAL_ERROR:
                failure = failure or errors.error_from_result(result, encoding=encoding)
            elif failure is None:
                try:
                    if status in _ROWS:
                        loader.set_pgresult(result)
                        loaded = loader.load_rows(0, result.ntuples, tuple)
                        if part is not None and loaded:
                            part(index, loaded)
                        rows += loaded
                    if status not in _PARTS:
                        answered(index, rows if status == ExecStatus.TUPLES_OK else None)
                        rows = []
                except BaseException as exc:  # raised once the server is done
                    failure = exc
            if status not in _PARTS:
                index += 1
    if failure is not None:
        raise failure


# Results that carry rows, and those that are only a part of a statement's answer (read in
# chunks: `run_each`'s `part`).
_PARTS = (ExecStatus.TUPLES_CHUNK, ExecStatus.SINGLE_TUPLE)
_ROWS = (ExecStatus.TUPLES_OK, *_PARTS)


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
