"""The sentence-transformers backend's guard rails, and a real model where installed."""

from __future__ import annotations

import math
import os
import sys
import types
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from bailing_knowledge.retrieval.embedders import (
    EmbedderError,
    SentenceTransformerEmbedder,
)

from .vectors import dot, norm


def test_sentence_transformers_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # import fails
    with pytest.raises(ImproperlyConfigured, match="pip install"):
        SentenceTransformerEmbedder("local", {"MODEL": "all-MiniLM-L6-v2"})


def test_sentence_transformers_requires_a_model():
    with pytest.raises(ImproperlyConfigured, match="'MODEL'] is required"):
        SentenceTransformerEmbedder("local", {})


class StandInModel:
    """The two methods of `SentenceTransformer` the backend uses, for a stand-in module."""

    calls: list[dict[str, Any]] = []

    def __init__(self, name: str, device: str | None = None) -> None:
        if name == "missing":
            raise OSError("no such model")
        self.name = name

    def get_sentence_embedding_dimension(self) -> int:
        return 3

    def encode(self, texts: list[str], **kwargs: Any) -> list[list[float]]:
        self.calls.append({"texts": texts, **kwargs})
        return [[3.0, 4.0, 0.0] if text.endswith("ok") else [0.0, 0.0, 0.0] for text in texts]


@pytest.fixture
def stand_in_sentence_transformers(monkeypatch):
    module = types.ModuleType("sentence_transformers")
    module.SentenceTransformer = StandInModel  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sentence_transformers", module)
    StandInModel.calls = []
    return StandInModel


def test_sentence_transformers_backend_passes_options(stand_in_sentence_transformers):
    embedder = SentenceTransformerEmbedder(
        "local", {"MODEL": "tiny", "BATCH_SIZE": 7, "QUERY_PREFIX": "query: "}
    )
    assert embedder.dimensions == 3
    assert embedder.model_name.startswith("sentence-transformers:tiny:d3:p")
    assert embedder.embed_query("ok") == [3.0, 4.0, 0.0]
    assert embedder.embed_documents([]) == []
    [call] = stand_in_sentence_transformers.calls
    assert call["texts"] == ["query: ok"]
    assert call["batch_size"] == 7
    assert call["normalize_embeddings"] is True


def test_sentence_transformers_failures_are_embedder_errors(stand_in_sentence_transformers):
    with pytest.raises(EmbedderError, match="cannot load model 'missing'"):
        SentenceTransformerEmbedder("local", {"MODEL": "missing"})
    embedder = SentenceTransformerEmbedder("local", {"MODEL": "tiny"})
    with pytest.raises(EmbedderError, match="zero"):
        embedder.embed_documents(["ok", "bad"])


def test_sentence_transformers_real_model():
    pytest.importorskip("sentence_transformers")
    try:
        embedder = SentenceTransformerEmbedder(
            "local", {"MODEL": os.environ.get("BK_TEST_ST_MODEL", "all-MiniLM-L6-v2")}
        )
    except EmbedderError as exc:  # no network and no local copy
        pytest.skip(str(exc))
    q = embedder.embed_query("How do I reset my password?")
    similar, unrelated = embedder.embed_documents(
        ["Click 'forgot password' to set a new one.", "The weather is sunny today."]
    )
    assert math.isclose(norm(q), 1.0, rel_tol=1e-5)
    assert dot(q, similar) > dot(q, unrelated)


def test_the_system_check_names_the_extra(settings, monkeypatch):
    from bailing_knowledge.checks import check_settings

    backend = "bailing_knowledge.retrieval.embedders.SentenceTransformerEmbedder"
    settings.BAILING_KNOWLEDGE = {
        "EMBEDDERS": {
            "default": {"BACKEND": "bailing_knowledge.retrieval.embedders.HashingEmbedder"},
            "local": {"BACKEND": backend, "OPTIONS": {"MODEL": "all-MiniLM-L6-v2"}},
        }
    }
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # not installed
    [error] = check_settings()
    assert error.id == "bailing_knowledge.E008"
    assert "'local'" in error.msg
    assert error.hint == "pip install 'bailing-knowledge[sentence-transformers]'"
