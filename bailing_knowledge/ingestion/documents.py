"""Documents in: `upsert_document` is the one entry point; delete and reindex beside it.

Content is chunked and embedded *before* the database is touched; the new revision's chunks
are then written and the old ones removed in one transaction together with the document
row. A search or read statement therefore sees the old revision or the new one, never a mix,
and a document keeps serving its old revision until the new one is fully indexed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction

from ..conf import knowledge_settings
from ..models import Chunk, Document, KnowledgeBase, content_hash
from ..retrieval.embedders import EmbedderError, get_embedder
from ..retrieval.tokenization import lexical_text
from ..services.catalog import get_knowledge_base
from .chunker import chunk_spans
from .tasks import enqueue, task

SOURCE_KEY_MAX = Document._meta.get_field("source_key").max_length
TITLE_MAX = Document._meta.get_field("title").max_length

# Metadata keys that restrict who sees a document (lists of strings).
VISIBILITY_KEYS = ("audiences", "roles")


@dataclass(frozen=True)
class UpsertResult:
    """What happened to one document: created, updated, unchanged, queued or failed."""

    outcome: str
    document: Document | None = None
    chunks: int = 0
    error: str = ""


def clean_text(text: str) -> str:
    # PostgreSQL text cannot hold NUL.
    return text.replace("\x00", "")


def _validate(source_key: str, title: str, body: str, metadata: dict[str, Any]) -> None:
    errors: dict[str, str] = {}
    if not source_key or len(source_key) > SOURCE_KEY_MAX:
        errors["source_key"] = f"Must be 1 to {SOURCE_KEY_MAX} characters."
    if not title.strip() or len(title) > TITLE_MAX:
        errors["title"] = f"Must be 1 to {TITLE_MAX} characters."
    if not body.strip():
        errors["body"] = "The document has no text."
    if not isinstance(metadata, dict):
        errors["metadata"] = "Must be a JSON object."
    else:
        for key in VISIBILITY_KEYS:
            value = metadata.get(key)
            if value is not None and (
                not isinstance(value, list) or not all(isinstance(v, str) and v for v in value)
            ):
                errors["metadata"] = f"metadata[{key!r}] must be a list of non-empty strings."
    if errors:
        raise ValidationError(errors)


def upsert_document(
    kb: KnowledgeBase | str,
    source_key: str,
    title: str,
    body: str,
    metadata: dict[str, Any] | None = None,
) -> UpsertResult:
    """Create or update the document `source_key` of `kb`; idempotent.

    Same title and body → `unchanged` (metadata is still updated); anything else → a new
    revision, indexed through the task layer (inline by default → `created`/`updated`;
    with a queueing runner → `queued`). Bad input raises `ValidationError`.
    """
    kb = get_knowledge_base(kb)
    title, body, metadata = clean_text(title).strip(), clean_text(body), metadata or {}
    _validate(source_key, title, body, metadata)
    existing = Document.objects.filter(knowledge_base=kb, source_key=source_key).first()
    if (
        existing is not None
        and existing.content_hash == content_hash(title, body)
        and existing.status == Document.Status.READY
    ):
        if existing.metadata != metadata:
            Document.objects.filter(pk=existing.pk).update(metadata=metadata)
            existing.metadata = metadata
        return UpsertResult("unchanged", existing, 0)
    result = enqueue(
        index_document,
        knowledge_base_id=kb.pk,
        source_key=source_key,
        title=title,
        body=body,
        metadata=metadata,
    )
    return result if isinstance(result, UpsertResult) else UpsertResult("queued")


@dataclass(frozen=True)
class _PreparedChunk:
    ordinal: int
    start: int
    end: int
    text: str
    embedding: list[float] | None


def _prepare(kb: KnowledgeBase, body: str) -> tuple[list[_PreparedChunk], int]:
    """Cut and embed a body; raises `EmbedderError` when the embedder fails."""
    spans = chunk_spans(
        body,
        target_chars=knowledge_settings.CHUNK_TARGET_CHARS,
        overlap_chars=knowledge_settings.CHUNK_OVERLAP_CHARS,
    )
    texts = [body[span.start : span.end] for span in spans]
    embedder = get_embedder(kb.embedder)
    vectors = embedder.embed_documents(texts) if texts else []
    if len(vectors) != len(texts):
        raise EmbedderError("The embedder returned a different number of vectors.")
    prepared = [
        _PreparedChunk(i, span.start, span.end, text, list(vector))
        for i, (span, text, vector) in enumerate(zip(spans, texts, vectors, strict=True))
    ]
    return prepared, embedder.dimensions


_INSERT_CHUNK = (
    "INSERT INTO bailing_knowledge_chunk (document_id, knowledge_base_id, revision, ordinal, "
    '"start", "end", "text", text_hash, embedding, embedding_dimensions, search_vector) '
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s::vector, %s, to_tsvector('simple', %s))"
)


def _vector_literal(vector: Sequence[float]) -> str:
    return "[" + ",".join(f"{x:.7g}" for x in vector) + "]"


def _write_chunks(document: Document, chunks: list[_PreparedChunk], dimensions: int) -> None:
    rows = [
        (
            document.pk,
            document.knowledge_base_id,
            document.revision,
            chunk.ordinal,
            chunk.start,
            chunk.end,
            chunk.text,
            hashlib.sha256(chunk.text.encode("utf-8")).hexdigest(),
            _vector_literal(chunk.embedding) if chunk.embedding is not None else None,
            dimensions if chunk.embedding is not None else None,
            lexical_text(chunk.text),
        )
        for chunk in chunks
    ]
    with connection.cursor() as cursor:
        cursor.executemany(_INSERT_CHUNK, rows)


def _record_failure(
    kb: KnowledgeBase, source_key: str, title: str, body: str, metadata: dict, error: str
) -> Document:
    """Keep a serving document serving; create a new one as `failed` so it can be retried."""
    with transaction.atomic():
        document = (
            Document.objects.select_for_update()
            .filter(knowledge_base=kb, source_key=source_key)
            .first()
        )
        if document is not None:
            Document.objects.filter(pk=document.pk).update(last_error=error)
            document.last_error = error
            return document
        return Document.objects.create(
            knowledge_base=kb,
            source_key=source_key,
            title=title,
            body=body,
            metadata=metadata,
            content_hash=content_hash(title, body),
            status=Document.Status.FAILED,
            last_error=error,
        )


@task
def index_document(
    knowledge_base_id: int, source_key: str, title: str, body: str, metadata: dict[str, Any]
) -> UpsertResult:
    """Index new content for a document and swap it in atomically."""
    kb = KnowledgeBase.objects.get(pk=knowledge_base_id)
    try:
        chunks, dimensions = _prepare(kb, body)
    except EmbedderError as exc:
        error = f"Embedding failed: {exc}"
        document = _record_failure(kb, source_key, title, body, metadata, error)
        return UpsertResult("failed", document, 0, error)
    digest = content_hash(title, body)
    for attempt in range(2):
        try:
            with transaction.atomic():
                return _swap_in(kb, source_key, title, body, metadata, digest, chunks, dimensions)
        except IntegrityError:
            # Two first-time writers of the same source_key: the loser retries as an update.
            if attempt:
                raise
    raise AssertionError("unreachable")


def _swap_in(
    kb: KnowledgeBase,
    source_key: str,
    title: str,
    body: str,
    metadata: dict[str, Any],
    digest: str,
    chunks: list[_PreparedChunk],
    dimensions: int,
) -> UpsertResult:
    locked = Document.objects.select_for_update()
    document = locked.filter(knowledge_base=kb, source_key=source_key).first()
    if document is None:
        outcome = "created"
        document = Document(knowledge_base=kb, source_key=source_key, revision=1)
    elif document.content_hash == digest and document.status == Document.Status.READY:
        # Another writer indexed the same content while we were embedding.
        return UpsertResult("unchanged", document, 0)
    elif document.status == Document.Status.READY or document.chunks.exists():
        outcome = "updated"
        document.revision += 1
    else:
        # A failed first attempt never served: its retry is the document's first revision.
        outcome = "created"
    document.title = title
    document.body = body
    document.metadata = metadata
    document.content_hash = digest
    document.status = Document.Status.READY
    document.last_error = ""
    document.save()
    Chunk.objects.filter(document=document).delete()
    _write_chunks(document, chunks, dimensions)
    return UpsertResult(outcome, document, len(chunks))


@task
def reindex_document_task(document_id: int) -> UpsertResult:
    """Re-cut and re-embed a document's current content (e.g. after an embedder change).

    The revision stays: the text is the same, so references to it remain valid.
    """
    document = Document.objects.select_related("knowledge_base").filter(pk=document_id).first()
    if document is None:
        return UpsertResult("failed", None, 0, "The document no longer exists.")
    if document.status == Document.Status.FAILED and not document.chunks.exists():
        return index_document(
            document.knowledge_base_id,
            document.source_key,
            document.title,
            document.body,
            document.metadata,
        )
    snapshot = document.content_hash
    try:
        chunks, dimensions = _prepare(document.knowledge_base, document.body)
    except EmbedderError as exc:
        error = f"Embedding failed: {exc}"
        Document.objects.filter(pk=document.pk).update(last_error=error)
        return UpsertResult("failed", document, 0, error)
    with transaction.atomic():
        document = Document.objects.select_for_update().get(pk=document.pk)
        if document.content_hash != snapshot:
            return UpsertResult("unchanged", document, 0)  # a newer upsert already indexed it
        Chunk.objects.filter(document=document).delete()
        _write_chunks(document, chunks, dimensions)
        Document.objects.filter(pk=document.pk).update(status=Document.Status.READY, last_error="")
    return UpsertResult("updated", document, len(chunks))


def reindex_document(document: Document) -> UpsertResult:
    result = enqueue(reindex_document_task, document_id=document.pk)
    return result if isinstance(result, UpsertResult) else UpsertResult("queued", document)


def reindex_knowledge_base(kb: KnowledgeBase | str) -> list[UpsertResult]:
    kb = get_knowledge_base(kb)
    return [
        reindex_document(document)
        for document in Document.objects.filter(knowledge_base=kb).order_by("pk")
    ]


def set_knowledge_base_embedder(kb: KnowledgeBase | str, alias: str) -> KnowledgeBase:
    """Switch a KB to another embedder and re-embed its documents with it."""
    from ..services.catalog import _check_embedder

    kb = get_knowledge_base(kb)
    _check_embedder(alias)
    if kb.embedder == alias:
        return kb
    KnowledgeBase.objects.filter(pk=kb.pk).update(embedder=alias)
    kb.embedder = alias
    reindex_knowledge_base(kb)
    return kb


@transaction.atomic
def delete_document(kb: KnowledgeBase | str, source_key: str) -> bool:
    """Delete a document and its chunks; False when there was none."""
    kb = get_knowledge_base(kb)
    deleted, _ = Document.objects.filter(knowledge_base=kb, source_key=source_key).delete()
    return bool(deleted)
