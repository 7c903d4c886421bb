"""BM25 statistics stay exact as chunks come and go; rebuilding the lexical index."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import connection

from bailing_knowledge import services
from bailing_knowledge.ingestion.documents import delete_document, reindex_document, upsert_document
from bailing_knowledge.ingestion.lexicon import rebuild_lexical_index
from bailing_knowledge.models import Document, KnowledgeBase, LexiconTerm
from bailing_knowledge.retrieval.lexical import lexical_ranking
from bailing_knowledge.retrieval.visibility import Visibility

pytestmark = pytest.mark.django_db


def _counted(kb: KnowledgeBase) -> dict[str, tuple[int, int]]:
    """The statistics the triggers should hold, counted from the chunks themselves."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT split_part(v.lexeme, '|', 1), count(*), "
            "max(split_part(v.lexeme, '|', 2)::int) "
            "FROM bailing_knowledge_chunk c, unnest(c.search_vector) v "
            "WHERE c.knowledge_base_id = %s GROUP BY 1",
            [kb.pk],
        )
        counts = {term: (n, 0) for term, n, _ in cursor.fetchall()}
        cursor.execute(
            "SELECT count(*), coalesce(sum(lexical_length), 0) FROM bailing_knowledge_chunk "
            "WHERE knowledge_base_id = %s",
            [kb.pk],
        )
        chunks, length = cursor.fetchone()
    if chunks:
        counts[""] = (chunks, length)
    return counts


def _stored(kb: KnowledgeBase) -> dict[str, tuple[int, int]]:
    return {
        row.term: (row.chunks, row.length if row.term == "" else 0)
        for row in LexiconTerm.objects.filter(knowledge_base=kb)
        if row.chunks
    }


def test_statistics_follow_every_write_and_delete(kb):
    upsert_document(kb, "a.md", "Refunds", "Refunds are paid within thirty days. " * 40)
    upsert_document(kb, "b.md", "Shipping", "Parcels ship in two days.")
    assert _stored(kb) == _counted(kb)
    upsert_document(kb, "a.md", "Refunds", "Refunds are paid within ten days.")  # new revision
    assert _stored(kb) == _counted(kb)
    reindex_document(Document.objects.get(source_key="b.md"))
    assert _stored(kb) == _counted(kb)
    delete_document(kb, "b.md")
    assert _stored(kb) == _counted(kb)
    Document.objects.filter(knowledge_base=kb).delete()  # as the admin's bulk delete does
    assert _stored(kb) == {}


def test_deleting_a_knowledge_base_deletes_its_statistics(kb):
    upsert_document(kb, "a.md", "Refunds", "Refunds are paid within thirty days.")
    kb.delete()
    assert not LexiconTerm.objects.exists()


def test_top_levels_bound_every_posting(kb):
    upsert_document(kb, "a.md", "T", "refund " * 30 + "policy")
    upsert_document(kb, "b.md", "T", "refund policy " + "filler words here " * 80)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT split_part(v.lexeme, '|', 1), max(split_part(v.lexeme, '|', 2)::int) "
            "FROM bailing_knowledge_chunk c, unnest(c.search_vector) v GROUP BY 1"
        )
        highest = dict(cursor.fetchall())
    for row in LexiconTerm.objects.filter(knowledge_base=kb).exclude(term=""):
        assert row.top >= highest[row.term]


def test_changing_the_language_reindexes_the_terms(kb):
    upsert_document(kb, "run.md", "Exercise", "She runs every morning.")
    assert lexical_ranking("running", [kb], Visibility(), 5)
    kb = services.set_knowledge_base_language(kb, "simple")
    assert KnowledgeBase.objects.get(pk=kb.pk).language == "simple"
    assert lexical_ranking("running", [kb], Visibility(), 5) == []
    assert lexical_ranking("runs", [kb], Visibility(), 5)
    assert _stored(kb) == _counted(kb)


def test_an_unknown_language_is_refused_and_nothing_changes(kb):
    upsert_document(kb, "run.md", "Exercise", "She runs every morning.")
    with pytest.raises(ValidationError):
        services.set_knowledge_base_language(kb, "klingon")
    assert KnowledgeBase.objects.get(pk=kb.pk).language == "english"


def test_a_rebuild_restores_lost_statistics(kb):
    other = services.create_knowledge_base("other")
    upsert_document(kb, "a.md", "Refunds", "Refunds are paid within thirty days.")
    upsert_document(other, "b.md", "Shipping", "Parcels ship in two days.")
    before = _stored(other)
    LexiconTerm.objects.filter(knowledge_base=kb).delete()
    assert rebuild_lexical_index(kb) == 1
    assert _stored(kb) == _counted(kb)
    assert _stored(other) == before
