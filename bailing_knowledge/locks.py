"""The lock that guards a knowledge base's chunks, and the order every writer takes it in.

One advisory lock per knowledge base. Whatever writes or deletes its documents or chunks
shares it (the chunk triggers of migration 0005 too, as they count terms); what rewrites all
of them at once, or changes how they are made, takes it alone: the rebuild of a language
change (`ingestion.lexicon`) and the switch to another embedder (`services.reindex`). Held
until the transaction ends.

Lock order, for everyone: the knowledge base's row, then this lock, then document rows, then
chunk rows. A writer that locked a document or chunk row first would wait in the triggers
for a rebuild that waits for that row: a deadlock, which PostgreSQL ends by failing one of
the two.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import DEFAULT_DB_ALIAS, connections

#: The advisory lock class ("bklx"); the key is the knowledge base's id modulo 2**31.
WRITE_LOCK_CLASS = 0x626B6C78
#: `KnowledgeBase`'s table (models import this module, so it cannot ask them).
KNOWLEDGE_BASE_TABLE = "bailing_knowledge_knowledgebase"

# The rows first, against their deletion (a key share: updates of other columns go on).
_KEEP = f"SELECT 1 FROM {KNOWLEDGE_BASE_TABLE} WHERE id = ANY(%s) ORDER BY id FOR KEY SHARE"  # noqa: S608
_SHARE = "SELECT pg_advisory_xact_lock_shared(%s, k) FROM unnest(%s::int[]) AS k"
_ALONE = "SELECT pg_advisory_xact_lock(%s, %s)"


def share_write_lock(kb_ids: Iterable[int], using: str = DEFAULT_DB_ALIAS) -> None:
    """Hold the rows of the knowledge bases in `kb_ids` against their deletion, then share
    their write locks (in key order), until the transaction ends: what a writer of their
    documents or chunks takes before any of those rows."""
    ids = sorted(set(kb_ids))
    if ids:
        with connections[using].cursor() as cursor:
            cursor.execute(_KEEP, [ids])
            cursor.execute(_SHARE, [WRITE_LOCK_CLASS, sorted({i % 2**31 for i in ids})])


def take_write_lock(kb_id: int, using: str = DEFAULT_DB_ALIAS) -> None:
    """Hold the write lock of `kb_id` alone until the transaction ends: no chunk of the
    knowledge base is written or deleted meanwhile, and writers that shared it have ended."""
    with connections[using].cursor() as cursor:
        cursor.execute(_ALONE, [WRITE_LOCK_CLASS, kb_id % 2**31])
