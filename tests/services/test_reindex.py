"""Re-indexing a knowledge base, and switching its embedder: done now, or queued and marked."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from bailing_knowledge import services
from bailing_knowledge.ingestion.documents import reindex_task, upsert_document
from bailing_knowledge.models import Chunk, Document, KnowledgeBase
from bailing_knowledge.retrieval.embedders import HashingEmbedder
from bailing_knowledge.retrieval.lexical import lexical_ranking
from bailing_knowledge.retrieval.visibility import Visibility
from tests.settings_worker import TASKS as QUEUE

pytestmark = pytest.mark.django_db

HASHING = "bailing_knowledge.retrieval.embedders.HashingEmbedder"


class ExplodingEmbedder(HashingEmbedder):
    """Raises what no embedder should: a bug, not an `EmbedderError`."""

    def embed_documents(self, texts):
        raise RuntimeError("boom")


def _embedders(settings, small: str = HASHING) -> None:
    settings.BAILING_KNOWLEDGE = {
        "EMBEDDERS": {
            "default": {"BACKEND": HASHING},
            "small": {"BACKEND": small, "OPTIONS": {"DIMENSIONS": 64}},
        }
    }


def _dimensions(kb) -> set[int]:
    return set(
        Chunk.objects.filter(knowledge_base=kb).values_list("embedding_dimensions", flat=True)
    )


def _queued_kwargs() -> list[dict]:
    from django_tasks_db.models import DBTaskResult

    return [r.args_kwargs["kwargs"] for r in DBTaskResult.objects.order_by("enqueued_at")]


@pytest.fixture
def two_documents(kb):
    upsert_document(kb, "refunds.md", "Refunds", "Refunds are paid within five days.")
    upsert_document(kb, "shipping.md", "Shipping", "Parcels ship within two days.")
    return kb


def test_switching_the_embedder_re_embeds_at_once_with_the_immediate_backend(
    two_documents, settings
):
    kb = two_documents
    _embedders(settings)
    before = KnowledgeBase.objects.get(pk=kb.pk).updated_at
    report = services.set_knowledge_base_embedder(kb, "small")
    assert KnowledgeBase.objects.get(pk=kb.pk).updated_at > before
    assert (report.indexed, report.queued, report.unchanged, report.failed) == (2, 0, 0, [])
    assert [r.outcome for r in report.results] == ["updated", "updated"]
    assert _dimensions(kb) == {64}
    assert not Document.objects.filter(reindex_queued_at__isnull=False).exists()
    # The same alias again re-embeds nothing; an unknown one is refused.
    assert services.set_knowledge_base_embedder(kb, "small").results == ()
    with pytest.raises(ValidationError):
        services.set_knowledge_base_embedder(kb, "missing")
    kb.refresh_from_db()
    assert kb.embedder == "small"


def test_a_document_that_fails_is_reported_and_keeps_serving(kb, settings):
    from tests.ingestion.test_documents import PoisonEmbedder

    upsert_document(kb, "good.md", "Good", "Plain text.")
    upsert_document(kb, "bad.md", "Bad", "POISON text.")
    _embedders(settings, small=f"{PoisonEmbedder.__module__}.PoisonEmbedder")
    report = services.set_knowledge_base_embedder(kb, "small")
    assert (report.indexed, report.queued) == (1, 0)
    ((failed,),) = [report.failed]
    assert (failed.source_key, failed.error) == ("bad.md", "Embedding failed: poisoned")
    bad = Document.objects.get(source_key="bad.md")
    assert (bad.status, bad.last_error) == ("ready", "Embedding failed: poisoned")
    assert {c.embedding_dimensions for c in bad.chunks.all()} == {HashingEmbedder().dimensions}


def test_a_queued_switch_marks_the_documents_until_their_tasks_ran(two_documents, settings):
    kb = two_documents
    old = _dimensions(kb)
    _embedders(settings)
    settings.TASKS = QUEUE
    report = services.set_knowledge_base_embedder(kb, "small")
    assert (report.indexed, report.queued, report.failed) == (0, 2, [])
    waiting = Document.objects.filter(knowledge_base=kb)
    assert all(d.status == "ready" and d.reindex_queued_at for d in waiting)
    # Nothing changed for searches: the old chunks still serve, found by their words.
    assert _dimensions(kb) == old
    assert lexical_ranking("refunds", [kb], Visibility(), 5)

    first, second = _queued_kwargs()
    assert reindex_task.call(**first) == "updated"
    assert Document.objects.filter(reindex_queued_at__isnull=False).count() == 1
    assert reindex_task.call(**second) == "updated"
    assert not Document.objects.filter(reindex_queued_at__isnull=False).exists()
    assert _dimensions(kb) == {64}
    assert lexical_ranking("refunds", [kb], Visibility(), 5)


def test_a_task_that_fails_or_raises_clears_the_mark(kb, settings):
    from tests.ingestion.test_documents import PoisonEmbedder

    upsert_document(kb, "bad.md", "Bad", "POISON text.")
    upsert_document(kb, "good.md", "Good", "Plain text.")
    settings.TASKS = QUEUE
    assert services.reindex_knowledge_base(kb).queued == 2
    bad, good = _queued_kwargs()
    kb.embedder = "small"
    kb.save(update_fields=["embedder"])

    _embedders(settings, small=f"{PoisonEmbedder.__module__}.PoisonEmbedder")
    assert reindex_task.call(**bad) == "failed"
    document = Document.objects.get(source_key="bad.md")
    assert (document.status, document.reindex_queued_at) == ("ready", None)
    assert document.last_error == "Embedding failed: poisoned"

    _embedders(settings, small=f"{__name__}.ExplodingEmbedder")
    with pytest.raises(RuntimeError):
        reindex_task.call(**good)
    document = Document.objects.get(source_key="good.md")
    assert (document.status, document.reindex_queued_at) == ("ready", None)
    assert document.chunks.exists()


def test_reindex_documents_reports_each(two_documents):
    report = services.reindex_documents(Document.objects.order_by("source_key"))
    assert [(r.source_key, r.outcome) for r in report.results] == [
        ("refunds.md", "updated"),
        ("shipping.md", "updated"),
    ]
    assert report.indexed == 2
