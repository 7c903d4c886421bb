"""Storage: prepared documents become rows, a new revision swapped in per transaction.

A batch's new revisions are written and the old chunks removed in one transaction together
with the document rows, so a search or read statement sees the old revision or the new one,
never a mix, and a document keeps serving its old revision until the new one is written.

Chunk rows go to PostgreSQL with binary COPY into a session-local staging table and move to
the chunk table in one `INSERT ... SELECT` that computes the `tsvector`: no per-row statement,
no float formatting, no text parsing of vectors (docs/performance.md has the figures).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from django.db import IntegrityError, connection, transaction

from .. import signals
from ..locks import share_write_lock
from ..models import Chunk, Document, KnowledgeBase
from ..retrieval.visibility import VISIBILITY_KEYS, narrowest
from ..signals import send_on_commit
from .outcomes import GONE, INDEXED, DocumentOutcome, UpsertResult
from .preparation import PreparedDocument, prepare_documents
from .validation import CleanDocument

# The staging table is created once per database session, with the chunk table's own column
# types (a rollback of the transaction that created it drops it: it is then made again).
# Its rows live for one statement: they are not worth compressing (toast_tuple_target).
_CREATE_STAGE = """
CREATE TEMPORARY TABLE IF NOT EXISTS bailing_knowledge_chunk_stage
WITH (toast_tuple_target = 8160) ON COMMIT DELETE ROWS AS
SELECT document_id, knowledge_base_id, revision, ordinal, "start", "end", "text", text_hash,
       embedding, embedding_dimensions, lexical_length, "text" AS levels, "text" AS terms
FROM bailing_knowledge_chunk WITH NO DATA
"""
_COPY_STAGE = "COPY bailing_knowledge_chunk_stage FROM STDIN (FORMAT BINARY)"
# Binary COPY carries no types: these are the staging table's columns (the chunk table's,
# migrations); a vector goes as raw bytes in pgvector's own binary format, the lexemes as the
# text of a tsvector (retrieval/lexical.py: `encode_terms`).
STAGE_TYPES = (
    "bigint", "bigint", "integer", "integer", "integer", "integer", "text", "text", "bytea",
    "smallint", "integer", "text", "text",
)  # fmt: skip
_MOVE_STAGE = """
INSERT INTO bailing_knowledge_chunk (
    document_id, knowledge_base_id, revision, ordinal, "start", "end", "text", text_hash,
    embedding, embedding_dimensions, lexical_length, search_vector, lexical_terms
)
SELECT document_id, knowledge_base_id, revision, ordinal, "start", "end", "text", text_hash,
       embedding, embedding_dimensions, lexical_length, levels::tsvector, terms::tsvector
FROM bailing_knowledge_chunk_stage
"""
# Several writes in one transaction (a caller's) must not see each other's rows, nor leave
# dead ones behind to be scanned again.
_EMPTY_STAGE = "TRUNCATE bailing_knowledge_chunk_stage"


# Under the knowledge base's write lock, the language and embedder a writer must write with.
_WRITING = f"SELECT language, embedder FROM {KnowledgeBase._meta.db_table} WHERE id = %s"  # noqa: S608
#: Times a batch is embedded again because its knowledge base switched embedders meanwhile,
#: before it is written as it is (a switch re-indexes every document after it anyway).
REEMBEDDINGS = 3


def lock_for_writing(kb: KnowledgeBase) -> None:
    """Take what a writer of `kb`'s documents and chunks holds until it commits, before any
    of their rows, in the order of `locks`: the KB's row (against its deletion), then its
    shared write lock. `kb` then takes the language and embedder it has, which cannot change
    until the writer commits: what is written must be analysed and embedded as they say.
    (Read after the lock: a switch that held it has committed by then.)"""
    share_write_lock([kb.pk])
    with connection.cursor() as cursor:
        cursor.execute(_WRITING, [kb.pk])
        row = cursor.fetchone()
    if row is not None:
        kb.language, kb.embedder = row


def is_current(document: Document, digest: str) -> bool:
    """The document already serves exactly this content: nothing to index."""
    return document.content_hash == digest and document.status == Document.Status.READY


def overtaken(document: Document, digest: str) -> bool:
    """Queued work with content `digest` for a serving document has been overtaken: other
    content was asked for since it was queued (`Document.queued_hash`), the content it serves
    included. Work queued before the column existed finds it empty, and runs."""
    return document.status == Document.Status.READY and document.queued_hash not in ("", digest)


def asked(document: Document, digest: str) -> str:
    """`Document.queued_hash` once content `digest` is written, kept or failed: still empty
    when no edit was ever queued for the document, else `digest`, so that queued work it
    overtook gives way (`overtaken`), even work that starts only now."""
    return digest if document.queued_hash else ""


def write_chunks(rows: Iterable[tuple[Any, ...]]) -> None:
    """Insert chunk rows (document id, KB id, revision, then a prepared row) in bulk."""
    # Staging and moving must share a transaction (the stage is emptied at commit).
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_CREATE_STAGE)
        with cursor.copy(_COPY_STAGE) as copy:
            copy.set_types(STAGE_TYPES)
            for row in rows:
                copy.write_row(row)
        cursor.execute(_MOVE_STAGE)
        cursor.execute(_EMPTY_STAGE)


def chunk_rows(document: Document, prepared: PreparedDocument) -> Iterator[tuple[Any, ...]]:
    """The full chunk rows of a prepared document stored as `document`."""
    head = (document.pk, document.knowledge_base_id, document.revision)
    return (head + row for row in prepared.rows)


def restrict_serving(document: Document, metadata: dict[str, Any]) -> None:
    """Apply the visibility of an edit that is not swapped in yet (queued, or failed to index)
    to the `ready` document still serving its old revision: while old text serves, only
    principals both versions admit see it. The rest of the metadata describes the new text and
    waits for it. Call with the document's row locked, under its knowledge base's write lock."""
    if document.status != Document.Status.READY:
        return
    kept = {k: v for k, v in document.metadata.items() if k not in VISIBILITY_KEYS}
    restricted = kept | narrowest(document.metadata, metadata)
    if restricted != document.metadata:
        Document.objects.filter(pk=document.pk).update(metadata=restricted)
        document.metadata = restricted


def record_failure(
    kb: KnowledgeBase,
    todo: CleanDocument,
    error: str,
    *,
    document_id: int | None = None,
    queued: bool = False,
) -> UpsertResult:
    """Keep a serving document serving; create a new one as `failed` so it can be retried.

    `document_id`: the row a re-index works on (`_stale`): one deleted meanwhile stays
    deleted, one given other content meanwhile is left to that content's indexing.
    `queued`: a worker's task, which gives way to content asked for since (`overtaken`)."""
    with transaction.atomic():
        lock_for_writing(kb)
        # Ordered by id: the model's ordering would join the KB's row and lock it too.
        document = (
            Document.objects.select_for_update()
            .filter(knowledge_base=kb, source_key=todo.source_key)
            .order_by("pk")
            .first()
        )
        if document_id is not None and (stale := _stale(document, document_id, todo)):
            return stale
        if queued and document is not None and overtaken(document, todo.digest):
            return UpsertResult(DocumentOutcome.UNCHANGED, document, 0, source_key=todo.source_key)
        if document is not None:
            # A serving document keeps serving (as the edit's visibility narrows it); a
            # queued or failed one is now `failed`.
            restrict_serving(document, todo.metadata)
            if document.status != Document.Status.READY:
                document.status = Document.Status.FAILED
            document.last_error, document.queued_hash = error, asked(document, todo.digest)
            Document.objects.filter(pk=document.pk).update(
                last_error=error, status=document.status, queued_hash=document.queued_hash
            )
        else:
            document = Document.objects.create(
                knowledge_base=kb,
                source_key=todo.source_key,
                title=todo.title,
                body=todo.body,
                metadata=todo.metadata,
                content_hash=todo.digest,
                status=Document.Status.FAILED,
                last_error=error,
            )
    return UpsertResult(DocumentOutcome.FAILED, document, 0, error, todo.source_key)


def swap_in(
    kb: KnowledgeBase,
    batch: Sequence[PreparedDocument],
    *,
    document_id: int | None = None,
    queued: bool = False,
) -> list[UpsertResult]:
    """Swap the new revisions of a batch in, in one transaction; one result each, in order.

    They are written as the knowledge base's language and embedder are under its lock
    (`lock_for_writing`), which `kb` takes: a batch prepared before a switch of language is
    analysed again; one prepared before a switch of embedder is embedded again (up to
    `REEMBEDDINGS` times), and a document that then fails is recorded as failed.
    `document_id`: a re-index of that one row, of one document (`_stale`). `queued`: a
    worker's task, which gives way to content asked for since it was queued (`overtaken`)."""
    batch = list(batch)
    failed: dict[int, str] = {}
    attempts = len(batch) + 1
    reembeddings = 0
    while True:
        try:
            with transaction.atomic():
                lock_for_writing(kb)
                if reembeddings < REEMBEDDINGS and any(
                    prepared.embedder != kb.embedder
                    for i, prepared in enumerate(batch)
                    if i not in failed
                ):
                    raise _EmbedderSwitched
                written = _swap_in_once(
                    kb, [p for i, p in enumerate(batch) if i not in failed], document_id, queued
                )
            break
        except IntegrityError:
            # Another writer created one of the batch's new keys first: the retry sees it
            # and updates it instead. Each retry settles at least one key, hence the bound.
            attempts -= 1
            if attempts == 0:
                raise
        except _EmbedderSwitched:
            reembeddings += 1
            todo = [(i, p.document) for i, p in enumerate(batch) if i not in failed]
            again = prepare_documents(kb.embedder, kb.language, [d for _, d in todo])
            for (i, _), outcome in zip(todo, again, strict=True):
                if isinstance(outcome, str):
                    failed[i] = outcome
                else:
                    batch[i] = outcome
    results = iter(written)
    return [
        record_failure(kb, prepared.document, failed[i], document_id=document_id, queued=queued)
        if i in failed
        else next(results)
        for i, prepared in enumerate(batch)
    ]


class _EmbedderSwitched(Exception):
    """The knowledge base uses another embedder than the batch was prepared with."""


_SWAPPED_FIELDS = (
    "title",
    "body",
    "metadata",
    "content_hash",
    "status",
    "last_error",
    "queued_hash",
    "revision",
    "updated_at",
)


def _stale(document: Document | None, document_id: int, todo: CleanDocument) -> UpsertResult | None:
    """What a re-index of row `document_id` with `todo`'s content comes to when the row it
    finds (`document`, locked) is not that one any more: deleted (or deleted and created
    again), `failed` with `GONE`; given other content, `unchanged`, that content's indexing
    being its own. None: the row is as the re-index read it."""
    if document is None or document.pk != document_id:
        return UpsertResult(DocumentOutcome.FAILED, None, 0, GONE, todo.source_key)
    if document.content_hash != todo.digest:
        return UpsertResult(DocumentOutcome.UNCHANGED, document, 0, source_key=todo.source_key)
    return None


def _swap_in_once(
    kb: KnowledgeBase,
    batch: Sequence[PreparedDocument],
    document_id: int | None = None,
    queued: bool = False,
) -> list[UpsertResult]:
    batch = [prepared.in_language(kb.language) for prepared in batch]
    keys = sorted(prepared.document.source_key for prepared in batch)
    # Locked in key order, so concurrent batches cannot deadlock on each other (batches in
    # one caller's transaction keep their locks until it ends: see docs/ingestion.md).
    locked = {
        document.source_key: document
        for document in Document.objects.select_for_update()
        .filter(knowledge_base=kb, source_key__in=keys)
        .order_by("source_key")
        .defer("body")
    }
    results: list[UpsertResult] = []
    created: list[Document] = []
    replaced: list[Document] = []
    written: list[tuple[Document, PreparedDocument]] = []
    for prepared in batch:
        todo = prepared.document
        document = locked.get(todo.source_key)
        if document is not None and is_current(document, todo.digest):
            # Another writer indexed the same content while this one was embedding.
            results.append(
                UpsertResult(DocumentOutcome.UNCHANGED, document, 0, source_key=todo.source_key)
            )
            continue
        if document_id is not None and (stale := _stale(document, document_id, todo)):
            results.append(stale)
            continue
        if queued and document is not None and overtaken(document, todo.digest):
            results.append(
                UpsertResult(DocumentOutcome.UNCHANGED, document, 0, source_key=todo.source_key)
            )
            continue
        if document is None:
            outcome = DocumentOutcome.CREATED
            document = Document(knowledge_base=kb, source_key=todo.source_key, revision=1)
            created.append(document)
        elif document.status == Document.Status.READY or document.chunks.exists():
            outcome = DocumentOutcome.UPDATED
            document.revision += 1
            replaced.append(document)
        else:
            # A failed first attempt never served: its retry is the document's first revision.
            outcome = DocumentOutcome.CREATED
            replaced.append(document)
        document.title = todo.title
        document.body = todo.body
        document.metadata = todo.metadata
        document.content_hash = todo.digest
        document.status = Document.Status.READY
        document.last_error = ""
        document.queued_hash = asked(document, todo.digest)
        written.append((document, prepared))
        results.append(
            UpsertResult(outcome, document, len(prepared.rows), source_key=todo.source_key)
        )
    if created:
        # Key order here too: concurrent writers of the same new keys wait, never deadlock.
        Document.objects.bulk_create(sorted(created, key=lambda document: document.source_key))
    for document in replaced:
        document.save(update_fields=_SWAPPED_FIELDS)
    if replaced:
        Chunk.objects.filter(document__in=replaced).delete()
    if written:
        write_chunks(
            row for document, prepared in written for row in chunk_rows(document, prepared)
        )
    for result in results:
        if result.outcome in INDEXED:
            send_on_commit(
                signals.document_indexed,
                Document,
                document=result.document,
                outcome=result.outcome,
                chunks=result.chunks,
            )
    return results
