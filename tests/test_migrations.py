"""Upgrading: what `migrate` does to existing data and indexes, forwards and back."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import connection

from bailing_knowledge.ingestion.documents import upsert_document
from bailing_knowledge.models import Chunk, Document, LexiconTerm
from bailing_knowledge.retrieval.hybrid import HybridSearch
from bailing_knowledge.retrieval.lexical import lexical_ranking
from bailing_knowledge.retrieval.visibility import Visibility

pytestmark = pytest.mark.django_db

BEFORE_BM25 = "0004_document_body_storage"


def _insert_old_rows() -> None:
    """A KB, a document and a chunk as the version before migration 0005 wrote them."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO bailing_knowledge_knowledgebase "
            "(slug, title, description, enabled, embedder, tenant, language, created_at, "
            "updated_at) VALUES ('old', 'Old', '', true, 'default', '', 'english', now(), now()) "
            "RETURNING id"
        )
        (kb_id,) = cursor.fetchone()
        body = "Parcels are shipped within two days of the order."
        cursor.execute(
            "INSERT INTO bailing_knowledge_document (knowledge_base_id, source_key, title, body, "
            "metadata, status, revision, content_hash, last_error, created_at, updated_at) "
            "VALUES (%s, 'shipping.md', 'Shipping', %s, '{}', 'ready', 1, 'x', '', now(), now()) "
            "RETURNING id",
            [kb_id, body],
        )
        (document_id,) = cursor.fetchone()
        cursor.execute(
            "INSERT INTO bailing_knowledge_chunk (document_id, knowledge_base_id, revision, "
            'ordinal, "start", "end", "text", text_hash, search_vector) '
            "VALUES (%s, %s, 1, 0, 0, %s, %s, '', to_tsvector('simple', %s))",
            [document_id, kb_id, len(body), body, body],
        )
        # Check the deferred foreign keys now: a migration cannot alter a table with
        # checks pending (this test runs inside one transaction).
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")


def test_migrating_reanalyses_chunks_of_the_earlier_format():
    call_command("migrate", "bailing_knowledge", BEFORE_BM25, verbosity=0)
    try:
        _insert_old_rows()
    finally:
        call_command("migrate", "bailing_knowledge", verbosity=0)
    chunk = Chunk.objects.get(document__source_key="shipping.md")
    assert chunk.lexical_length > 0
    totals = LexiconTerm.objects.get(knowledge_base=chunk.knowledge_base, term="")
    assert (totals.chunks, totals.length) == (1, chunk.lexical_length)
    # Stemmed in the KB's language: "shipping" finds "shipped".
    found = lexical_ranking("shipping parcel", [chunk.knowledge_base], Visibility(), 3)
    assert [chunk_id for chunk_id, _ in found] == [chunk.pk]


def _gin_options() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(reloptions, '{}') FROM pg_class WHERE relname = %s",
            ["bk_chunk_search_vector_gin"],
        )
        return cursor.fetchone()[0]


def test_the_lexical_index_keeps_a_small_pending_list_and_migrates_back():
    assert _gin_options() == ["gin_pending_list_limit=128"]
    call_command("migrate", "bailing_knowledge", "0006_access_functions", verbosity=0)
    try:
        assert _gin_options() == []
    finally:
        call_command("migrate", "bailing_knowledge", verbosity=0)
    assert _gin_options() == ["gin_pending_list_limit=128"]


def _document_columns() -> set[str]:
    with connection.cursor() as cursor:
        description = connection.introspection.get_table_description(
            cursor, "bailing_knowledge_document"
        )
    return {column.name for column in description}


def test_the_reindex_mark_migrates_back_and_forth(kb):
    """A nullable column: gone when migrated back, and back empty, the rows untouched."""
    upsert_document(kb, "a.md", "A", "Some text to index.")
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # see _insert_old_rows
    assert "reindex_queued_at" in _document_columns()
    call_command("migrate", "bailing_knowledge", "0008_chunk_embedding_hnsw_256", verbosity=0)
    try:
        assert "reindex_queued_at" not in _document_columns()
    finally:
        call_command("migrate", "bailing_knowledge", verbosity=0)
    assert "reindex_queued_at" in _document_columns()
    document = Document.objects.get()
    assert (document.status, document.reindex_queued_at) == ("ready", None)


def _document_check_objects() -> tuple[bool, bool]:
    """Whether the open-document index (0010) and the admitted-documents function (0011) exist."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT to_regclass('bk_document_open') IS NOT NULL,"
            " to_regprocedure('bailing_knowledge_admitted_documents(bigint[], text, text[])')"
            " IS NOT NULL"
        )
        return cursor.fetchone()


def test_the_document_checks_migrate_back_and_forth():
    assert _document_check_objects() == (True, True)
    call_command("migrate", "bailing_knowledge", "0010_document_open_index", verbosity=0)
    try:
        assert _document_check_objects() == (True, False)
        call_command("migrate", "bailing_knowledge", "0009_document_reindex_queued_at", verbosity=0)
        assert _document_check_objects() == (False, False)
    finally:
        call_command("migrate", "bailing_knowledge", verbosity=0)
    assert _document_check_objects() == (True, True)


def _search_functions() -> tuple[bool, bool]:
    """Whether the fetch and the term statistics functions (0013) exist."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT to_regprocedure('bailing_knowledge_fetch_hits(bigint[], bigint[])')"
            " IS NOT NULL,"
            " to_regprocedure('bailing_knowledge_term_statistics(bigint[], text[])') IS NOT NULL"
        )
        return cursor.fetchone()


def test_the_search_functions_migrate_back_and_forth(kb):
    upsert_document(kb, "returns.md", "Returns", "Parcels may be returned within thirty days.")
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # see _insert_old_rows
    assert _search_functions() == (True, True)
    call_command("migrate", "bailing_knowledge", "0012_document_queued_hash", verbosity=0)
    try:
        assert _search_functions() == (False, False)
    finally:
        call_command("migrate", "bailing_knowledge", verbosity=0)
    assert _search_functions() == (True, True)
    hits = HybridSearch("returned parcels", [kb], Visibility()).run(max_hits=3).hits
    assert [hit.title for hit in hits] == ["Returns"]
