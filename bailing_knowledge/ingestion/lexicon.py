"""Rebuilding a knowledge base's lexical index: after a language change, or an upgrade.

Writing and deleting chunks keeps the index and its statistics current by themselves (the
chunk rows carry their lexemes; triggers on the chunk table count them into
`bailing_knowledge_lexicon`). What changes every chunk's terms at once — another language,
or an older index format — goes through `rebuild_lexical_index`: the chunks' lexemes are
computed again from their stored text and their document's title, and the KB's statistics
are counted again from the chunks, in one transaction.
"""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction

from ..locks import take_write_lock
from ..models import KnowledgeBase
from ..retrieval.analysis import document_terms
from ..retrieval.postings import chunk_terms, encode_terms

BATCH_CHUNKS = 2000

_STAGE = """
CREATE TEMPORARY TABLE IF NOT EXISTS bailing_knowledge_lexical_stage (
    id bigint PRIMARY KEY, lexical_length integer, levels text, terms text
) ON COMMIT DROP
"""

_UPDATE = """
UPDATE bailing_knowledge_chunk c
SET search_vector = s.levels::tsvector, lexical_terms = s.terms::tsvector,
    lexical_length = s.lexical_length
FROM bailing_knowledge_lexical_stage s
WHERE c.id = s.id
"""

# The statistics of one KB, counted from its chunks (the triggers add and subtract the same
# counts as chunks come and go: migrations/0005_lexical_bm25.py).
_COUNT = """
INSERT INTO bailing_knowledge_lexicon (knowledge_base_id, term, chunks, length, top)
SELECT %(kb)s, term, sum(n), sum(tf), max(level)
FROM (
    SELECT split_part(v.lexeme, '|', 1) AS term, 1 AS n, 0 AS tf,
           coalesce(nullif(split_part(v.lexeme, '|', 2), '')::smallint, 0) AS level
    FROM bailing_knowledge_chunk c, unnest(c.search_vector) v
    WHERE c.knowledge_base_id = %(kb)s
    UNION ALL
    SELECT '', 1, c.lexical_length, 0
    FROM bailing_knowledge_chunk c
    WHERE c.knowledge_base_id = %(kb)s
) counted
GROUP BY term
"""


# The KB's row first (the order of `locks`), and its language as it is now.
_LANGUAGE = (
    f"SELECT language FROM {KnowledgeBase._meta.db_table} "  # noqa: S608
    "WHERE id = %s FOR NO KEY UPDATE"
)


def rebuild_lexical_index(kb: KnowledgeBase) -> int:
    """Recompute the lexemes of every chunk of `kb` in its language (as stored, which `kb`
    takes); returns the chunks."""
    rebuilt = 0
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_LANGUAGE, [kb.pk])
        row = cursor.fetchone()
        if row is None:
            return 0  # deleted meanwhile
        kb.language = row[0]
        # Alone: no chunk of the KB is written or deleted while its statistics are counted.
        take_write_lock(kb.pk)
        cursor.execute(
            "SELECT id, title FROM bailing_knowledge_document WHERE knowledge_base_id = %s",
            [kb.pk],
        )
        titles = {
            document_id: document_terms(title, kb.language)
            for document_id, title in cursor.fetchall()
        }
        cursor.execute(_STAGE)
        last = 0
        while True:
            cursor.execute(
                'SELECT id, document_id, "text" FROM bailing_knowledge_chunk '
                "WHERE knowledge_base_id = %s AND id > %s ORDER BY id LIMIT %s",
                [kb.pk, last, BATCH_CHUNKS],
            )
            rows = cursor.fetchall()
            if not rows:
                break
            last = rows[-1][0]
            _write(cursor, rows, titles, kb.language)
            rebuilt += len(rows)
        cursor.execute(
            "DELETE FROM bailing_knowledge_lexicon WHERE knowledge_base_id = %s", [kb.pk]
        )
        cursor.execute(_COUNT, {"kb": kb.pk})
    return rebuilt


def _write(cursor: Any, rows: list[tuple[int, int, str]], titles: dict, language: str) -> None:
    with cursor.copy("COPY bailing_knowledge_lexical_stage FROM STDIN") as copy:
        for chunk_id, document_id, text in rows:
            lexical = encode_terms(chunk_terms(text, titles.get(document_id, []), language))
            copy.write_row((chunk_id, lexical.length, lexical.levels, lexical.terms))
    cursor.execute(_UPDATE)
    cursor.execute("TRUNCATE bailing_knowledge_lexical_stage")


def rebuild_all_lexical_indexes() -> int:
    """Every KB's lexical index, rebuilt: what upgrading from an older format needs."""
    return sum(rebuild_lexical_index(kb) for kb in KnowledgeBase.objects.order_by("pk"))
