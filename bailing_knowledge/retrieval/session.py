"""The settings a search transaction runs with, set once at its start."""

from __future__ import annotations

from typing import Any

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
    "set_config('enable_seqscan', 'off', true)"
)


def configure_search(cursor: Any) -> None:
    """Bound the transaction's statements and steer its plans (settings local to it)."""
    timeout = int(knowledge_settings.SEARCH_STATEMENT_TIMEOUT_MS)
    cursor.execute(_CONFIGURE, [f"{timeout}ms", str(int(knowledge_settings.SEARCH_EF_SEARCH))])
