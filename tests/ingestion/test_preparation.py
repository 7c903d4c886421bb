"""`prepare_documents`: chunk, embed and encode, with no database at all."""

from __future__ import annotations

import hashlib

from bailing_knowledge.conf import knowledge_settings
from bailing_knowledge.ingestion import preparation
from bailing_knowledge.ingestion.chunker import chunk_spans
from bailing_knowledge.ingestion.preparation import (
    PreparedDocument,
    prepare_documents,
    vector_bytes,
)
from bailing_knowledge.ingestion.validation import clean_document
from bailing_knowledge.retrieval.analysis import document_terms
from bailing_knowledge.retrieval.embedders import EmbedderError, HashingEmbedder, get_embedder
from bailing_knowledge.retrieval.postings import chunk_terms, encode_terms

# No `django_db` mark: any query would fail the test.

BODY = "# Title\n\n" + "\n\n".join(f"Paragraph {i} is about topic {i}." for i in range(80))


class PickyEmbedder(HashingEmbedder):
    """Refuses any batch with a marked text, as a remote embedder may refuse one input."""

    def embed_documents(self, texts):
        if any("REFUSED" in text for text in texts):
            raise EmbedderError("refused")
        return super().embed_documents(texts)


def test_rows_are_the_chunks_vectors_and_terms_of_the_body():
    document = clean_document("a.md", " Title ", BODY, {"roles": ["staff"]})
    (prepared,) = prepare_documents("default", "english", [document])
    assert isinstance(prepared, PreparedDocument) and prepared.document is document
    spans = chunk_spans(
        BODY,
        target_chars=knowledge_settings.CHUNK_TARGET_CHARS,
        overlap_chars=knowledge_settings.CHUNK_OVERLAP_CHARS,
    )
    assert len(spans) > 1
    texts = [BODY[span.start : span.end] for span in spans]
    vectors = get_embedder("default").embed_documents(texts)
    title_terms = document_terms("Title", "english")
    for ordinal, (row, span, text, vector) in enumerate(
        zip(prepared.rows, spans, texts, vectors, strict=True)
    ):
        lexical = encode_terms(chunk_terms(text, title_terms, "english"))
        assert row == (
            ordinal,
            span.start,
            span.end,
            text,
            hashlib.sha256(text.encode()).hexdigest(),
            vector_bytes(vector),
            len(vector),
            lexical.length,
            lexical.levels,
            lexical.terms,
        )


def test_one_refused_document_fails_alone(settings):
    settings.BAILING_KNOWLEDGE = {
        "EMBEDDERS": {"default": {"BACKEND": "tests.ingestion.test_preparation.PickyEmbedder"}}
    }
    documents = [
        clean_document(f"{n}.md", f"Doc {n}", text)
        for n, text in enumerate(["Fine text.", "REFUSED text.", "More fine text."])
    ]
    first, refused, last = prepare_documents("default", "english", documents)
    assert refused == "Embedding failed: refused"
    assert isinstance(first, PreparedDocument) and first.document is documents[0]
    assert isinstance(last, PreparedDocument) and last.document is documents[2]


def test_nothing_to_prepare():
    assert prepare_documents("default", "english", []) == []


class CountingEmbedder(HashingEmbedder):
    """Records how many texts each call got."""

    calls: list[int] = []

    def embed_documents(self, texts):
        CountingEmbedder.calls.append(len(texts))
        return super().embed_documents(texts)


def test_a_long_document_is_embedded_a_slice_at_a_time(settings, monkeypatch):
    """Only one slice's vectors are held as floats: a 20 MB document's peak fell from 441
    to 146 MB. The rows are the same as from one call."""
    document = clean_document("a.md", "Title", BODY)
    (whole,) = prepare_documents("default", "english", [document])
    settings.BAILING_KNOWLEDGE = {
        "EMBEDDERS": {"default": {"BACKEND": "tests.ingestion.test_preparation.CountingEmbedder"}}
    }
    monkeypatch.setattr(preparation, "EMBED_SLICE", 2)
    CountingEmbedder.calls = []
    (sliced,) = prepare_documents("default", "english", [document])
    chunks = len(whole.rows)
    assert chunks > 2
    assert CountingEmbedder.calls == [2] * (chunks // 2) + ([chunks % 2] if chunks % 2 else [])
    assert sliced.rows == whole.rows


def test_a_wrong_count_in_any_slice_fails_the_document(settings, monkeypatch):
    class Short(HashingEmbedder):
        """One vector short in its second call only."""

        calls = 0

        def embed_documents(self, texts):
            Short.calls += 1
            return super().embed_documents(texts)[: len(texts) - (Short.calls == 2)]

    monkeypatch.setattr(preparation, "EMBED_SLICE", 1)
    monkeypatch.setattr(preparation, "get_embedder", lambda alias: Short())
    document = clean_document("a.md", "Title", BODY)
    assert prepare_documents("default", "english", [document]) == [
        "Embedding failed: The embedder returned a different number of vectors."
    ]
