"""The ingestion pipeline: `upsert_document` and `upsert_documents`, in batches.

Content is chunked and embedded (preparation) *before* the database is touched; storage
then swaps the new revision in. `upsert_documents` overlaps the two: while one batch is
written on the caller's connection, the next is prepared in a background thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from ..locks import share_write_lock
from ..lookups import get_knowledge_base
from ..models import Document, KnowledgeBase
from .outcomes import DocumentOutcome, UpsertResult
from .preparation import PreparedDocument, prepare_documents
from .storage import (
    asked,
    is_current,
    lock_for_writing,
    overtaken,
    record_failure,
    restrict_serving,
    swap_in,
)
from .tasks import runs_inline, task
from .validation import CleanDocument, DocumentInput, clean_document, validation_message

# `upsert_documents` batches: documents per transaction, and body characters per batch
# (bounds the memory of the two batches in flight: about 2,500 chunks each).
BATCH_DOCUMENTS = 64
BATCH_CHARACTERS = 2_000_000


def _keep_unchanged(kb: KnowledgeBase, document: Document, todo: CleanDocument) -> UpsertResult:
    """An unchanged document still takes the new metadata (it needs no new revision), and
    an edit still queued for it gives way: the content it serves was asked for since.

    Checked again under the row's lock: other content swapped in since it was read makes this
    content an edit like any other."""
    if document.metadata == todo.metadata and document.queued_hash in ("", todo.digest):
        return UpsertResult(DocumentOutcome.UNCHANGED, document, 0, source_key=todo.source_key)
    with transaction.atomic():
        share_write_lock([kb.pk])  # before the row: see `locks`
        locked = (
            Document.objects.select_for_update()
            .filter(pk=document.pk, content_hash=todo.digest, status=Document.Status.READY)
            .only("queued_hash")
            .first()
        )
        if locked is not None:
            queued_hash = asked(locked, todo.digest)
            Document.objects.filter(pk=document.pk).update(
                metadata=todo.metadata, queued_hash=queued_hash
            )
    if locked is None:
        return _enqueue(kb, todo)
    document.metadata, document.queued_hash = todo.metadata, queued_hash
    return UpsertResult(DocumentOutcome.UNCHANGED, document, 0, source_key=todo.source_key)


def _current_documents(kb: KnowledgeBase, keys: Sequence[str]) -> dict[str, Document]:
    # Bodies are not needed to compare hashes (and may be megabytes each).
    found = Document.objects.filter(knowledge_base=kb, source_key__in=keys).defer("body")
    return {document.source_key: document for document in found}


def upsert_document(
    kb: KnowledgeBase | str,
    source_key: str,
    title: str,
    body: str,
    metadata: dict[str, Any] | None = None,
) -> UpsertResult:
    """Create or update the document `source_key` of `kb`; idempotent.

    Same title and body → `unchanged` (metadata is still updated); anything else → a new
    revision, indexed through Django's task framework (the immediate backend, the default,
    indexes it now → `created`/`updated`; a queueing backend → `queued`, the document
    `pending` until a worker indexes it). Bad input raises `ValidationError`.
    """
    kb = get_knowledge_base(kb)
    todo = clean_document(source_key, title, body, metadata)
    existing = _current_documents(kb, [source_key]).get(source_key)
    if existing is not None and is_current(existing, todo.digest):
        return _keep_unchanged(kb, existing, todo)
    return _enqueue(kb, todo)


def _enqueue(kb: KnowledgeBase, todo: CleanDocument) -> UpsertResult:
    """Index now (immediate backend) or queue: the document is then a `pending` row."""
    if runs_inline(index_task):
        return index_document(kb.pk, todo.source_key, todo.title, todo.body, todo.metadata)
    with transaction.atomic():
        document = _mark_pending(kb, todo)
        index_task.enqueue(
            knowledge_base_id=kb.pk,
            source_key=todo.source_key,
            title=todo.title,
            body=todo.body,
            metadata=todo.metadata,
        )
    return UpsertResult(DocumentOutcome.QUEUED, document, source_key=todo.source_key)


def _mark_pending(kb: KnowledgeBase, todo: CleanDocument) -> Document:
    """The row that shows queued work: a new document is created `pending` with its content.

    A `ready` document keeps serving its current revision (its body is what its chunks were
    cut from) until the worker swaps the new one in, seen only by principals both versions
    admit (`restrict_serving`); the queued task carries the content, and `queued_hash` names
    it, so that the tasks of content asked for before give way (`overtaken`).
    """
    lock_for_writing(kb)  # before the document's row: the order of `locks`
    document, created = Document.objects.select_for_update().get_or_create(
        knowledge_base=kb,
        source_key=todo.source_key,
        defaults={
            "title": todo.title,
            "body": todo.body,
            "metadata": todo.metadata,
            "content_hash": todo.digest,
            "status": Document.Status.PENDING,
        },
    )
    if not created and document.status != Document.Status.READY:
        document.title, document.body, document.metadata = todo.title, todo.body, todo.metadata
        document.content_hash, document.status = todo.digest, Document.Status.PENDING
        document.last_error, document.queued_hash = "", ""
        document.save(
            update_fields=[
                "title", "body", "metadata", "content_hash", "status", "last_error",
                "queued_hash", "updated_at",
            ]
        )  # fmt: skip
    elif not created:
        restrict_serving(document, todo.metadata)
        Document.objects.filter(pk=document.pk).update(queued_hash=todo.digest)
        document.queued_hash = todo.digest
    return document


def index_document(
    knowledge_base_id: int,
    source_key: str,
    title: str,
    body: str,
    metadata: dict[str, Any],
    *,
    document_id: int | None = None,
    queued: bool = False,
) -> UpsertResult:
    """Index new content for a document and swap it in atomically.

    `document_id`: a re-index of that row, a document that never served: deleted meanwhile,
    it stays deleted (`failed`, `GONE`); given other content meanwhile, it is `unchanged`.
    `queued`: a worker's task for an edit; overtaken by content asked for since, it is
    `unchanged` (`overtaken`)."""
    kb = KnowledgeBase.objects.get(pk=knowledge_base_id)
    todo = clean_document(source_key, title, body, metadata)
    (prepared,) = prepare_documents(kb.embedder, kb.language, [todo])
    if isinstance(prepared, str):
        return record_failure(kb, todo, prepared, document_id=document_id, queued=queued)
    (result,) = swap_in(kb, [prepared], document_id=document_id, queued=queued)
    return result


@task
def index_task(
    knowledge_base_id: int, source_key: str, title: str, body: str, metadata: dict[str, Any]
) -> str:
    """What a worker runs for a queued document: `pending` → `indexing` → `ready`/`failed`.

    Returns the outcome's word (a task's result must be JSON).
    """
    rows = Document.objects.filter(knowledge_base_id=knowledge_base_id, source_key=source_key)
    digest = clean_document(source_key, title, body, metadata).digest
    waiting = rows.exclude(status=Document.Status.READY)
    serving = rows.filter(status=Document.Status.READY).only("status", "queued_hash").first()
    if waiting.exclude(content_hash=digest).exists() or (
        serving is not None and overtaken(serving, digest)
    ):
        # Newer content was asked for since: its own task (or none, for the content the
        # document serves) indexes it. The swap checks again, under the row's lock.
        return str(DocumentOutcome.UNCHANGED)
    waiting.update(status=Document.Status.INDEXING)
    try:
        result = index_document(knowledge_base_id, source_key, title, body, metadata, queued=True)
    except Exception as exc:
        waiting.filter(status=Document.Status.INDEXING).update(
            status=Document.Status.FAILED, last_error=f"Indexing stopped: {exc}"
        )
        raise
    return str(result.outcome)


# --------------------------------------------------------------------------------------------
# Many documents


def upsert_documents(
    kb: KnowledgeBase | str,
    documents: Iterable[DocumentInput],
    *,
    batch_size: int = BATCH_DOCUMENTS,
) -> Iterator[UpsertResult]:
    """Upsert many documents; yields one result per input, in input order.

    Each document gets what `upsert_document` would give it, except that bad input yields a
    `failed` result (with the reason in `error`) instead of raising. It is much faster than
    a loop of `upsert_document`: the unchanged check is one query per batch, a batch's new
    revisions are swapped in by one transaction, and while one batch is written the next is
    chunked and embedded in a background thread, so Python and PostgreSQL work at the same
    time. The thread never touches the database: everything stays on the caller's
    connection, inside the caller's transaction if there is one.

    With a queueing task backend, each changed document becomes one task, as with
    `upsert_document`.
    """
    kb = get_knowledge_base(kb)
    batches = _batches(documents, max(1, batch_size))
    if not runs_inline(index_task):
        for batch in batches:
            for slot in _triage(kb, batch):
                yield _settled(kb, slot) if slot.todo is None else _enqueue(kb, slot.todo)
        return
    pool = ThreadPoolExecutor(1, thread_name_prefix="bailing-knowledge-prepare")
    try:
        # The batch being prepared: its keys, its slots and its rows to come.
        pending: tuple[set[str], list[_Slot], Future[list[PreparedDocument | str]]] | None
        pending = None
        for batch in batches:
            keys = {document.source_key for document in batch}
            if pending is not None and keys & pending[0]:
                # A key of the batch not yet written: triage must see its new version.
                yield from _finish(kb, *pending[1:])
                pending = None
            slots = _triage(kb, batch)
            todos = [slot.todo for slot in slots if slot.todo is not None]
            future = pool.submit(prepare_documents, kb.embedder, kb.language, todos)
            if pending is not None:
                yield from _finish(kb, *pending[1:])
            pending = (keys, slots, future)
        if pending is not None:
            yield from _finish(kb, *pending[1:])
    finally:
        # Stopped early: drop the queued batch, wait for the one being prepared.
        pool.shutdown(wait=True, cancel_futures=True)


@dataclass
class _Slot:
    """One input of a batch: the work to do, or why there is none (a failure, or the
    document that already serves this content)."""

    todo: CleanDocument | None = None
    result: UpsertResult | None = None
    unchanged: tuple[Document, CleanDocument] | None = None


def _settled(kb: KnowledgeBase, slot: _Slot) -> UpsertResult:
    """The result of a slot with no indexing to do; applies an unchanged document's new
    metadata now, so that nothing of a batch is written before its results are due."""
    if slot.unchanged is not None:
        slot.result = _keep_unchanged(kb, *slot.unchanged)
        slot.unchanged = None
    assert slot.result is not None
    return slot.result


def _batches(documents: Iterable[DocumentInput], size: int) -> Iterator[list[DocumentInput]]:
    """Consecutive batches; a source key repeated within a batch starts a new one (its
    second version must see the first one written).

    The first batches are small (4, 8, 16, ... documents up to `size`): the database has
    nothing to do until the first batch is embedded, so that one should be quick.
    """
    batch: list[DocumentInput] = []
    keys: set[str] = set()
    characters = 0
    limit = min(size, 4)
    for document in documents:
        length = len(document.body) if isinstance(document.body, str) else 0
        if batch and (
            len(batch) >= limit
            or document.source_key in keys
            or characters + length > BATCH_CHARACTERS * limit // size
        ):
            yield batch
            batch, keys, characters = [], set(), 0
            limit = min(size, limit * 2)
        batch.append(document)
        keys.add(document.source_key)
        characters += length
    if batch:
        yield batch


def _triage(kb: KnowledgeBase, batch: Sequence[DocumentInput]) -> list[_Slot]:
    """Validate a batch and settle its unchanged documents with one query."""
    slots: list[_Slot] = []
    for document in batch:
        try:
            todo = clean_document(
                document.source_key, document.title, document.body, document.metadata
            )
        except ValidationError as exc:
            failed = UpsertResult(
                DocumentOutcome.FAILED,
                error=validation_message(exc),
                source_key=document.source_key,
            )
            slots.append(_Slot(result=failed))
            continue
        slots.append(_Slot(todo=todo))
    existing = _current_documents(kb, [slot.todo.source_key for slot in slots if slot.todo])
    for slot in slots:
        current = existing.get(slot.todo.source_key) if slot.todo else None
        if current is not None and is_current(current, slot.todo.digest):
            slot.unchanged, slot.todo = (current, slot.todo), None
    return slots


def _finish(
    kb: KnowledgeBase, slots: list[_Slot], future: Future[list[PreparedDocument | str]]
) -> Iterator[UpsertResult]:
    """Write a prepared batch; record the documents whose embedding failed."""
    prepared = iter(future.result())
    ready: list[PreparedDocument] = []
    for slot in slots:
        if slot.todo is not None:
            outcome = next(prepared)
            if isinstance(outcome, str):
                slot.result, slot.todo = record_failure(kb, slot.todo, outcome), None
            else:
                ready.append(outcome)
    written = iter(swap_in(kb, ready) if ready else [])
    for slot in slots:
        yield _settled(kb, slot) if slot.todo is None else next(written)
