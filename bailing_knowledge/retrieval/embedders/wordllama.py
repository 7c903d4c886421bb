"""Vectors from WordLlama's static token embeddings (the ``wordllama`` extra).

WordLlama averages trained token embeddings: no neural network runs at query time, so a
query embeds in tens of microseconds on one core, and the weights (16 MB) and tokenizer ship
inside the ``wordllama`` wheel, so nothing is downloaded at run time.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from .base import BaseEmbedder, EmbedderError

__all__ = ["WordLlamaEmbedder"]

#: The model the wheel bundles, and the size of its bundled weights.
CONFIG = "l2_supercat"
BUNDLED_DIMENSIONS = 256
#: Sizes the bundled weights can be cut to (the model was trained for these prefixes).
DIMENSIONS = (64, 128, 256)

_models: dict[int, Any] = {}
_models_lock = threading.Lock()


def _import_wordllama() -> Any:
    """Import ``wordllama`` without letting it configure the host's logging.

    Its inference module calls ``logging.basicConfig(level=INFO)`` at import time, which would
    add a handler to the root logger and print every INFO record of the host project.
    """
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        import wordllama
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    return wordllama


def load_model(dimensions: int) -> Any:
    """The bundled model cut to `dimensions`, loaded once per process and shared by threads.

    ``WordLlama.load()`` without arguments looks for the tokenizer in a folder the wheel does
    not have and would download it; pointing its cache at the package's own folder and
    forbidding downloads finds the bundled files.
    """
    model = _models.get(dimensions)
    if model is not None:
        return model
    with _models_lock:
        model = _models.get(dimensions)
        if model is None:
            wordllama = _import_wordllama()
            model = wordllama.WordLlama.load(
                CONFIG,
                cache_dir=Path(wordllama.__file__).parent,
                dim=BUNDLED_DIMENSIONS,
                trunc_dim=None if dimensions == BUNDLED_DIMENSIONS else dimensions,
                disable_download=True,
            )
            _models[dimensions] = model
    return model


class WordLlamaEmbedder(BaseEmbedder):
    """Semantic vectors that need no network, no GPU and no model download.

    Each token of the text (Llama 2's vocabulary) has a trained vector; a text's vector is the
    mean of its tokens', scaled to unit length. Word order is ignored, and so is context: it
    knows that "refund" and "money back" are close, not who gets the money. On NFCorpus its
    vector leg reaches nDCG@10 0.25 against 0.17 for the hashing embedder (docs/embedders.md).
    Trained on English; other languages get little more than shared word pieces.

    Options: ``DIMENSIONS`` (64, 128 or 256, the default: the bundled weights cut to their
    first N components, smaller and a little worse), ``BATCH_SIZE`` (default 64 texts).

    The model loads on the first text to embed, once per process (`load_model`). Without the
    ``wordllama`` package the constructor raises ``ImproperlyConfigured`` naming the extra,
    which the system checks report at start-up; a load or encoding failure is `EmbedderError`.
    """

    option_names = frozenset({"DIMENSIONS", "BATCH_SIZE"})
    requires = ("wordllama", "wordllama")
    # Measured with the BM25 lexical leg (docs/embedders.md): on NFCorpus (English) hybrid
    # nDCG@10 rises from 0.335 at 0.05 to 0.338 at 0.35-0.5, but on CMRC 2018 (Chinese, where
    # this English model is weak and BM25 near perfect) anything above 0.05 falls below
    # lexical alone (0.1: -0.001, 0.35: -0.025). At 0.05 it breaks ties and ranks what no
    # query word matches; English-only deployments may raise FUSION_WEIGHT to 0.35.
    fusion_weight = 0.05

    def __init__(self, alias: str = "default", options: Mapping[str, Any] | None = None) -> None:
        super().__init__(alias, options)
        dimensions = self.options.get("DIMENSIONS", BUNDLED_DIMENSIONS)
        if type(dimensions) is not int or dimensions not in DIMENSIONS:
            raise ImproperlyConfigured(
                f"{self._where('DIMENSIONS')} must be one of {', '.join(map(str, DIMENSIONS))}."
            )
        self.dimensions = int(dimensions)
        self.batch_size = self._int_option("BATCH_SIZE", 64, 1, 4096)
        missing = self.missing_requirement()
        if missing:
            raise ImproperlyConfigured(
                f"{self._where()}: WordLlamaEmbedder needs the wordllama package: {missing}."
            )
        self.model_name = f"wordllama:{CONFIG}:d{self.dimensions}"
        # The vector of a text without tokens (empty): fixed, unit length, never zero.
        self._empty_vector = [1.0] + [0.0] * (self.dimensions - 1)

    def _encode(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        try:
            import numpy

            model = load_model(self.dimensions)
            array = model.embed(texts, norm=False, batch_size=self.batch_size)
            norms = numpy.linalg.norm(array, axis=1)
            vectors = (array / numpy.where(norms > 0, norms, 1.0)[:, None]).tolist()
        except Exception as exc:
            raise EmbedderError(
                f"Embedder {self.alias!r}: WordLlama failed ({type(exc).__name__}: {exc})"
            ) from exc
        for index, norm in enumerate(norms.tolist()):
            if not norm:
                vectors[index] = self._empty_vector.copy()
            elif not math.isfinite(norm):
                raise EmbedderError(f"Embedder {self.alias!r}: a vector is not finite")
        return vectors

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        return self._encode(list(texts))

    def embed_query(self, text: str) -> list[float]:
        return self._encode([text])[0]
