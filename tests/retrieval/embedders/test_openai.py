"""The OpenAI-compatible client against a real local HTTP server (conftest.py)."""

from __future__ import annotations

import math
import socket
import time

import pytest
from django.core.exceptions import ImproperlyConfigured

from bailing_knowledge.retrieval.embedders import (
    EmbedderError,
    OpenAIEmbedder,
)

from .vectors import assert_vectors, fake_vector, norm, unit

SECRET = "sk-test-0123456789abcdefSECRET"


def test_openai_posts_to_the_embeddings_endpoint_and_sorts_by_index(remote, server):
    embedder = remote(DIMENSIONS=6)
    texts = ["alpha", "beta", "gamma"]
    vectors = embedder.embed_documents(texts)
    assert_vectors(vectors, [unit(fake_vector(text, 6)) for text in texts])
    [request] = server.requests
    assert request["path"] == "/v1/embeddings"
    assert request["body"] == {"model": "test-model", "input": texts, "dimensions": 6}
    assert request["headers"]["content-type"] == "application/json"


def test_openai_vectors_are_renormalised(remote):
    vector = remote().embed_query("anything")
    assert math.isclose(norm(vector), 1.0)


@pytest.mark.parametrize(
    ("count", "batch", "sizes"), [(10, 4, [4, 4, 2]), (3, 64, [3]), (0, 4, [])]
)
def test_openai_sends_texts_in_batches(remote, server, count, batch, sizes):
    texts = [f"text number {i}" for i in range(count)]
    vectors = remote(BATCH_SIZE=batch).embed_documents(texts)
    assert [len(request["body"]["input"]) for request in server.requests] == sizes
    assert len(server.requests) == math.ceil(count / batch)
    assert_vectors(vectors, [unit(fake_vector(text, server.default_dimensions)) for text in texts])


def test_openai_sends_the_api_key_from_the_named_environment_variable(remote, server, monkeypatch):
    monkeypatch.setenv("BK_TEST_EMBEDDINGS_KEY", SECRET)
    remote(API_KEY_ENV="BK_TEST_EMBEDDINGS_KEY").embed_query("q")
    assert server.requests[-1]["headers"]["authorization"] == f"Bearer {SECRET}"


def test_openai_sends_no_authorization_without_a_key(remote, server, monkeypatch):
    monkeypatch.delenv("BK_TEST_EMBEDDINGS_KEY", raising=False)
    remote().embed_query("q")
    remote(API_KEY_ENV="BK_TEST_EMBEDDINGS_KEY").embed_query("q")
    assert all("authorization" not in request["headers"] for request in server.requests)


def test_openai_reads_the_key_on_each_request(remote, server, monkeypatch):
    embedder = remote(API_KEY_ENV="BK_TEST_EMBEDDINGS_KEY")
    monkeypatch.setenv("BK_TEST_EMBEDDINGS_KEY", "first")
    embedder.embed_query("q")
    monkeypatch.setenv("BK_TEST_EMBEDDINGS_KEY", "rotated")
    embedder.embed_query("q")
    assert [r["headers"]["authorization"] for r in server.requests] == [
        "Bearer first",
        "Bearer rotated",
    ]


def test_openai_sends_dimensions_only_when_configured(remote, server):
    assert len(remote(DIMENSIONS=8).embed_query("q")) == 8
    assert server.requests[-1]["body"]["dimensions"] == 8
    remote().embed_query("q")
    assert "dimensions" not in server.requests[-1]["body"]
    server.default_dimensions = 8
    assert len(remote(DIMENSIONS=8, SEND_DIMENSIONS=False).embed_query("q")) == 8
    assert "dimensions" not in server.requests[-1]["body"]


def test_openai_learns_the_dimension_when_not_configured(remote, server):
    embedder = remote()
    assert embedder.model_name == "openai:test-model"
    assert embedder.dimensions == server.default_dimensions  # asks the server once
    assert embedder.dimensions == server.default_dimensions
    assert len(server.requests) == 1
    server.plan = [("length", 9)]
    with pytest.raises(EmbedderError, match="expected 6 dimensions, got 9"):
        embedder.embed_query("q")


def test_openai_rejects_vectors_of_the_wrong_dimension(remote, server):
    server.plan = [("length", 4)]
    with pytest.raises(EmbedderError, match="expected 8 dimensions, got 4"):
        remote(DIMENSIONS=8).embed_query("q")


def test_openai_retries_a_503_then_succeeds(remote, server, sleeps):
    server.plan = [("status", 503, {})]
    vector = remote().embed_query("q")
    assert_vectors([vector], [unit(fake_vector("q", server.default_dimensions))])
    assert len(server.requests) == 2
    [delay] = sleeps
    assert 0.25 <= delay <= 0.5  # backoff_base, with jitter


def test_openai_backs_off_exponentially(remote, server, sleeps):
    server.plan = [("status", 500, {}), ("status", 502, {}), ("status", 504, {})]
    remote(MAX_RETRIES=3).embed_query("q")
    assert len(server.requests) == 4
    for attempt, delay in enumerate(sleeps):
        ceiling = OpenAIEmbedder.backoff_base * 2**attempt
        assert ceiling / 2 <= delay <= ceiling


def test_openai_honours_retry_after_up_to_a_cap(remote, server, sleeps):
    server.plan = [
        ("status", 429, {"Retry-After": "2"}),
        ("status", 429, {"Retry-After": "100000"}),
    ]
    remote().embed_query("q")
    assert sleeps == [2.0, OpenAIEmbedder.retry_after_max]


def test_openai_gives_up_after_max_retries(remote, server, sleeps):
    server.plan = [("status", 503, {})] * 5
    with pytest.raises(EmbedderError, match=r"HTTP 503.*gave up after 3 attempts"):
        remote(MAX_RETRIES=2).embed_query("q")
    assert len(server.requests) == 3
    assert len(sleeps) == 2


def test_openai_does_not_retry_a_client_error(remote, server, sleeps):
    server.plan = [("status", 400, {})]
    with pytest.raises(EmbedderError, match="HTTP 400: failure 400") as caught:
        remote().embed_query("q")
    assert len(server.requests) == 1
    assert sleeps == []
    assert "'remote'" in str(caught.value)
    assert server.base_url in str(caught.value)


@pytest.mark.parametrize("status", [400, 401, 429, 503])
def test_openai_errors_never_contain_the_api_key(remote, server, monkeypatch, status):
    monkeypatch.setenv("BK_TEST_EMBEDDINGS_KEY", SECRET)
    server.plan = [("status", status, {})] * 2
    with pytest.raises(EmbedderError) as caught:
        remote(API_KEY_ENV="BK_TEST_EMBEDDINGS_KEY", MAX_RETRIES=1).embed_query("q")
    assert f"Bearer {SECRET}" in server.requests[0]["headers"]["authorization"]
    for text in (str(caught.value), repr(caught.value)):
        assert SECRET not in text
        assert SECRET[3:15] not in text
    assert f"HTTP {status}" in str(caught.value)


@pytest.mark.parametrize("padding", [0, 150, 190, 198])
def test_openai_redacts_a_key_echoed_anywhere_in_a_long_error(remote, server, monkeypatch, padding):
    monkeypatch.setenv("BK_TEST_EMBEDDINGS_KEY", SECRET)
    server.plan = [("error", 400, "x" * padding + " KEY is not allowed")]
    with pytest.raises(EmbedderError, match=r"HTTP 400: ") as caught:
        remote(API_KEY_ENV="BK_TEST_EMBEDDINGS_KEY").embed_query("q")
    message = str(caught.value)
    assert SECRET[:6] not in message
    assert SECRET[-6:] not in message


def test_openai_explains_an_auth_failure_without_a_key(remote, server, monkeypatch):
    monkeypatch.delenv("BK_TEST_EMBEDDINGS_KEY", raising=False)
    server.plan = [("status", 401, {})]
    with pytest.raises(
        EmbedderError, match=r"no API key was sent \(is BK_TEST_EMBEDDINGS_KEY set\?\)"
    ):
        remote(API_KEY_ENV="BK_TEST_EMBEDDINGS_KEY").embed_query("q")


def test_openai_honours_the_timeout(remote, server, sleeps):
    server.plan = [("sleep", 3.0)]
    embedder = remote(TIMEOUT=0.2, MAX_RETRIES=0)
    started = time.monotonic()
    with pytest.raises(EmbedderError, match=r"timed out after 0\.2 s"):
        embedder.embed_query("q")
    assert time.monotonic() - started < 1.5


def test_openai_retries_a_timeout(remote, server, sleeps):
    server.plan = [("sleep", 3.0)]
    assert remote(TIMEOUT=0.2, MAX_RETRIES=1).embed_query("q")
    assert len(server.requests) == 2
    assert len(sleeps) == 1


def test_openai_reports_a_refused_connection(sleeps):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    embedder = OpenAIEmbedder(
        "down",
        {"BASE_URL": f"http://127.0.0.1:{port}/v1", "MODEL": "m", "MAX_RETRIES": 1},
        sleep=sleeps.append,
    )
    with pytest.raises(EmbedderError, match=r"connection failed.*gave up after 2 attempts"):
        embedder.embed_query("q")
    assert len(sleeps) == 1
    embedder.close()


@pytest.mark.parametrize(
    ("step", "message"),
    [
        (("raw", 200, b"<html>oops</html>"), "not JSON"),
        (("payload", {"data": []}), "expected 1 embeddings, got 0"),
        (("payload", {"result": "?"}), "expected 1 embeddings, got no"),
        (("payload", {"data": [{"embedding": [1.0]}]}), "index"),
        (("payload", {"data": [{"index": 5, "embedding": [1.0]}]}), "indices"),
        (("payload", {"data": [{"index": 0, "embedding": "AAAA"}]}), "list of numbers"),
        (("payload", {"data": [{"index": 0, "embedding": [0.0, 0.0]}]}), "zero"),
        (("payload", {"data": [{"index": 0, "embedding": []}]}), "dimensions"),
    ],
)
def test_openai_rejects_malformed_answers(remote, server, step, message):
    server.plan = [step]
    with pytest.raises(EmbedderError, match=message):
        remote().embed_query("q")


def test_openai_prefixes_and_empty_texts(remote, server):
    embedder = remote(QUERY_PREFIX="search_query: ", DOCUMENT_PREFIX="search_document: ")
    embedder.embed_query("tea")
    embedder.embed_documents(["green tea"])
    assert [r["body"]["input"] for r in server.requests] == [
        ["search_query: tea"],
        ["search_document: green tea"],
    ]
    assert embedder.model_name.startswith("openai:test-model:p")
    remote().embed_documents([""])
    assert server.requests[-1]["body"]["input"] == [" "]  # OpenAI rejects empty strings


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "'MODEL'] is required"),
        ({"MODEL": "m", "BASE_URL": "ftp://example.com"}, "http"),
        ({"MODEL": "m", "BATCH_SIZE": 0}, "BATCH_SIZE"),
        ({"MODEL": "m", "TIMEOUT": "30"}, "TIMEOUT"),
        ({"MODEL": "m", "MAX_RETRIES": -1}, "MAX_RETRIES"),
        ({"MODEL": "m", "SEND_DIMENSIONS": True}, "needs"),
        ({"MODEL": "m", "API_KEY": SECRET}, "unknown option"),
    ],
)
def test_openai_rejects_bad_options(options, message):
    with pytest.raises(ImproperlyConfigured, match=message) as caught:
        OpenAIEmbedder("bad", options)
    assert SECRET not in str(caught.value)


def test_openai_model_name_identifies_model_and_dimensions():
    embedder = OpenAIEmbedder("x", {"MODEL": "text-embedding-3-small", "DIMENSIONS": 384})
    assert embedder.model_name == "openai:text-embedding-3-small:d384"
    assert embedder.dimensions == 384
    embedder.close()
