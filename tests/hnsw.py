"""HNSW scans in the test database, which keeps an index entry for every rolled-back row.

Tests roll their rows back, but an HNSW index keeps their entries until it is vacuumed or
rebuilt, so the index of a long test run is mostly dead entries, many of them copies of the
same documents. A scan through them can end before it reaches the current test's rows, and
raising pgvector's scan limits (`hnsw.max_scan_tuples`, `hnsw.scan_mem_multiplier`) does not
help: with 90,000 dead copies of 30 chunks the leg found 0 or 1 of them either way, and all
30 after a rebuild (31 ms). A test that needs every live row rebuilds the index inside its
own transaction, which undoes the rebuild when it rolls back; a transactional test's rebuild
is committed, and only drops entries no row needs.
"""

from __future__ import annotations

from typing import Any

from bailing_knowledge import constants
from bailing_knowledge.database import vector_index_name


def rebuild_vector_index(
    cursor: Any, dimensions: int = constants.INDEXED_EMBEDDING_DIMENSIONS
) -> None:
    """Rebuild the HNSW index of `dimensions` from the rows this transaction sees."""
    cursor.execute(f"REINDEX INDEX {vector_index_name(dimensions)}")
