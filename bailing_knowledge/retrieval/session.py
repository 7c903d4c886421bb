"""The transaction a search runs in: one snapshot, settings set once at its start, and
statements sent several to a round trip where the driver allows; and statements whose rows
are used as they arrive."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from psycopg import IsolationLevel, capabilities
from psycopg.pq import TransactionStatus

from ..conf import knowledge_settings
from ..statements import (
    SEPARATOR,
    Answer,
    Arrival,
    Part,
    answer_rows,
    claim,
    client_binding,
    connection_of,
    discard,
    pending_statements,
    read_claimed,
    run_each,
    run_wrapped,
)

_CONFIGURE = (
    "/* bk:configure */ SELECT set_config('statement_timeout', %s, true), "
    "set_config('hnsw.ef_search', %s, true), "
    "set_config('hnsw.iterative_scan', 'relaxed_order', true), "
    # The legs' cost estimates cross the JIT threshold, and compiling them costs more than
    # running them.
    "set_config('jit', 'off', true), "
    # A lexical round looks each level up in the GIN index; on a small table the planner
    # would rather test every chunk against every level, which costs levels x chunks.
    "set_config('enable_seqscan', 'off', true), "
    # Where the deployment prepares statements (Django's `server_side_binding` with psycopg's
    # `prepare_threshold`), plan each once per connection: left to choose, PostgreSQL plans
    # the vector leg, the statistics and the fetch anew every time, and their plans do not
    # depend on the values. Without prepared statements this changes nothing.
    "set_config('plan_cache_mode', 'force_generic_plan', true)"
)


def configure_statement() -> tuple[str, list[str]]:
    """The statement that bounds the transaction's statements and steers its plans
    (settings local to it)."""
    timeout = int(knowledge_settings.SEARCH_STATEMENT_TIMEOUT_MS)
    return _CONFIGURE, [f"{timeout}ms", str(int(knowledge_settings.SEARCH_EF_SEARCH))]


def configure_search(cursor: Any) -> None:
    """Run `configure_statement`."""
    cursor.execute(*configure_statement())


#: A statement and its parameters, as a cursor's `execute` takes them.
Statement = tuple[str, Any]
#: How a search begins its own transaction: the isolation level rides on the BEGIN itself.
BEGIN = "BEGIN ISOLATION LEVEL REPEATABLE READ"


class SearchTransaction:
    """The transaction a search runs in, and how its statements reach the server.

    Django binds parameters on the client by default, so one query string can carry several
    statements, and the server answers them in one round trip. A search sends its opening
    statements (settings, term statistics, the vector leg) as one such string, and its
    fetch as another. In a transaction of its own it also writes the `BEGIN` at the head of
    the first and the `COMMIT` at the end of the last, instead of a round trip for each:
    Django's `atomic` cannot, since the driver sends the BEGIN it implies on its own. Where
    parameters are bound on the server (`server_side_binding`), each statement goes alone.
    """

    def __init__(self, *, batches: bool, own: bool, db: Any = None) -> None:
        #: The Django connection it runs on: the default one, resolved once (each access
        #: through `django.db.connection` looks it up again).
        self.db = connections[DEFAULT_DB_ALIAS] if db is None else db
        #: Statements may share a query string (client-side binding).
        self.batches = batches
        #: This object writes BEGIN and COMMIT (else Django's `atomic` does).
        self.own = own
        #: After `run` raised: how many of its statements had answered (None before any run).
        self.answered: int | None = None
        self._begun = False
        self._ended = False
        self._rollback = False

    def run(
        self,
        cursor: Any,
        statements: Sequence[Statement],
        *,
        last: bool = False,
        arrived: Arrival | None = None,
        part: Part | None = None,
        batch: int = 0,
    ) -> list[Answer]:
        """Run `statements` in order: the rows of each (None for those that return none).

        `last`: nothing follows in this transaction, so its COMMIT may go with them.
        `arrived`: called with each statement's place and answer as soon as the driver has
        read it (`run_each`); it must not use the connection, which is still busy with the
        statements after it. An error in one statement raises it,
        and the statements after it do not run; an error raised by `arrived` is raised once
        the server has answered them all. `part`: called with each statement's rows, `batch`
        at a time, as they arrive and before its answer, where statements share a query
        string (`run_each`).
        """
        if self._ended:
            raise RuntimeError("the search transaction has ended")
        results: list[Answer] = []
        if not self.batches:
            self.answered = 0
            for sql, params in statements:
                cursor.execute(sql, params)
                results.append(answer_rows(cursor))
                self.answered += 1
                if arrived is not None:
                    arrived(len(results) - 1, results[-1])
            return results
        self.answered = 0
        lead = 1 if self.own and not self._begun else 0  # the BEGIN `parts` writes first
        parts = self.parts(cursor, statements, last=last)
        closing = self.own and last
        self._begun = True

        def answered(index: int, answer: Answer) -> None:
            if lead <= index < lead + len(statements):
                results.append(answer)
                self.answered = len(results)
                if arrived is not None:
                    arrived(index - lead, answer)

        def arriving(index: int, chunk: list[tuple[Any, ...]]) -> None:
            if part is not None and lead <= index < lead + len(statements):
                part(index - lead, chunk)

        sent = claim(self.db, parts)
        if sent is not None:
            # Sent ahead, behind the request's first statement (`early_parts`).
            read_claimed(cursor, sent, answered, arriving if part else None, batch)
        else:
            run_each(cursor, SEPARATOR.join(parts), answered, arriving if part else None, batch)
        self._ended = closing
        return results

    def parts(self, cursor: Any, statements: Sequence[Statement], *, last: bool) -> list[str]:
        """The statements as `run` sends them (client-side binding): their values in
        place, after the transaction's BEGIN and before its COMMIT where it writes them."""
        raw = getattr(cursor, "cursor", cursor)
        with self.db.wrap_database_errors:
            parts = [raw.mogrify(sql, params) for sql, params in statements]
        if self.own and not self._begun:
            parts.insert(0, BEGIN)
        if self.own and last:
            parts.append("COMMIT")
        return parts

    def rollback(self) -> None:
        """End the transaction with a rollback (after a statement aborted it)."""
        if self.own:
            self._rollback = True
        else:
            transaction.set_rollback(True)

    def _end(self, failed: bool) -> None:
        """COMMIT what is still open, or ROLLBACK after an error or `rollback`.

        A connection that cannot end the transaction is closed: handed on, it would run the
        next request's statements inside this one (or in its aborted state)."""
        db = self.db
        raw = db.connection
        if raw is None or raw.closed:
            return
        status = raw.info.transaction_status
        if status == TransactionStatus.IDLE:
            return
        ending = "ROLLBACK" if failed or self._rollback else "COMMIT"
        try:
            if status not in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
                raise DatabaseError(f"the connection is in no state to {ending}")
            with db.cursor() as cursor:
                cursor.execute(ending)
        except BaseException:
            db.close()
            if not failed:
                raise


def early_parts(cursor: Any, statements: Sequence[Statement], *, first: bool = True) -> list[str]:
    """`statements` as a search in a transaction of its own sends them first (after its
    BEGIN, unless not `first`: more of them), each apart: what may be sent ahead of the
    search (`statements.first_row`'s `follow`), and is used only if the search, once it
    runs, would send exactly these (`SearchTransaction.run`)."""
    parts = SearchTransaction(batches=True, own=True, db=connection_of(cursor)).parts(
        cursor, statements, last=False
    )
    return parts if first else parts[1:]


@contextmanager
def search_transaction() -> Iterator[SearchTransaction]:
    """A transaction whose statements all see one snapshot (REPEATABLE READ).

    The legs find chunks and the fetch validates them against their documents; under READ
    COMMITTED a re-ingestion committed between those statements turns found knowledge into
    stale hits. The isolation level rides on the transaction's own BEGIN: written by the
    search into its first query string (`SearchTransaction`), or set for psycopg to write.

    Inside a transaction of the caller's (or where `AUTOCOMMIT` is off, in the one the
    driver opens) that transaction's snapshot and isolation apply, since neither can be
    chosen after its first statement. The search runs in a savepoint, rolled back at the
    end: it only reads, and the rollback also undoes its settings (`set_config(..., true)`
    lasts until the end of the transaction, not of the savepoint).
    """
    db = connections[DEFAULT_DB_ALIAS]
    db.ensure_connection()
    raw = db.connection
    batches = client_binding(db)
    if pending_statements(db) is not None and (db.in_atomic_block or not raw.autocommit):
        discard(db)
    # Statements sent ahead (`early_parts`) began a transaction of this search's own.
    idle = (
        raw.info.transaction_status == TransactionStatus.IDLE or pending_statements(db) is not None
    )
    if db.in_atomic_block or not raw.autocommit or not idle:
        with transaction.atomic():
            yield SearchTransaction(batches=batches, own=False, db=db)
            transaction.set_rollback(True)
        return
    if batches:
        own = SearchTransaction(batches=True, own=True, db=db)
        try:
            yield own
        except BaseException:
            own._end(failed=True)
            raise
        own._end(failed=False)
        return
    previous = raw.isolation_level
    raw.isolation_level = IsolationLevel.REPEATABLE_READ
    try:
        with transaction.atomic():
            yield SearchTransaction(batches=batches, own=False, db=db)
    finally:
        # The connection may have been closed or left mid-transaction by an error; only an
        # idle one takes a new isolation level.
        if not raw.closed and raw.info.transaction_status == TransactionStatus.IDLE:
            raw.isolation_level = previous


def stream_rows(
    cursor: Any,
    sql: str,
    params: Mapping[str, Any],
    consume: Callable[[Sequence[tuple[Any, ...]]], None],
    batch: int,
) -> None:
    """Run `sql` and hand its rows to `consume`, `batch` at a time, as they arrive.

    PostgreSQL sends rows as it finds them, so the caller's work on one batch overlaps the
    server's on the next, where `fetchall` makes it wait for the last row first. The
    statement runs as Django runs any: inside the connection's execute wrappers (the
    request's database deadline among them) and with Django's database errors. Reading by
    batches needs libpq 17 or newer; with an older one the rows come after the last.
    """
    raw = getattr(cursor, "cursor", cursor)
    db = connection_of(cursor)

    def execute(sql: str, params: Any, many: bool, context: Any) -> None:
        with db.wrap_database_errors:
            if not capabilities.has_stream_chunked():
                raw.execute(sql, params)
                answer = raw.fetchall()
                for start in range(0, len(answer), batch):
                    consume(answer[start : start + batch])
                return
            rows: list[tuple[Any, ...]] = []
            for row in raw.stream(sql, params, size=batch):
                rows.append(row)
                if len(rows) >= batch:
                    consume(rows)
                    rows = []
            if rows:
                consume(rows)

    run_wrapped(cursor, execute, sql, params)
