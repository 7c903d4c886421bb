"""The WordLlama backend with the weights and tokenizer the installed wheel ships."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from bailing_knowledge.checks import check_settings
from bailing_knowledge.retrieval.embedders import (
    EmbedderError,
    WordLlamaEmbedder,
    get_embedder,
)
from bailing_knowledge.retrieval.embedders import wordllama as backend

from .vectors import dot, norm

pytest.importorskip("wordllama")

WORDLLAMA = "bailing_knowledge.retrieval.embedders.WordLlamaEmbedder"
KNOWLEDGE = Path(__file__).resolve().parents[3] / "example_project" / "demo" / "knowledge"


@pytest.fixture(scope="module")
def embedder() -> WordLlamaEmbedder:
    return WordLlamaEmbedder("wl")


def test_defaults_to_the_bundled_256_dimensions(embedder):
    assert embedder.dimensions == 256
    assert embedder.model_name == "wordllama:l2_supercat:d256"
    [vector] = embedder.embed_documents(["Refunds are paid within five business days."])
    assert len(vector) == 256
    assert norm(vector) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("dimensions", [64, 128])
def test_shorter_vectors_are_the_leading_components(embedder, dimensions):
    short = WordLlamaEmbedder("short", {"DIMENSIONS": dimensions})
    assert short.model_name == f"wordllama:l2_supercat:d{dimensions}"
    text = "When will my parcel arrive?"
    vector = short.embed_query(text)
    assert len(vector) == dimensions
    assert norm(vector) == pytest.approx(1.0, abs=1e-6)
    full = embedder.embed_query(text)
    prefix = full[:dimensions]
    scale = norm(prefix)
    assert vector == pytest.approx([x / scale for x in prefix], abs=1e-5)


@pytest.mark.parametrize("value", [0, 100, 512, "256", 256.0, True, None])
def test_rejects_sizes_the_bundled_weights_do_not_have(value):
    with pytest.raises(ImproperlyConfigured, match=r"\['DIMENSIONS'\] must be one of 64, 128"):
        WordLlamaEmbedder("wl", {"DIMENSIONS": value})


def test_rejects_unknown_options():
    with pytest.raises(ImproperlyConfigured, match="unknown option"):
        WordLlamaEmbedder("wl", {"MODEL": "l3_supercat"})


def test_finds_the_paraphrase_without_a_shared_word(embedder):
    """The reason to ship it: no word of these queries occurs in the right document."""
    names = ["refunds", "shipping", "warranty"]
    documents = embedder.embed_documents([(KNOWLEDGE / f"{n}.md").read_text() for n in names])
    for query, expected in [
        ("money back", "refunds"),
        ("when will my parcel arrive", "shipping"),
        ("the product broke, is it covered", "warranty"),
    ]:
        vector = embedder.embed_query(query)
        scores = {name: dot(vector, doc) for name, doc in zip(names, documents, strict=True)}
        assert max(scores, key=scores.__getitem__) == expected, (query, scores)


def test_batches_embed_like_single_texts(embedder):
    """Padding a batch to its longest text must not move the shorter texts' vectors."""
    texts = ["a", "money back", "Refunds are paid to the original payment method " * 20]
    batched = WordLlamaEmbedder("wl", {"BATCH_SIZE": 2}).embed_documents(texts)
    for text, vector in zip(texts, batched, strict=True):
        assert vector == pytest.approx(embedder.embed_query(text), abs=1e-6)


@hypothesis_settings(max_examples=50, deadline=None)
@given(st.text(max_size=200))
def test_every_text_gets_a_unit_vector(text):
    vector = WordLlamaEmbedder("wl").embed_query(text)
    assert len(vector) == 256
    assert norm(vector) == pytest.approx(1.0, abs=1e-5)


def test_a_text_without_tokens_gets_a_fixed_unit_vector(embedder):
    assert embedder.embed_query("") == embedder.embed_documents([""])[0]
    assert norm(embedder.embed_query("")) == 1.0
    assert embedder.embed_documents([]) == []


def test_the_model_loads_once_per_process_and_threads_share_it(monkeypatch):
    monkeypatch.setattr(backend, "_models", {})
    loaded = []
    threads = [
        threading.Thread(target=lambda: loaded.append(backend.load_model(128))) for _ in range(6)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(loaded) == 6
    assert len({id(model) for model in loaded}) == 1
    assert backend.load_model(128) is loaded[0]


def test_loading_needs_no_network(monkeypatch):
    """The weights and the tokenizer come from the wheel; any connection attempt fails here."""

    def refuse(*args, **kwargs):
        raise OSError("network disabled in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(backend, "_models", {})
    vector = WordLlamaEmbedder("wl").embed_query("money back")
    assert norm(vector) == pytest.approx(1.0, abs=1e-6)


def test_importing_the_package_leaves_the_hosts_logging_alone():
    code = (
        "import logging\n"
        "from bailing_knowledge.retrieval.embedders import wordllama\n"
        "wordllama.load_model(256)\n"
        "root = logging.getLogger()\n"
        "print(len(root.handlers), root.level)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.split() == ["0", str(30)]  # no handler, WARNING as Python starts


def test_a_failing_model_is_an_embedder_error(monkeypatch):
    def broken(dimensions):
        raise FileNotFoundError("weights file not found")

    monkeypatch.setattr(backend, "load_model", broken)
    with pytest.raises(EmbedderError, match=r"'wl'.*FileNotFoundError"):
        WordLlamaEmbedder("wl").embed_query("money back")


def test_a_missing_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "wordllama", None)  # import fails
    assert WordLlamaEmbedder.missing_requirement() == "pip install 'bailing-knowledge[wordllama]'"
    with pytest.raises(ImproperlyConfigured, match=r"bailing-knowledge\[wordllama\]"):
        WordLlamaEmbedder("wl")


def test_the_system_check_reports_a_missing_package_at_start_up(settings, monkeypatch):
    settings.BAILING_KNOWLEDGE = {"EMBEDDERS": {"default": {"BACKEND": WORDLLAMA}}}
    assert check_settings() == []
    monkeypatch.setitem(sys.modules, "wordllama", None)
    [error] = check_settings()
    assert isinstance(error, checks.Error)
    assert error.id == "bailing_knowledge.E008"
    assert "'default'" in error.msg
    assert "WordLlamaEmbedder" in error.msg
    assert error.hint == "pip install 'bailing-knowledge[wordllama]'"


def test_the_fusion_weight_is_the_backends_unless_configured(settings):
    settings.BAILING_KNOWLEDGE = {
        "EMBEDDERS": {
            "default": {"BACKEND": WORDLLAMA},
            "heavier": {"BACKEND": WORDLLAMA, "FUSION_WEIGHT": 1},
        }
    }
    assert get_embedder("default").fusion_weight == WordLlamaEmbedder.fusion_weight
    assert 0 < WordLlamaEmbedder.fusion_weight < 1
    assert get_embedder("heavier").fusion_weight == 1.0
    assert WordLlamaEmbedder.fusion_weight != 1.0  # the instance's, not the class's
