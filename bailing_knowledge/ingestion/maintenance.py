"""Work on documents already stored: re-index, switch a KB's embedder or language, delete.

Each keeps the guarantee of the pipeline: a document serves its old chunks until the new
ones are written, in one transaction.
"""

from __future__ import annotations

from django.db import transaction

from .. import signals
from ..conf import check_embedder_alias
from ..lookups import get_knowledge_base
from ..models import Chunk, Document, KnowledgeBase
from ..retrieval.analysis import check_language
from ..signals import send_on_commit
from .lexicon import rebuild_lexical_index
from .outcomes import DocumentOutcome, UpsertResult
from .pipeline import index_document
from .preparation import prepare_documents
from .storage import chunk_rows, write_chunks
from .tasks import runs_inline, task
from .validation import CleanDocument


def reindex_document_task(document_id: int) -> UpsertResult:
    """Re-cut and re-embed a document's current content (e.g. after an embedder change).

    The revision stays: the text is the same, so references to it remain valid.
    """
    document = Document.objects.select_related("knowledge_base").filter(pk=document_id).first()
    if document is None:
        return UpsertResult(DocumentOutcome.FAILED, None, 0, "The document no longer exists.")
    if document.status != Document.Status.READY and not document.chunks.exists():
        return index_document(
            document.knowledge_base_id,
            document.source_key,
            document.title,
            document.body,
            document.metadata,
        )
    todo = CleanDocument(
        document.source_key,
        document.title,
        document.body,
        document.metadata,
        document.content_hash,
    )
    kb = document.knowledge_base
    (prepared,) = prepare_documents(kb.embedder, kb.language, [todo])
    if isinstance(prepared, str):
        Document.objects.filter(pk=document.pk).update(last_error=prepared)
        return UpsertResult(DocumentOutcome.FAILED, document, 0, prepared, document.source_key)
    with transaction.atomic():
        document = Document.objects.select_for_update().get(pk=document.pk)
        if document.content_hash != todo.digest:
            # A newer upsert already indexed other content.
            return UpsertResult(
                DocumentOutcome.UNCHANGED, document, 0, source_key=document.source_key
            )
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
    """Re-index now (immediate backend) or queue it; a document never served turns `pending`."""
    if runs_inline(reindex_task):
        return reindex_document_task(document.pk)
    with transaction.atomic():
        Document.objects.filter(pk=document.pk, status=Document.Status.FAILED).update(
            status=Document.Status.PENDING
        )
        reindex_task.enqueue(document_id=document.pk)
    return UpsertResult(DocumentOutcome.QUEUED, document, source_key=document.source_key)


def reindex_knowledge_base(kb: KnowledgeBase | str) -> list[UpsertResult]:
    kb = get_knowledge_base(kb)
    return [
        reindex_document(document)
        for document in Document.objects.filter(knowledge_base=kb).order_by("pk")
    ]


def set_knowledge_base_embedder(kb: KnowledgeBase | str, alias: str) -> KnowledgeBase:
    """Switch a KB to another embedder and re-embed its documents with it."""
    kb = get_knowledge_base(kb)
    check_embedder_alias(alias)
    if kb.embedder == alias:
        return kb
    KnowledgeBase.objects.filter(pk=kb.pk).update(embedder=alias)
    kb.embedder = alias
    reindex_knowledge_base(kb)
    send_on_commit(
        signals.knowledge_base_changed, KnowledgeBase, knowledge_base=kb, change="embedder"
    )
    return kb


def set_knowledge_base_language(kb: KnowledgeBase | str, language: str) -> KnowledgeBase:
    """Switch a KB to another text language and re-index its chunks' terms with it.

    The chunks keep their text and vectors; only their lexemes and the KB's term
    statistics are computed again, in one transaction.
    """
    kb = get_knowledge_base(kb)
    check_language(language)
    if kb.language == language:
        return kb
    with transaction.atomic():
        KnowledgeBase.objects.filter(pk=kb.pk).update(language=language)
        kb.language = language
        rebuild_lexical_index(kb)
        send_on_commit(
            signals.knowledge_base_changed, KnowledgeBase, knowledge_base=kb, change="language"
        )
    return kb


@transaction.atomic
def delete_document(kb: KnowledgeBase | str, source_key: str) -> bool:
    """Delete a document and its chunks; False when there was none."""
    kb = get_knowledge_base(kb)
    documents = Document.objects.filter(knowledge_base=kb, source_key=source_key)
    # The document row first, as writers lock it: then its chunks, without a deadlock.
    if not documents.select_for_update().exists():
        return False
    deleted, _ = documents.delete()
    if deleted:
        send_on_commit(signals.document_deleted, Document, knowledge_base=kb, source_key=source_key)
    return bool(deleted)
