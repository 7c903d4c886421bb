"""Preparation: a clean document cut into chunks, embedded and analysed, without the database.

`prepare_documents` is the CPU (and embedder) half of indexing; storage is the other half.
The pipeline runs it in a background thread while the previous batch is written, and the
benchmarks time it on its own: it never touches a database connection.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..conf import knowledge_settings
from ..retrieval.analysis import document_terms
from ..retrieval.embedders import BaseEmbedder, EmbedderError, get_embedder
from ..retrieval.postings import chunk_terms, encode_terms
from .chunker import chunk_spans
from .validation import CleanDocument

# The largest finite half-precision value: the HNSW index holds vectors as `halfvec`.
HALFVEC_MAX = 65504.0


@dataclass(frozen=True)
class PreparedDocument:
    """A document's new content, cut and embedded: its chunk rows minus the document's ids.

    A row is (ordinal, start, end, text, text hash, vector bytes, dimensions, lexical
    length, lexical levels, lexical terms): storage prepends document id, KB id, revision.
    """

    document: CleanDocument
    rows: list[tuple[Any, ...]] = field(repr=False)
    #: The embedder alias its vectors come from, and the language its lexical columns were
    #: analysed in: what storage compares with the knowledge base's when it writes.
    embedder: str = ""
    language: str = ""

    def in_language(self, language: str) -> PreparedDocument:
        """The same rows with their lexical columns analysed in `language`: for a writer
        that finds its knowledge base switched to another since it prepared them."""
        if language == self.language:
            return self
        title_terms = document_terms(self.document.title, language)
        rows = []
        for row in self.rows:
            lexical = encode_terms(chunk_terms(row[3], title_terms, language))
            rows.append((*row[:7], lexical.length, lexical.levels, lexical.terms))
        return PreparedDocument(self.document, rows, self.embedder, language)


@lru_cache(maxsize=8)
def _vector_format(dimensions: int) -> struct.Struct:
    # pgvector's binary input: int16 dimensions, int16 unused, float4 values, big-endian.
    return struct.Struct(f">hh{dimensions}f")


def vector_bytes(vector: Sequence[float]) -> bytes:
    """A vector in pgvector's binary wire format (what `COPY ... FORMAT BINARY` sends)."""
    return _vector_format(len(vector)).pack(len(vector), 0, *vector)


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


# Texts per call to the embedder. A vector of floats costs about 32 bytes a dimension in
# Python, its wire form 4: embedding a 20 MB document's 24,000 chunks in one call held
# 290 MB of floats at once. The slice is large enough for a remote embedder to fill its
# requests.
EMBED_SLICE = 1024


def _embedded(embedder: BaseEmbedder, texts: list[str]) -> list[bytes]:
    """The vectors of `texts` in wire form, checked, embedded a slice at a time so that only
    one slice's floats are alive at once."""
    vectors: list[bytes] = []
    for start in range(0, len(texts), EMBED_SLICE):
        piece = texts[start : start + EMBED_SLICE]
        embedded = embedder.embed_documents(piece)
        if len(embedded) != len(piece):
            raise EmbedderError("The embedder returned a different number of vectors.")
        for vector in embedded:
            _check_vector(vector, embedder.dimensions)
            vectors.append(vector_bytes(vector))
    return vectors


def prepare_documents(
    alias: str, language: str, documents: Sequence[CleanDocument]
) -> list[PreparedDocument | str]:
    """Cut, embed and analyse documents, in order: their rows, or why embedding failed.

    `alias` names the embedder and `language` the text analysis (a knowledge base's
    `embedder` and `language`). The chunks of all the documents go to the embedder together,
    `EMBED_SLICE` at a time (a remote embedder then fills its requests across documents); if
    that fails, each document is retried alone so one bad document does not fail the others.
    """
    if not documents:
        return []
    spans = [
        chunk_spans(
            document.body,
            target_chars=knowledge_settings.CHUNK_TARGET_CHARS,
            overlap_chars=knowledge_settings.CHUNK_OVERLAP_CHARS,
        )
        for document in documents
    ]
    texts = [
        [document.body[s.start : s.end] for s in cut]
        for document, cut in zip(documents, spans, strict=True)
    ]
    embedder = get_embedder(alias)
    flat = [text for pieces in texts for text in pieces]
    try:
        vectors = _embedded(embedder, flat)
    except EmbedderError as exc:
        if len(documents) == 1:
            return [f"Embedding failed: {exc}"]
        return [
            outcome
            for document in documents
            for outcome in prepare_documents(alias, language, [document])
        ]
    prepared: list[PreparedDocument | str] = []
    position = 0
    for document, cut, pieces in zip(documents, spans, texts, strict=True):
        rows = []
        title_terms = document_terms(document.title, language)
        for ordinal, (span, text) in enumerate(zip(cut, pieces, strict=True)):
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
                    vector,
                    embedder.dimensions,
                    lexical.length,
                    lexical.levels,
                    lexical.terms,
                )
            )
        prepared.append(PreparedDocument(document, rows, alias, language))
    return prepared
