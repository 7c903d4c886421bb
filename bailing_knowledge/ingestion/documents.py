"""Documents in and out: the stable import path of ingestion's public API.

The work lives in one module per step, each re-exported here: `validation` (cleaning
input), `preparation` (chunk, embed and encode, without the database), `storage` (the COPY
writer and the atomic swap of a new revision), `pipeline` (`upsert_document(s)` and their
batches) and `maintenance` (re-index or delete a document). Import from here unless you
need a step on its own. Operations on a whole knowledge base (re-index it, switch its
embedder or language) are services: `bailing_knowledge.services.reindex`.
"""

from __future__ import annotations

from .maintenance import (
    delete_document,
    reindex_document,
    reindex_document_task,
    reindex_task,
)
from .outcomes import DocumentOutcome, UpsertResult
from .pipeline import (
    BATCH_CHARACTERS,
    BATCH_DOCUMENTS,
    index_document,
    index_task,
    upsert_document,
    upsert_documents,
)
from .preparation import HALFVEC_MAX, PreparedDocument, prepare_documents, vector_bytes
from .validation import (
    SOURCE_KEY_MAX,
    TITLE_MAX,
    CleanDocument,
    DocumentInput,
    clean_document,
    validation_message,
)

__all__ = [
    "BATCH_CHARACTERS",
    "BATCH_DOCUMENTS",
    "HALFVEC_MAX",
    "SOURCE_KEY_MAX",
    "TITLE_MAX",
    "CleanDocument",
    "DocumentInput",
    "DocumentOutcome",
    "PreparedDocument",
    "UpsertResult",
    "clean_document",
    "delete_document",
    "index_document",
    "index_task",
    "prepare_documents",
    "reindex_document",
    "reindex_document_task",
    "reindex_task",
    "upsert_document",
    "upsert_documents",
    "validation_message",
    "vector_bytes",
]
