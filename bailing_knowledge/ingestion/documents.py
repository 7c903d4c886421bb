"""Documents in: `upsert_document` and `upsert_documents`; delete and reindex beside them.

Content is chunked and embedded *before* the database is touched; the new revision's chunks
are then written and the old ones removed in one transaction together with the document
row. A search or read statement therefore sees the old revision or the new one, never a mix,
and a document keeps serving its old revision until the new one is fully indexed.

Chunk rows go to PostgreSQL with binary COPY into a session-local staging table and move to
the chunk table in one `INSERT ... SELECT` that computes the `tsvector`: no per-row statement,
no float formatting, no text parsing of vectors (docs/performance.md has the figures).
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction

from .. import signals
from ..conf import check_embedder_alias, knowledge_settings
from ..lookups import get_knowledge_base
from ..models import Chunk, Document, KnowledgeBase, content_hash
from ..retrieval.analysis import check_language, document_terms
from ..retrieval.embedders import EmbedderError, get_embedder
from ..retrieval.lexical import chunk_terms, encode_terms
from ..retrieval.visibility import VISIBILITY_KEYS
from ..signals import send_on_commit
from .chunker import chunk_spans
from .lexicon import rebuild_lexical_index
from .loaders import storable_text
from .tasks import enqueue, runs_inline, task

SOURCE_KEY_MAX = Document._meta.get_field("source_key").max_length
TITLE_MAX = Document._meta.get_field("title").max_length

# `upsert_documents` batches: documents per transaction, and body characters per batch
# (bounds the memory of the two batches in flight: about 2,500 chunks each).
BATCH_DOCUMENTS = 64
BATCH_CHARACTERS = 2_000_000


@dataclass(frozen=True)
class DocumentInput:
    """One document for `upsert_documents`: the arguments of `upsert_document`."""

    source_key: str
    title: str
    body: str
    metadata: dict[str, Any] | None = None


@dataclass(frozen=True)
class UpsertResult:
    """What happened to one document: created, updated, unchanged, queued or failed."""

    outcome: str
    document: Document | None = None
    chunks: int = 0
    error: str = ""
    source_key: str = ""


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
    elif not _is_json(metadata):
        errors["metadata"] = (
            "Must be JSON: strings, finite numbers, booleans, null, lists, objects."
        )
    else:
        for key in VISIBILITY_KEYS:
            value = metadata.get(key)
            if value is not None and (
                not isinstance(value, list) or not all(isinstance(v, str) and v for v in value)
            ):
                errors["metadata"] = f"metadata[{key!r}] must be a list of non-empty strings."
    if errors:
        raise ValidationError(errors)


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def validation_message(exc: ValidationError) -> str:
    """One line for a log, a summary or the admin: `field: message; ...`."""
    if hasattr(exc, "error_dict"):
        return "; ".join(
            f"{name}: {message}"
            for name, messages in exc.message_dict.items()
            for message in messages
        )
    return "; ".join(exc.messages)


@dataclass(frozen=True)
class _Todo:
    """A validated document whose content may need indexing."""

    source_key: str
    title: str
    body: str
    metadata: dict[str, Any]
    digest: str


def _clean(source_key: str, title: str, body: str, metadata: dict[str, Any] | None) -> _Todo:
    """Normalise and validate one document; bad input raises `ValidationError`."""
    wrong = [
        name
        for name, value in (("source_key", source_key), ("title", title), ("body", body))
        if not isinstance(value, str)
    ]
    if wrong:
        raise ValidationError({name: "Must be a string." for name in wrong})
    if storable_text(source_key) != source_key:
        raise ValidationError({"source_key": "Must not contain NUL or unpaired surrogates."})
    title, body = storable_text(title).strip(), storable_text(body)
    metadata = {} if metadata is None else metadata
    _validate(source_key, title, body, metadata)
    return _Todo(source_key, title, body, metadata, content_hash(title, body))


def _is_current(document: Document, digest: str) -> bool:
    """The document already serves exactly this content: nothing to index."""
    return document.content_hash == digest and document.status == Document.Status.READY


def _keep_unchanged(document: Document, todo: _Todo) -> UpsertResult:
    """An unchanged document still takes the new metadata (it needs no new revision)."""
    if document.metadata != todo.metadata:
        Document.objects.filter(pk=document.pk).update(metadata=todo.metadata)
        document.metadata = todo.metadata
    return UpsertResult("unchanged", document, 0, source_key=todo.source_key)


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
    revision, indexed through the task layer (inline by default → `created`/`updated`;
    with a queueing runner → `queued`). Bad input raises `ValidationError`.
    """
    kb = get_knowledge_base(kb)
    todo = _clean(source_key, title, body, metadata)
    existing = _current_documents(kb, [source_key]).get(source_key)
    if existing is not None and _is_current(existing, todo.digest):
        return _keep_unchanged(existing, todo)
    return _enqueue(kb, todo)


def _enqueue(kb: KnowledgeBase, todo: _Todo) -> UpsertResult:
    result = enqueue(
        index_document,
        knowledge_base_id=kb.pk,
        source_key=todo.source_key,
        title=todo.title,
        body=todo.body,
        metadata=todo.metadata,
    )
    if isinstance(result, UpsertResult):
        return result
    return UpsertResult("queued", source_key=todo.source_key)


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

    With a queueing task runner, each changed document becomes one task, as with
    `upsert_document`.
    """
    kb = get_knowledge_base(kb)
    batches = _batches(documents, max(1, batch_size))
    if not runs_inline():
        for batch in batches:
            for slot in _triage(kb, batch):
                yield _settled(slot) if slot.todo is None else _enqueue(kb, slot.todo)
        return
    pool = ThreadPoolExecutor(1, thread_name_prefix="bailing-knowledge-prepare")
    try:
        # The batch being prepared: its keys, its slots and its rows to come.
        pending: tuple[set[str], list[_Slot], Future[list[_Prepared | str]]] | None = None
        for batch in batches:
            keys = {document.source_key for document in batch}
            if pending is not None and keys & pending[0]:
                # A key of the batch not yet written: triage must see its new version.
                yield from _finish(kb, *pending[1:])
                pending = None
            slots = _triage(kb, batch)
            todos = [slot.todo for slot in slots if slot.todo is not None]
            future = pool.submit(_prepare_all, kb.embedder, kb.language, todos)
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

    todo: _Todo | None = None
    result: UpsertResult | None = None
    unchanged: tuple[Document, _Todo] | None = None


def _settled(slot: _Slot) -> UpsertResult:
    """The result of a slot with no indexing to do; applies an unchanged document's new
    metadata now, so that nothing of a batch is written before its results are due."""
    if slot.unchanged is not None:
        slot.result = _keep_unchanged(*slot.unchanged)
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
            todo = _clean(document.source_key, document.title, document.body, document.metadata)
        except ValidationError as exc:
            error = validation_message(exc)
            slots.append(
                _Slot(result=UpsertResult("failed", error=error, source_key=document.source_key))
            )
            continue
        slots.append(_Slot(todo=todo))
    existing = _current_documents(kb, [slot.todo.source_key for slot in slots if slot.todo])
    for slot in slots:
        current = existing.get(slot.todo.source_key) if slot.todo else None
        if current is not None and _is_current(current, slot.todo.digest):
            slot.unchanged, slot.todo = (current, slot.todo), None
    return slots


def _finish(
    kb: KnowledgeBase, slots: list[_Slot], future: Future[list[_Prepared | str]]
) -> Iterator[UpsertResult]:
    """Write a prepared batch; record the documents whose embedding failed."""
    prepared = iter(future.result())
    ready: list[_Prepared] = []
    for slot in slots:
        if slot.todo is not None:
            outcome = next(prepared)
            if isinstance(outcome, str):
                slot.result, slot.todo = _record_failure(kb, slot.todo, outcome), None
            else:
                ready.append(outcome)
    written = iter(_swap_in(kb, ready) if ready else [])
    for slot in slots:
        yield _settled(slot) if slot.todo is None else next(written)


# --------------------------------------------------------------------------------------------
# Preparing: chunk, embed and encode, without the database


@dataclass(frozen=True)
class _Prepared:
    """A document's new content, cut and embedded: chunk rows minus the document's ids."""

    todo: _Todo
    rows: list[tuple[Any, ...]] = field(repr=False)


@lru_cache(maxsize=8)
def _vector_format(dimensions: int) -> struct.Struct:
    # pgvector's binary input: int16 dimensions, int16 unused, float4 values, big-endian.
    return struct.Struct(f">hh{dimensions}f")


def vector_bytes(vector: Sequence[float]) -> bytes:
    """A vector in pgvector's binary wire format (what `COPY ... FORMAT BINARY` sends)."""
    return _vector_format(len(vector)).pack(len(vector), 0, *vector)


# The largest finite half-precision value: the HNSW index holds vectors as `halfvec`.
HALFVEC_MAX = 65504.0


def _check_vector(vector: Sequence[float], dimensions: int) -> None:
    if len(vector) != dimensions:
        raise EmbedderError(
            f"The embedder returned a vector of {len(vector)} dimensions, not {dimensions}."
        )
    total = sum(map(abs, vector))
    if not total <= dimensions * HALFVEC_MAX or max(map(abs, vector)) > HALFVEC_MAX:
        # NaN fails the first test, infinities and huge values one of the two.
        raise EmbedderError(
            "The embedder returned a vector value that is not finite or exceeds ±65504."
        )


def _prepare_all(alias: str, language: str, todos: Sequence[_Todo]) -> list[_Prepared | str]:
    """Cut, embed and analyse documents: their rows, or the reason embedding failed.

    The chunks of the whole batch go to the embedder in one call (a remote embedder then
    fills its requests across documents); if that fails, each document is retried alone so
    one bad document does not fail the others.
    """
    if not todos:
        return []
    spans = [
        chunk_spans(
            todo.body,
            target_chars=knowledge_settings.CHUNK_TARGET_CHARS,
            overlap_chars=knowledge_settings.CHUNK_OVERLAP_CHARS,
        )
        for todo in todos
    ]
    texts = [
        [todo.body[s.start : s.end] for s in cut] for todo, cut in zip(todos, spans, strict=True)
    ]
    embedder = get_embedder(alias)
    flat = [text for document in texts for text in document]
    try:
        vectors = embedder.embed_documents(flat) if flat else []
        if len(vectors) != len(flat):
            raise EmbedderError("The embedder returned a different number of vectors.")
        for vector in vectors:
            _check_vector(vector, embedder.dimensions)
    except EmbedderError as exc:
        if len(todos) == 1:
            return [f"Embedding failed: {exc}"]
        return [outcome for todo in todos for outcome in _prepare_all(alias, language, [todo])]
    prepared: list[_Prepared | str] = []
    position = 0
    for todo, cut, document in zip(todos, spans, texts, strict=True):
        rows = []
        title_terms = document_terms(todo.title, language)
        for ordinal, (span, text) in enumerate(zip(cut, document, strict=True)):
            vector = vectors[position]
            position += 1
            lexical = encode_terms(chunk_terms(text, title_terms, language))
            rows.append(
                (
                    ordinal,
                    span.start,
                    span.end,
                    text,
                    hashlib.sha256(text.encode("utf-8")).hexdigest(),
                    vector_bytes(vector),
                    len(vector),
                    lexical.length,
                    lexical.levels,
                    lexical.terms,
                )
            )
        prepared.append(_Prepared(todo, rows))
    return prepared


# --------------------------------------------------------------------------------------------
# Writing


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
_STAGE_TYPES = (
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


def _write_chunks(rows: Iterable[tuple[Any, ...]]) -> None:
    """Insert chunk rows (document id, KB id, revision, then a prepared row) in bulk."""
    # Staging and moving must share a transaction (the stage is emptied at commit).
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_CREATE_STAGE)
        with cursor.copy(_COPY_STAGE) as copy:
            copy.set_types(_STAGE_TYPES)
            for row in rows:
                copy.write_row(row)
        cursor.execute(_MOVE_STAGE)
        cursor.execute(_EMPTY_STAGE)


def _chunk_rows(document: Document, prepared: _Prepared) -> Iterator[tuple[Any, ...]]:
    head = (document.pk, document.knowledge_base_id, document.revision)
    return (head + row for row in prepared.rows)


def _record_failure(kb: KnowledgeBase, todo: _Todo, error: str) -> UpsertResult:
    """Keep a serving document serving; create a new one as `failed` so it can be retried."""
    with transaction.atomic():
        document = (
            Document.objects.select_for_update()
            .filter(knowledge_base=kb, source_key=todo.source_key)
            .first()
        )
        if document is not None:
            Document.objects.filter(pk=document.pk).update(last_error=error)
            document.last_error = error
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
    return UpsertResult("failed", document, 0, error, todo.source_key)


@task
def index_document(
    knowledge_base_id: int, source_key: str, title: str, body: str, metadata: dict[str, Any]
) -> UpsertResult:
    """Index new content for a document and swap it in atomically."""
    kb = KnowledgeBase.objects.get(pk=knowledge_base_id)
    todo = _clean(source_key, title, body, metadata)
    (prepared,) = _prepare_all(kb.embedder, kb.language, [todo])
    if isinstance(prepared, str):
        return _record_failure(kb, todo, prepared)
    (result,) = _swap_in(kb, [prepared])
    return result


def _swap_in(kb: KnowledgeBase, batch: Sequence[_Prepared]) -> list[UpsertResult]:
    """Swap the new revisions of a batch in, in one transaction."""
    attempts = len(batch) + 1
    for attempt in range(attempts):
        try:
            with transaction.atomic():
                return _swap_in_once(kb, batch)
        except IntegrityError:
            # Another writer created one of the batch's new keys first: the retry sees it
            # and updates it instead. Each retry settles at least one key, hence the bound.
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


_SWAPPED_FIELDS = (
    "title",
    "body",
    "metadata",
    "content_hash",
    "status",
    "last_error",
    "revision",
    "updated_at",
)


def _swap_in_once(kb: KnowledgeBase, batch: Sequence[_Prepared]) -> list[UpsertResult]:
    keys = sorted(prepared.todo.source_key for prepared in batch)
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
    written: list[tuple[Document, _Prepared]] = []
    for prepared in batch:
        todo = prepared.todo
        document = locked.get(todo.source_key)
        if document is not None and _is_current(document, todo.digest):
            # Another writer indexed the same content while this one was embedding.
            results.append(UpsertResult("unchanged", document, 0, source_key=todo.source_key))
            continue
        if document is None:
            outcome = "created"
            document = Document(knowledge_base=kb, source_key=todo.source_key, revision=1)
            created.append(document)
        elif document.status == Document.Status.READY or document.chunks.exists():
            outcome = "updated"
            document.revision += 1
            replaced.append(document)
        else:
            # A failed first attempt never served: its retry is the document's first revision.
            outcome = "created"
            replaced.append(document)
        document.title = todo.title
        document.body = todo.body
        document.metadata = todo.metadata
        document.content_hash = todo.digest
        document.status = Document.Status.READY
        document.last_error = ""
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
        _write_chunks(
            row for document, prepared in written for row in _chunk_rows(document, prepared)
        )
    for result in results:
        if result.outcome in ("created", "updated"):
            send_on_commit(
                signals.document_indexed,
                Document,
                document=result.document,
                outcome=result.outcome,
                chunks=result.chunks,
            )
    return results


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
    todo = _Todo(
        document.source_key,
        document.title,
        document.body,
        document.metadata,
        document.content_hash,
    )
    kb = document.knowledge_base
    (prepared,) = _prepare_all(kb.embedder, kb.language, [todo])
    if isinstance(prepared, str):
        Document.objects.filter(pk=document.pk).update(last_error=prepared)
        return UpsertResult("failed", document, 0, prepared, document.source_key)
    with transaction.atomic():
        document = Document.objects.select_for_update().get(pk=document.pk)
        if document.content_hash != todo.digest:
            # A newer upsert already indexed other content.
            return UpsertResult("unchanged", document, 0, source_key=document.source_key)
        Chunk.objects.filter(document=document).delete()
        _write_chunks(_chunk_rows(document, prepared))
        Document.objects.filter(pk=document.pk).update(status=Document.Status.READY, last_error="")
    return UpsertResult("updated", document, len(prepared.rows), source_key=document.source_key)


def reindex_document(document: Document) -> UpsertResult:
    result = enqueue(reindex_document_task, document_id=document.pk)
    if isinstance(result, UpsertResult):
        return result
    return UpsertResult("queued", document, source_key=document.source_key)


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
