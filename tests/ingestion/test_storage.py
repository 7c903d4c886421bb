"""The COPY writer's staging table, and writes that meet a switch of embedder or language,
on the real database."""

from __future__ import annotations

import pytest
from django.db import connection

from bailing_knowledge.ingestion import maintenance, pipeline, storage
from bailing_knowledge.ingestion.documents import reindex_document, upsert_document
from bailing_knowledge.ingestion.outcomes import GONE
from bailing_knowledge.ingestion.preparation import prepare_documents
from bailing_knowledge.ingestion.storage import STAGE_TYPES
from bailing_knowledge.ingestion.validation import clean_document
from bailing_knowledge.models import Chunk, Document, KnowledgeBase
from bailing_knowledge.retrieval.embedders import HashingEmbedder
from bailing_knowledge.retrieval.hybrid import HybridSearch
from bailing_knowledge.retrieval.lexical import lexical_ranking
from bailing_knowledge.retrieval.visibility import Visibility

pytestmark = pytest.mark.django_db


def test_the_staging_types_are_the_staging_tables(kb):
    upsert_document(kb, "a.md", "Title", "# Title\n\nSome text to index.")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT format_type(atttypid, NULL) FROM pg_attribute "
            "WHERE attrelid = 'bailing_knowledge_chunk_stage'::regclass AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum"
        )
        actual = [row[0] for row in cursor.fetchall()]
    # Binary-compatible: varchar takes text's binary form; a vector is sent as raw bytes in
    # pgvector's binary form.
    compatible = {("text", "character varying"), ("bytea", "vector")}
    sent = list(STAGE_TYPES)
    assert len(actual) == len(sent)
    assert all(a == s or (s, a) in compatible for s, a in zip(sent, actual, strict=True)), actual


HASHING = "bailing_knowledge.retrieval.embedders.HashingEmbedder"
POISON = "tests.ingestion.test_documents.PoisonEmbedder"


def _switch_after_preparing(monkeypatch, module, kb, **change) -> None:
    """Make `module`'s first preparation be followed by a switch of `kb`, committed before
    the write: what a switch by another process at that moment looks like to a writer."""
    prepare = module.prepare_documents

    def prepared_then_switched(*args, **kwargs):
        result = prepare(*args, **kwargs)
        if not switched:
            switched.append(True)
            KnowledgeBase.objects.filter(pk=kb.pk).update(**change)
        return result

    switched: list[bool] = []
    monkeypatch.setattr(module, "prepare_documents", prepared_then_switched)


@pytest.fixture
def two_embedders(settings):
    settings.BAILING_KNOWLEDGE = {
        "EMBEDDERS": {
            "default": {"BACKEND": HASHING},
            "small": {"BACKEND": HASHING, "OPTIONS": {"DIMENSIONS": 64}},
            "poisoned": {"BACKEND": POISON, "OPTIONS": {"DIMENSIONS": 32}},
        }
    }


def _dimensions(source_key: str) -> set[int]:
    return set(
        Chunk.objects.filter(document__source_key=source_key).values_list(
            "embedding_dimensions", flat=True
        )
    )


def test_a_document_embedded_before_a_switch_of_embedder_is_embedded_again(
    kb, monkeypatch, two_embedders
):
    _switch_after_preparing(monkeypatch, pipeline, kb, embedder="small")
    result = upsert_document(kb, "a.md", "Refunds", "Refunds are paid within five days.")
    assert result.outcome == "created"
    assert _dimensions("a.md") == {64}
    kb = KnowledgeBase.objects.get(pk=kb.pk)
    assert kb.embedder == "small"


def test_a_document_that_fails_its_second_embedding_is_recorded_failed(
    kb, monkeypatch, two_embedders
):
    upsert_document(kb, "a.md", "Refunds", "POISON refunds.")
    _switch_after_preparing(monkeypatch, pipeline, kb, embedder="poisoned")
    result = upsert_document(kb, "a.md", "Refunds", "POISON refunds, now in ten days.")
    assert (result.outcome, result.error) == ("failed", "Embedding failed: poisoned")
    document = Document.objects.get(source_key="a.md")
    assert (document.status, document.revision) == ("ready", 1)  # still serving
    assert _dimensions("a.md") == {HashingEmbedder().dimensions}


def test_a_reindex_embedded_before_a_switch_of_embedder_is_embedded_again(
    kb, monkeypatch, two_embedders
):
    upsert_document(kb, "a.md", "Refunds", "Refunds are paid within five days.")
    _switch_after_preparing(monkeypatch, maintenance, kb, embedder="small")
    result = reindex_document(Document.objects.get(source_key="a.md"))
    assert result.outcome == "updated"
    assert _dimensions("a.md") == {64}


@pytest.mark.parametrize("module", [pipeline, maintenance], ids=["upsert", "reindex"])
def test_a_document_analysed_before_a_switch_of_language_is_analysed_again(kb, monkeypatch, module):
    if module is maintenance:
        upsert_document(kb, "a.md", "Exercise", "She runs every morning.")
    _switch_after_preparing(monkeypatch, module, kb, language="simple")
    if module is maintenance:
        reindex_document(Document.objects.get(source_key="a.md"))
    else:
        upsert_document(kb, "a.md", "Exercise", "She runs every morning.")
    kb = KnowledgeBase.objects.get(pk=kb.pk)
    # Indexed as `simple` indexes: `runs` as written, no stemming.
    assert lexical_ranking("runs", [kb], Visibility(), 5)
    assert lexical_ranking("running", [kb], Visibility(), 5) == []


def test_a_batch_is_embedded_again_once_even_when_one_document_fails(
    kb, monkeypatch, two_embedders
):
    todos = [
        clean_document("a.md", "A", "POISON refunds.", {}),
        clean_document("b.md", "B", "Parcels ship in two days.", {}),
    ]
    batch = prepare_documents(kb.embedder, kb.language, todos)
    KnowledgeBase.objects.filter(pk=kb.pk).update(embedder="poisoned")
    again = storage.prepare_documents
    calls: list[list[str]] = []

    def counted(alias, language, documents):
        calls.append([document.source_key for document in documents])
        return again(alias, language, documents)

    monkeypatch.setattr(storage, "prepare_documents", counted)
    results = storage.swap_in(kb, batch)
    assert [(r.source_key, r.outcome) for r in results] == [("a.md", "failed"), ("b.md", "created")]
    assert calls == [["a.md", "b.md"]]
    assert _dimensions("b.md") == {32}
    assert kb.embedder == "poisoned"


@pytest.mark.parametrize("meanwhile", ["deleted", "created-again", "new-content"])
def test_a_reindex_of_a_never_served_document_respects_what_happened_meanwhile(
    kb, monkeypatch, meanwhile
):
    """A document that never served is re-indexed as a first indexing. Deleted while it was
    embedded, it stays deleted; deleted and created again with other content, or given other
    content, the new content stays (the re-index writes nothing over it)."""
    upsert_document(kb, "a.md", "Refunds", "Refunds are paid within five days.")
    Document.objects.filter(source_key="a.md").update(status="failed")
    Chunk.objects.all().delete()
    document = Document.objects.get(source_key="a.md")
    prepare = pipeline.prepare_documents

    def prepared_then_changed(*args, **kwargs):
        result = prepare(*args, **kwargs)
        monkeypatch.setattr(pipeline, "prepare_documents", prepare)
        if meanwhile == "new-content":
            Document.objects.filter(pk=document.pk).update(content_hash="0" * 64, body="New.")
        else:
            Document.objects.filter(pk=document.pk).delete()
        if meanwhile == "created-again":
            upsert_document(kb, "a.md", "Refunds", "Refunds are now paid within ten days.")
        return result

    monkeypatch.setattr(pipeline, "prepare_documents", prepared_then_changed)
    result = reindex_document(document)
    if meanwhile == "new-content":
        assert result.outcome == "unchanged"
        assert Document.objects.get(pk=document.pk).body == "New."
        return
    assert (result.outcome, result.error) == ("failed", GONE)
    if meanwhile == "deleted":
        assert not Document.objects.exists()
    else:
        (again,) = Document.objects.all()
        assert again.pk != document.pk and again.body == "Refunds are now paid within ten days."
        assert again.status == "ready"


def test_a_reindex_of_a_document_gone_before_it_started_names_it(kb):
    upsert_document(kb, "a.md", "Refunds", "Refunds are paid within five days.")
    document = Document.objects.get(source_key="a.md")
    Document.objects.filter(pk=document.pk).delete()
    result = reindex_document(document)
    assert (result.outcome, result.error, result.source_key) == ("failed", GONE, "a.md")


POISON = "tests.ingestion.test_documents.PoisonEmbedder"
SALARIES = "The salary bands for every grade."


def _seen_by(kb, audience: str, roles: tuple[str, ...] = ()) -> list[str]:
    search = HybridSearch("salary bands", [kb], Visibility(audience=audience, roles=roles))
    return [hit.title for hit in search.run(max_hits=3).hits]


def test_a_failed_edit_that_restricts_a_document_restricts_its_serving_revision(kb, settings):
    upsert_document(kb, "salaries.md", "Salaries", SALARIES, {"source_path": "old.md"})
    settings.BAILING_KNOWLEDGE = {"EMBEDDERS": {"default": {"BACKEND": POISON}}}
    result = upsert_document(
        kb, "salaries.md", "Salaries", SALARIES + " POISON",
        {"audiences": ["staff"], "source_path": "new.md"},
    )  # fmt: skip
    assert result.outcome == "failed"
    assert _seen_by(kb, "customer") == []
    assert _seen_by(kb, "staff") == ["Salaries"]
    # What describes the new text waits for it; the old text still serves.
    document = Document.objects.get()
    assert document.metadata == {"audiences": ["staff"], "source_path": "old.md"}
    assert (document.status, document.body) == ("ready", SALARIES)


def test_a_failed_edit_that_lifts_a_restriction_does_not_open_the_old_text(kb, settings):
    upsert_document(kb, "salaries.md", "Salaries", SALARIES, {"audiences": ["staff", "hr"]})
    settings.BAILING_KNOWLEDGE = {"EMBEDDERS": {"default": {"BACKEND": POISON}}}
    upsert_document(kb, "salaries.md", "Salaries", "POISON", {"audiences": ["hr", "customer"]})
    assert Document.objects.get().metadata == {"audiences": ["hr"]}
    assert [_seen_by(kb, a) for a in ("customer", "staff", "hr")] == [[], [], ["Salaries"]]
    # The edit indexed at last: its own visibility, in full.
    settings.BAILING_KNOWLEDGE = {}
    assert upsert_document(kb, "salaries.md", "Salaries", "New salary bands.",
                           {"audiences": ["hr", "customer"]}).outcome == "updated"  # fmt: skip
    assert _seen_by(kb, "customer") == ["Salaries"]


def test_a_queued_edit_restricts_the_serving_revision_until_it_is_swapped_in(kb, settings):
    from django_tasks_db.models import DBTaskResult

    upsert_document(kb, "salaries.md", "Salaries", SALARIES, {"roles": ["hr", "finance"]})
    settings.TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
    revised = (SALARIES + " Revised.", {"roles": ["finance", "legal"]})
    assert upsert_document(kb, "salaries.md", "Salaries", *revised).outcome == "queued"
    assert [_seen_by(kb, "", (r,)) for r in ("hr", "finance", "legal")] == [[], ["Salaries"], []]
    document = Document.objects.get()
    assert (document.status, document.body) == ("ready", SALARIES)
    (task,) = DBTaskResult.objects.all()
    assert pipeline.index_task.call(**task.args_kwargs["kwargs"]) == "updated"
    assert Document.objects.get().metadata == {"roles": ["finance", "legal"]}
    assert _seen_by(kb, "", ("legal",)) == ["Salaries"]


def test_content_asked_for_again_after_other_content_came_in_is_an_edit(kb):
    """Read as unchanged, swapped out before its metadata was applied: indexed again."""
    served = upsert_document(kb, "a.md", "A", "Old text.").document
    upsert_document(kb, "a.md", "A", "New text.")
    todo = clean_document("a.md", "A", "Old text.", {"audiences": ["staff"]})
    assert pipeline._keep_unchanged(kb, served, todo).outcome == "updated"
    document = Document.objects.get()
    assert (document.body, document.revision) == ("Old text.", 3)
    assert document.metadata == {"audiences": ["staff"]}
