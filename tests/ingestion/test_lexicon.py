"""BM25 statistics stay exact as chunks come and go; rebuilding the lexical index."""

from __future__ import annotations

import threading
import time

import pytest
from django.core.exceptions import ValidationError
from django.db import connection, transaction

from bailing_knowledge import services
from bailing_knowledge.ingestion import lexicon, storage
from bailing_knowledge.ingestion.documents import delete_document, reindex_document, upsert_document
from bailing_knowledge.ingestion.lexicon import rebuild_lexical_index
from bailing_knowledge.models import Document, KnowledgeBase, LexiconTerm
from bailing_knowledge.retrieval.lexical import lexical_ranking
from bailing_knowledge.retrieval.visibility import Visibility

pytestmark = pytest.mark.django_db


def counted_statistics(kb: KnowledgeBase) -> dict[str, tuple[int, int]]:
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


def stored_statistics(kb: KnowledgeBase) -> dict[str, tuple[int, int]]:
    return {
        row.term: (row.chunks, row.length if row.term == "" else 0)
        for row in LexiconTerm.objects.filter(knowledge_base=kb)
        if row.chunks
    }


def test_statistics_follow_every_write_and_delete(kb):
    upsert_document(kb, "a.md", "Refunds", "Refunds are paid within thirty days. " * 40)
    upsert_document(kb, "b.md", "Shipping", "Parcels ship in two days.")
    assert stored_statistics(kb) == counted_statistics(kb)
    upsert_document(kb, "a.md", "Refunds", "Refunds are paid within ten days.")  # new revision
    assert stored_statistics(kb) == counted_statistics(kb)
    reindex_document(Document.objects.get(source_key="b.md"))
    assert stored_statistics(kb) == counted_statistics(kb)
    delete_document(kb, "b.md")
    assert stored_statistics(kb) == counted_statistics(kb)
    Document.objects.filter(knowledge_base=kb).delete()  # as the admin's bulk delete does
    assert stored_statistics(kb) == {}


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
    before = KnowledgeBase.objects.get(pk=kb.pk).updated_at
    kb = services.set_knowledge_base_language(kb, "simple")
    stored = KnowledgeBase.objects.get(pk=kb.pk)
    assert stored.language == "simple"
    assert stored.updated_at > before and stored.updated_at == kb.updated_at
    assert lexical_ranking("running", [kb], Visibility(), 5) == []
    assert lexical_ranking("runs", [kb], Visibility(), 5)
    assert stored_statistics(kb) == counted_statistics(kb)


def test_an_unknown_language_is_refused_and_nothing_changes(kb):
    upsert_document(kb, "run.md", "Exercise", "She runs every morning.")
    with pytest.raises(ValidationError):
        services.set_knowledge_base_language(kb, "klingon")
    assert KnowledgeBase.objects.get(pk=kb.pk).language == "english"


def test_a_rebuild_restores_lost_statistics(kb):
    other = services.create_knowledge_base("other")
    upsert_document(kb, "a.md", "Refunds", "Refunds are paid within thirty days.")
    upsert_document(other, "b.md", "Shipping", "Parcels ship in two days.")
    before = stored_statistics(other)
    LexiconTerm.objects.filter(knowledge_base=kb).delete()
    assert rebuild_lexical_index(kb) == 1
    assert stored_statistics(kb) == counted_statistics(kb)
    assert stored_statistics(other) == before


def chunk_lexemes(kb: KnowledgeBase) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, lexical_length, search_vector::text, lexical_terms::text "
            "FROM bailing_knowledge_chunk WHERE knowledge_base_id = %s ORDER BY id",
            [kb.pk],
        )
        return cursor.fetchall()


def _wait_for_lock(granted: bool, mode: str = "ExclusiveLock") -> None:
    """Until an advisory lock is held in `mode` (`granted`), or any lock is waited for."""
    where = f"locktype = 'advisory' AND mode = '{mode}'" if granted else "true"
    with connection.cursor() as cursor:
        for _ in range(200):
            cursor.execute(
                f"SELECT count(*) FROM pg_locks WHERE granted = %s AND {where}", [granted]
            )
            if cursor.fetchone()[0]:
                return
            time.sleep(0.05)


def _in_thread(work, errors: list[Exception]) -> threading.Thread:
    def run() -> None:
        try:
            work()
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


WRITERS = {
    "re-ingestion": lambda kb: upsert_document(kb, "a.md", "Runs", "She runs and jumps. " * 80),
    "re-index": lambda kb: reindex_document(Document.objects.get(source_key="a.md")),
    "delete": lambda kb: delete_document(kb, "a.md"),
    "bulk-delete": lambda kb: Document.objects.filter(source_key="a.md").delete(),
    "kb-delete": lambda kb: kb.delete(),
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("writer", WRITERS)
def test_a_language_change_during_a_write_neither_deadlocks_nor_mixes_languages(
    monkeypatch, writer
):
    """The rebuild of a language change holds its lock while a writer that read the old
    language deletes or rewrites chunks of the KB: the writer waits before touching a row
    (the rebuild then rewrites every chunk without waiting for it), both succeed, and what
    the writer wrote is analysed in the new language."""
    kb = services.create_knowledge_base("handbook")
    upsert_document(kb, "a.md", "Runs", "She runs every morning. " * 80)
    upsert_document(kb, "b.md", "Walks", "He walks every evening. " * 80)
    kb = KnowledgeBase.objects.get(pk=kb.pk)  # the writer's copy: English
    analysed = lexicon.document_terms
    errors: list[Exception] = []

    def held(title: str, language: str) -> list[str]:
        # The rebuild holds its lock alone: go on once the writer waits for it.
        _wait_for_lock(granted=False)
        return analysed(title, language)

    monkeypatch.setattr(lexicon, "document_terms", held)

    thread = _in_thread(lambda: services.set_knowledge_base_language(kb.slug, "simple"), errors)
    _wait_for_lock(granted=True)
    try:
        WRITERS[writer](kb)
    finally:
        thread.join()
    assert not errors
    if writer == "kb-delete":
        assert not LexiconTerm.objects.exists()
        return
    kb.refresh_from_db()
    assert kb.language == "simple"
    written = chunk_lexemes(kb)
    monkeypatch.setattr(lexicon, "document_terms", analysed)
    rebuild_lexical_index(kb)
    assert chunk_lexemes(kb) == written  # already in the new language
    assert stored_statistics(kb) == counted_statistics(kb)


@pytest.mark.django_db(transaction=True)
def test_a_rebuild_on_its_own_and_a_deletion_of_its_knowledge_base_do_not_deadlock(monkeypatch):
    """`knowledge_base reindex-lexical` calls the rebuild with no language change before
    it: it takes the KB's row first all the same, so a deletion waits for it."""
    kb = services.create_knowledge_base("handbook")
    upsert_document(kb, "a.md", "Runs", "She runs every morning. " * 80)
    analysed = lexicon.document_terms

    def held(title: str, language: str) -> list[str]:
        _wait_for_lock(granted=False)  # until the deletion waits
        return analysed(title, language)

    monkeypatch.setattr(lexicon, "document_terms", held)
    errors: list[Exception] = []
    thread = _in_thread(lambda: rebuild_lexical_index(KnowledgeBase.objects.get(pk=kb.pk)), errors)
    _wait_for_lock(granted=True)
    try:
        KnowledgeBase.objects.get(pk=kb.pk).delete()
    finally:
        thread.join()
    assert not errors
    assert not KnowledgeBase.objects.exists() and not LexiconTerm.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_writer_and_a_new_slug_saved_with_a_language_change_do_not_deadlock(monkeypatch):
    """The admin saves a KB's new slug (a key update of its row) and then changes its
    language, in one transaction, while a writer of the KB holds its write lock: the writer
    took the KB's row first, so the admin waits for it instead of deadlocking with it."""
    kb = services.create_knowledge_base("handbook")
    upsert_document(kb, "a.md", "Runs", "She runs every morning. " * 80)
    shared = storage.share_write_lock

    def held(kb_ids, *args) -> None:
        shared(kb_ids, *args)
        _wait_for_lock(granted=False)  # until the admin waits

    monkeypatch.setattr(storage, "share_write_lock", held)
    errors: list[Exception] = []
    writer = KnowledgeBase.objects.get(pk=kb.pk)
    thread = _in_thread(
        lambda: upsert_document(writer, "a.md", "Runs", "She jumps and runs. " * 80), errors
    )
    _wait_for_lock(granted=True, mode="ShareLock")
    try:
        with transaction.atomic():  # the admin's change form
            kb.slug = "handbook-2"
            kb.save()
            services.set_knowledge_base_language(kb, "simple")
    finally:
        thread.join()
    assert not errors
    written = chunk_lexemes(kb)
    rebuild_lexical_index(kb)
    assert chunk_lexemes(kb) == written  # the writer's chunks are in the new language too


@pytest.mark.django_db(transaction=True)
def test_deleting_a_document_and_its_knowledge_base_at_once_do_not_deadlock():
    """`delete_document` holds the document's row while its knowledge base is deleted:
    it took the KB's row first, so the KB's deletion waits for it, instead of deleting the
    chunks the document's deletion then waits for."""
    kb = services.create_knowledge_base("handbook")
    upsert_document(kb, "a.md", "Runs", "She runs every morning. " * 80)

    def held(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if "FOR UPDATE" in sql and "bailing_knowledge_document" in sql:
            _wait_for_lock(granted=False)  # until the KB's deletion waits
        return result

    def delete_one() -> None:
        with connection.execute_wrapper(held):
            assert delete_document(kb.slug, "a.md")

    errors: list[Exception] = []
    thread = _in_thread(delete_one, errors)
    _wait_for_lock(granted=True, mode="ShareLock")
    try:
        KnowledgeBase.objects.get(pk=kb.pk).delete()
    finally:
        thread.join()
    assert not errors
    assert not KnowledgeBase.objects.exists()
