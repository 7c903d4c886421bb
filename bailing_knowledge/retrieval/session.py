"""The transaction a search runs in: one snapshot, and settings set once at its start; and
statements whose rows are used as they arrive."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from django.db import connection, transaction
from psycopg import IsolationLevel, capabilities
from psycopg.pq import TransactionStatus

from ..conf import knowledge_settings

_CONFIGURE = (
    "SELECT set_config('statement_timeout', %s, true), "
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


def configure_search(cursor: Any) -> None:
    """Bound the transaction's statements and steer its plans (settings local to it)."""
    timeout = int(knowledge_settings.SEARCH_STATEMENT_TIMEOUT_MS)
    cursor.execute(_CONFIGURE, [f"{timeout}ms", str(int(knowledge_settings.SEARCH_EF_SEARCH))])


@contextmanager
def search_transaction() -> Iterator[None]:
    """A transaction whose statements all see one snapshot (REPEATABLE READ).

    The legs find chunks and the fetch validates them against their documents; under READ
    COMMITTED a re-ingestion committed between those statements turns found knowledge into
    stale hits. The isolation level rides on the transaction's own BEGIN (psycopg writes it
    there), so it costs no round trip. Inside a caller's transaction the caller's isolation
    applies: a snapshot cannot be chosen after the first statement.
    """
    if connection.in_atomic_block:
        with transaction.atomic():
            yield
        return
    connection.ensure_connection()
    raw = connection.connection
    previous = raw.isolation_level
    raw.isolation_level = IsolationLevel.REPEATABLE_READ
    try:
        with transaction.atomic():
            yield
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

    def execute(sql: str, params: Any, many: bool, context: Any) -> None:
        with connection.wrap_database_errors:
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

    # The chain Django's own cursor builds (its `_execute_with_wrappers` is private).
    call: Callable[..., None] = execute
    for wrapper in reversed(connection.execute_wrappers):
        call = functools.partial(wrapper, call)
    call(sql, params, False, {"connection": connection, "cursor": cursor})
