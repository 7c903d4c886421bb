"""The hashing embedder: the dependency-free default."""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from hypothesis import example, given
from hypothesis import strategies as st

from bailing_knowledge.constants import INDEXED_EMBEDDING_DIMENSIONS
from bailing_knowledge.retrieval.embedders import HashingEmbedder

from .vectors import dot, norm

ROOT = Path(__file__).resolve().parents[3]


def test_hashing_embedder_defaults_to_the_indexed_dimension():
    embedder = HashingEmbedder()
    assert embedder.dimensions == INDEXED_EMBEDDING_DIMENSIONS == 384
    assert embedder.model_name == "hashing-v1-d384"
    assert len(embedder.embed_query("hello world")) == 384


def test_hashing_embedder_honours_the_dimensions_option():
    embedder = HashingEmbedder("small", {"DIMENSIONS": 64})
    assert embedder.dimensions == 64
    assert embedder.model_name == "hashing-v1-d64"
    vectors = embedder.embed_documents(["one text", "another text"])
    assert [len(vector) for vector in vectors] == [64, 64]


@pytest.mark.parametrize("value", [0, -1, 16001, "384", 384.0, True, None])
def test_hashing_embedder_rejects_bad_dimensions(value):
    with pytest.raises(ImproperlyConfigured, match=r"\['OPTIONS'\]\['DIMENSIONS'\]"):
        HashingEmbedder("bad", {"DIMENSIONS": value})


def test_hashing_embedder_rejects_unknown_options():
    with pytest.raises(ImproperlyConfigured, match="DIMENSION"):
        HashingEmbedder("typo", {"DIMENSION": 384})


@given(st.text(max_size=300))
def test_hashing_vectors_have_unit_length(text):
    vector = HashingEmbedder().embed_query(text)
    assert len(vector) == 384
    assert all(math.isfinite(x) for x in vector)
    assert math.isclose(norm(vector), 1.0, rel_tol=1e-9)


def _dense_reference(embedder: HashingEmbedder, text: str) -> list[float]:
    """The vector as its definition computes it, over every bucket: damped counts of the
    + and - slots, their difference, scaled to unit length."""
    dimensions = embedder.dimensions
    slots = [0.0] * (2 * dimensions + 1)
    for slot, count in embedder._slot_counts(text).items():
        slots[slot] += 1.0 + math.log(count)
    vector = [a - b for a, b in zip(slots[:dimensions], slots[dimensions:-1], strict=True)]
    length = math.hypot(*vector)
    return [x * (1.0 / length) for x in vector] if length else embedder.embed_query("")


@given(st.text(max_size=300) | st.text(alphabet="退货政策三十天内可 abc", max_size=80))
@example("refund policy")  # few buckets: computed alone
@example(" ".join(f"word{n}" for n in range(60)))  # a quarter of them or more: all
def test_hashing_vectors_computed_over_touched_buckets_equal_the_definition(text):
    embedder = HashingEmbedder()
    vector = embedder.embed_query(text)
    # Bit for bit: stored vectors were computed over every bucket.
    assert [x.hex() for x in vector] == [x.hex() for x in _dense_reference(embedder, text)]


@pytest.mark.parametrize("text", ["", "   ", "?!… — 😀👍🏽", "\u200b"])
def test_text_without_features_gets_one_fixed_non_zero_unit_vector(text):
    embedder = HashingEmbedder()
    vector = embedder.embed_query(text)
    assert any(vector)
    assert math.isclose(norm(vector), 1.0)
    assert vector == embedder.embed_query("")
    assert vector is not embedder.embed_query("")  # callers may mutate their copy


def test_hashing_embedder_is_deterministic_and_case_insensitive():
    embedder = HashingEmbedder()
    text = "Retrieval-Augmented Generation über Datenbanken"
    assert embedder.embed_query(text) == embedder.embed_query(text)
    assert embedder.embed_query(text) == HashingEmbedder().embed_query(text.upper())
    assert embedder.embed_documents([text, "x"])[0] == embedder.embed_query(text)


def test_hashing_embedder_is_deterministic_across_processes():
    # Python's str hash is salted per process: the child gets another salt on purpose.
    text = "Refund policy: orders can be returned within 30 days. 退货政策：三十天内可退货。"
    code = (
        "import json, sys\n"
        "from bailing_knowledge.retrieval.embedders import HashingEmbedder\n"
        "print(json.dumps(HashingEmbedder().embed_documents([sys.argv[1]])[0]))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    child = subprocess.run(
        [sys.executable, "-c", code, text],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert json.loads(child.stdout) == HashingEmbedder().embed_query(text)


def test_hashing_vectors_are_pinned_to_the_model_version():
    # If this fails, the features changed: bump HashingEmbedder.VERSION (stored vectors of
    # the old version must be recomputed) and update the digest.
    vector = HashingEmbedder().embed_query("The quick brown fox 跳过了懒狗 ก่อน")
    rounded = struct.pack("<384d", *(round(x, 6) for x in vector))
    assert hashlib.sha256(rounded).hexdigest()[:16] == PINNED_DIGEST


PINNED_DIGEST = "c1d181af06921b28"


@pytest.mark.parametrize(
    ("query", "similar", "unrelated"),
    [
        (
            "How do I reset my password?",
            "To reset a forgotten password, open the login page and follow the reset link.",
            "Quarterly revenue grew by twelve percent thanks to strong sales in Europe.",
        ),
        (
            "refund for damaged shipments",
            "Damaged shipment? We refund the order or ship a replacement.",
            "Our office is closed on public holidays and weekends.",
        ),
        (
            "如何重置密码？",
            "忘记密码时，请在登录页面点击重置密码链接。",
            "本季度营业收入同比增长百分之十二。",
        ),
        (
            "東京タワーの営業時間",
            "東京タワーの営業時間は午前9時から午後11時までです。",
            "大阪の天気は明日晴れるでしょう。",
        ),
    ],
)
def test_similar_texts_are_closer_than_unrelated_texts(query, similar, unrelated):
    embedder = HashingEmbedder()
    q = embedder.embed_query(query)
    similar_vector, unrelated_vector = embedder.embed_documents([similar, unrelated])
    assert dot(q, similar_vector) > dot(q, unrelated_vector) + 0.1


def test_inflections_share_features():
    embedder = HashingEmbedder()
    q = embedder.embed_query("indexing")
    assert dot(q, embedder.embed_query("indexes")) > dot(q, embedder.embed_query("banana"))


def test_function_words_do_not_make_texts_similar():
    embedder = HashingEmbedder()
    a = embedder.embed_query("the cat is on the mat and it is in the house")
    b = embedder.embed_query("the tax is on the bill and it is in the mail")
    assert dot(a, b) < 0.2
