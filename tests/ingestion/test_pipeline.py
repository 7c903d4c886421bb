"""How `upsert_documents` cuts its input into batches (database-free)."""

from __future__ import annotations

from bailing_knowledge.ingestion import pipeline
from bailing_knowledge.ingestion.validation import DocumentInput


def _inputs(*documents):
    return [DocumentInput(*document) for document in documents]


def test_batches_start_small_and_respect_their_limits():
    documents = _inputs(*[(f"{n}.md", "T", "x") for n in range(200)])
    sizes = [len(batch) for batch in pipeline._batches(documents, 64)]
    assert sizes == [4, 8, 16, 32, 64, 64, 12]
    repeated = _inputs(("a", "T", "x"), ("b", "T", "x"), ("a", "T", "y"), ("c", "T", "x"))
    assert [[d.source_key for d in b] for b in pipeline._batches(repeated, 64)] == [
        ["a", "b"],
        ["a", "c"],
    ]
    big = "x" * (pipeline.BATCH_CHARACTERS // 2)
    heavy = _inputs(*[(f"{n}.md", "T", big) for n in range(8)])
    assert [len(b) for b in pipeline._batches(heavy, 4)] == [2, 2, 2, 2]
