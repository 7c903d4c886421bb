"""`prepare_documents`: chunk, embed and encode, with no database at all."""

from __future__ import annotations

import hashlib

from bailing_knowledge.conf import knowledge_settings
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
