"""Vectors from a local sentence-transformers model (the ``sentence-transformers`` extra)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from .base import BaseEmbedder, EmbedderError, prefix_tag

__all__ = ["SentenceTransformerEmbedder"]


class SentenceTransformerEmbedder(BaseEmbedder):
    """Vectors from a local sentence-transformers model (``pip install sentence-transformers``).

    Options: ``MODEL`` (required; a model name to download or a local path), ``DEVICE``
    (``"cpu"``, ``"cuda"``…; default: the library's choice), ``BATCH_SIZE`` (default 32),
    ``NORMALIZE`` (default ``True``: unit-length vectors; ``False`` keeps the model's own
    lengths, which cosine search ignores), ``QUERY_PREFIX`` / ``DOCUMENT_PREFIX`` (default
    empty; e.g. ``"query: "`` and ``"passage: "`` for the E5 family).

    The model loads when the embedder is first requested; a model that cannot be loaded is an
    `EmbedderError`, a missing package is ``ImproperlyConfigured``.
    """

    option_names = frozenset(
        {"MODEL", "DEVICE", "BATCH_SIZE", "NORMALIZE", "QUERY_PREFIX", "DOCUMENT_PREFIX"}
    )
    loads_model = True
    requires = ("sentence_transformers", "sentence-transformers")

    def __init__(self, alias: str = "default", options: Mapping[str, Any] | None = None) -> None:
        super().__init__(alias, options)
        model = self._required_str_option("MODEL")
        device = self._str_option("DEVICE", None)
        self.batch_size = self._int_option("BATCH_SIZE", 32, 1, 4096)
        self.normalize = self._bool_option("NORMALIZE", True)
        self.query_prefix = self._str_option("QUERY_PREFIX", "") or ""
        self.document_prefix = self._str_option("DOCUMENT_PREFIX", "") or ""
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ImproperlyConfigured(
                f"{self._where()}: SentenceTransformerEmbedder needs the sentence-transformers "
                "package: pip install 'bailing-knowledge[sentence-transformers]' "
                "(or pip install sentence-transformers)."
            ) from exc
        try:
            self._model = SentenceTransformer(model, device=device)
        except Exception as exc:
            raise EmbedderError(
                f"Embedder {alias!r}: cannot load model {model!r} ({type(exc).__name__}: {exc})"
            ) from exc
        size_of = getattr(self._model, "get_sentence_embedding_dimension", None) or getattr(
            self._model, "get_embedding_dimension", None
        )
        dimensions = size_of() if size_of else None
        if not isinstance(dimensions, int) or dimensions < 1:
            raise EmbedderError(f"Embedder {alias!r}: model {model!r} has no fixed dimension")
        self.dimensions = dimensions
        self.model_name = (
            f"sentence-transformers:{model}:d{dimensions}"
            + ("" if self.normalize else ":raw")
            + prefix_tag(self.query_prefix, self.document_prefix)
        )

    def _encode(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        try:
            array = self._model.encode(
                texts,
                batch_size=self.batch_size,
                normalize_embeddings=self.normalize,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
            vectors = [[float(x) for x in row] for row in array]
        except Exception as exc:
            raise EmbedderError(
                f"Embedder {self.alias!r}: encoding failed ({type(exc).__name__})"
            ) from exc
        for vector in vectors:
            if len(vector) != self.dimensions:
                raise EmbedderError(
                    f"Embedder {self.alias!r}: expected {self.dimensions} dimensions, "
                    f"got {len(vector)}"
                )
            if not any(vector) or not all(map(math.isfinite, vector)):
                raise EmbedderError(f"Embedder {self.alias!r}: a vector is zero or not finite")
        return vectors

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        prefix = self.document_prefix
        return self._encode([prefix + text for text in texts])

    def embed_query(self, text: str) -> list[float]:
        return self._encode([self.query_prefix + text])[0]
