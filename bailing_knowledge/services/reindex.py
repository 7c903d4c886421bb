"""A knowledge base's index made again: re-index it, or switch its embedder or language.

Each document is re-indexed through ingestion's `reindex_document`: at once with the
immediate task backend, queued for a worker with any other. The `ReindexReport` says which
of the two happened, so that a caller (the admin, a command) can say what is done and what
is still waiting; a queued document carries `reindex_queued_at` until its task has run, and
keeps serving its old chunks meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from .. import signals
from ..conf import check_embedder_alias
from ..ingestion.documents import DocumentOutcome, UpsertResult, reindex_document
from ..ingestion.lexicon import rebuild_lexical_index
from ..ingestion.outcomes import INDEXED
from ..locks import take_write_lock
from ..lookups import get_knowledge_base
from ..models import Document, KnowledgeBase
from ..retrieval.analysis import check_language
from ..signals import send_on_commit


@dataclass(frozen=True)
class ReindexReport:
    """What a re-index of many documents came to, one `UpsertResult` per document."""

    results: tuple[UpsertResult, ...] = ()

    def _count(self, *outcomes: DocumentOutcome) -> int:
        return sum(result.outcome in outcomes for result in self.results)

    @property
    def indexed(self) -> int:
        """Documents whose new chunks are written: searchable in their new form now."""
        return self._count(*INDEXED)

    @property
    def queued(self) -> int:
        """Documents left to a worker; each still serves its old chunks until it runs."""
        return self._count(DocumentOutcome.QUEUED)

    @property
    def unchanged(self) -> int:
        """Documents a newer upsert indexed while the re-index was embedding."""
        return self._count(DocumentOutcome.UNCHANGED)

    @property
    def failed(self) -> list[UpsertResult]:
        """The documents that could not be re-indexed, each with its `error`."""
        return [result for result in self.results if result.outcome == DocumentOutcome.FAILED]


def reindex_documents(documents: Iterable[Document]) -> ReindexReport:
    """Re-index each document (now or queued, as the task backend decides)."""
    return ReindexReport(tuple(reindex_document(document) for document in documents))


def reindex_knowledge_base(kb: KnowledgeBase | str) -> ReindexReport:
    """Re-index every document of `kb`, e.g. after its embedder's model changed."""
    kb = get_knowledge_base(kb)
    # Each re-index reads its document again: the bodies are not needed here.
    return reindex_documents(
        Document.objects.filter(knowledge_base=kb).order_by("pk").defer("body")
    )


def set_knowledge_base_embedder(kb: KnowledgeBase | str, alias: str) -> ReindexReport:
    """Switch a KB to another embedder and re-embed its documents with it.

    The KB takes the new alias at once; each document serves its old vectors until its new
    ones are written (searches embed the query with the new alias, so until then a document
    of another vector size is found by its words only). Nothing is re-embedded when the
    alias does not change. An unknown alias raises `ValidationError`.
    """
    kb = get_knowledge_base(kb)
    check_embedder_alias(alias)
    if kb.embedder == alias:
        return ReindexReport()
    with transaction.atomic():
        # A queryset update skips auto_now: the admin's "last changed" must still move.
        kb.updated_at = timezone.now()
        KnowledgeBase.objects.filter(pk=kb.pk).update(embedder=alias, updated_at=kb.updated_at)
        # Alone: a writer that embedded with the old alias commits first, and so is among
        # the documents re-embedded below; a later one embeds with the new alias.
        take_write_lock(kb.pk)
    kb.embedder = alias
    report = reindex_knowledge_base(kb)
    send_on_commit(
        signals.knowledge_base_changed, KnowledgeBase, knowledge_base=kb, change="embedder"
    )
    return report


def set_knowledge_base_language(kb: KnowledgeBase | str, language: str) -> KnowledgeBase:
    """Switch a KB to another text language and re-index its chunks' terms with it.

    The chunks keep their text and vectors; only their lexemes and the KB's term
    statistics are computed again, in one transaction, in the caller's process: no model
    runs, so there is nothing to queue.
    """
    kb = get_knowledge_base(kb)
    check_language(language)
    if kb.language == language:
        return kb
    with transaction.atomic():
        kb.updated_at = timezone.now()
        KnowledgeBase.objects.filter(pk=kb.pk).update(language=language, updated_at=kb.updated_at)
        kb.language = language
        rebuild_lexical_index(kb)
        send_on_commit(
            signals.knowledge_base_changed, KnowledgeBase, knowledge_base=kb, change="language"
        )
    return kb
