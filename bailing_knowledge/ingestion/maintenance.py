"""Work on documents already stored: re-index one, delete one.

A re-index keeps the guarantee of the pipeline: a document serves its old chunks until the
new ones are written, in one transaction. The knowledge-base operations built on it
(re-index a KB, switch its embedder or language) are services: `services.reindex`.
"""

from __future__ import annotations

from dataclasses import replace

from django.db import transaction
from django.utils import timezone

from .. import signals
from ..locks import share_write_lock
from ..lookups import get_knowledge_base
from ..models import Chunk, Document, KnowledgeBase
from ..signals import send_on_commit
from .outcomes import GONE, DocumentOutcome, UpsertResult
from .pipeline import index_document
from .preparation import PreparedDocument, prepare_documents
from .storage import REEMBEDDINGS, chunk_rows, lock_for_writing, write_chunks
from .tasks import runs_inline, task
from .validation import CleanDocument


def reindex_document_task(document_id: int) -> UpsertResult:
    """Re-cut and re-embed a document's current content (e.g. after an embedder change).

    The revision stays: the text is the same, so references to it remain valid. Whatever
    the outcome (an exception included), the document's `reindex_queued_at` mark is cleared
    when the work ends, unless a newer re-index was queued meanwhile: that one keeps it.
    """
    document = Document.objects.select_related("knowledge_base").filter(pk=document_id).first()
    if document is None:
        return UpsertResult(DocumentOutcome.FAILED, None, 0, GONE)
    queued_at = document.reindex_queued_at
    try:
        return _reindex(document)
    finally:
        if queued_at is not None:
            Document.objects.filter(pk=document_id, reindex_queued_at=queued_at).update(
                reindex_queued_at=None
            )


def _reindex(document: Document) -> UpsertResult:
    if document.status != Document.Status.READY and not document.chunks.exists():
        return index_document(
            document.knowledge_base_id,
            document.source_key,
            document.title,
            document.body,
            document.metadata,
            document_id=document.pk,
        )
    todo = CleanDocument(
        document.source_key,
        document.title,
        document.body,
        document.metadata,
        document.content_hash,
    )
    kb = document.knowledge_base
    for attempt in range(REEMBEDDINGS + 1):
        (prepared,) = prepare_documents(kb.embedder, kb.language, [todo])
        if isinstance(prepared, str):
            Document.objects.filter(pk=document.pk).update(last_error=prepared)
            return UpsertResult(DocumentOutcome.FAILED, document, 0, prepared, document.source_key)
        with transaction.atomic():
            lock_for_writing(kb)
            if prepared.embedder == kb.embedder or attempt == REEMBEDDINGS:
                return _write_reindexed(document, todo, prepared.in_language(kb.language))
        # The KB switched embedders while this one embedded: embed again with the new one.
    raise AssertionError("unreachable")


def _write_reindexed(
    document: Document, todo: CleanDocument, prepared: PreparedDocument
) -> UpsertResult:
    """The second half of a re-index, in its transaction: the new chunks swapped in."""
    # Ordered by id: the model's ordering would join the KB's row and lock it too.
    current = Document.objects.select_for_update().filter(pk=document.pk).order_by("pk").first()
    if current is None:  # deleted while it was embedded
        return UpsertResult(DocumentOutcome.FAILED, None, 0, GONE, document.source_key)
    document = current
    if document.content_hash != todo.digest:
        # A newer upsert already indexed other content.
        return UpsertResult(DocumentOutcome.UNCHANGED, document, 0, source_key=document.source_key)
    Chunk.objects.filter(document=document).delete()
    write_chunks(chunk_rows(document, prepared))
    Document.objects.filter(pk=document.pk).update(status=Document.Status.READY, last_error="")
    return UpsertResult(
        DocumentOutcome.UPDATED, document, len(prepared.rows), source_key=document.source_key
    )


@task
def reindex_task(document_id: int) -> str:
    """What a worker runs for a queued re-index; the outcome's word (a task result is JSON)."""
    return str(reindex_document_task(document_id).outcome)


def reindex_document(document: Document) -> UpsertResult:
    """Re-index now (immediate backend) or queue it.

    A queued document is marked with `reindex_queued_at` until its task has run; one never
    served also turns `pending`. A `ready` one stays `ready` and keeps serving its chunks.
    """
    if runs_inline(reindex_task):
        result = reindex_document_task(document.pk)
        # Gone before it started, it has no row left to name it: the caller's copy does.
        return result if result.source_key else replace(result, source_key=document.source_key)
    with transaction.atomic():
        Document.objects.filter(pk=document.pk).update(reindex_queued_at=timezone.now())
        Document.objects.filter(pk=document.pk, status=Document.Status.FAILED).update(
            status=Document.Status.PENDING
        )
        reindex_task.enqueue(document_id=document.pk)
    return UpsertResult(DocumentOutcome.QUEUED, document, source_key=document.source_key)


@transaction.atomic
def delete_document(kb: KnowledgeBase | str, source_key: str) -> bool:
    """Delete a document and its chunks; False when there was none."""
    kb = get_knowledge_base(kb)
    documents = Document.objects.filter(knowledge_base=kb, source_key=source_key)
    # The locks in the order every writer takes them: the KB's write lock, the document
    # row, then its chunks.
    share_write_lock([kb.pk])
    if not documents.select_for_update().exists():
        return False
    deleted, _ = documents.delete()
    if deleted:
        send_on_commit(signals.document_deleted, Document, knowledge_base=kb, source_key=source_key)
    return bool(deleted)
