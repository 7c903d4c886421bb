"""Embedders: the hashing default, the OpenAI-compatible client against a real local HTTP
server, the sentence-transformers backend's guard rails, and the per-alias registry.

No database is needed; the HTTP tests run a `ThreadingHTTPServer` on 127.0.0.1 inside the test.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from hypothesis import given
from hypothesis import strategies as st

from bailing_knowledge.constants import INDEXED_EMBEDDING_DIMENSIONS
from bailing_knowledge.retrieval import embedders
from bailing_knowledge.retrieval.embedders import (
    BaseEmbedder,
    EmbedderError,
    HashingEmbedder,
    OpenAIEmbedder,
    SentenceTransformerEmbedder,
    get_embedder,
)

ROOT = Path(__file__).resolve().parents[2]
HASHING = "bailing_knowledge.retrieval.embedders.HashingEmbedder"
OPENAI = "bailing_knowledge.retrieval.embedders.OpenAIEmbedder"
SECRET = "sk-test-0123456789abcdefSECRET"


def dot(a: list[float], b: list[float]) -> float:
    return math.fsum(x * y for x, y in zip(a, b, strict=True))


def norm(vector: list[float]) -> float:
    return math.sqrt(dot(vector, vector))


# --- HashingEmbedder -------------------------------------------------------------------------


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


# --- OpenAIEmbedder against a real HTTP server ------------------------------------------------


def fake_vector(text: str, dimensions: int) -> list[float]:
    """What the test server answers for `text`: distinct per text, never zero."""
    source = (text or "?") * dimensions
    return [float(ord(char) % 7 + 1) for char in source[:dimensions]]


def unit(vector: list[float]) -> list[float]:
    length = norm(vector)
    return [x / length for x in vector]


def assert_vectors(actual: list[list[float]], expected: list[list[float]]) -> None:
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        assert got == pytest.approx(want, rel=1e-12, abs=1e-15)


class EmbeddingServer:
    """State shared with the handler: what was asked, and what to do with the next requests."""

    default_dimensions = 6

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.plan: list[Any] = []
        self.httpd: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        assert self.httpd is not None
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def next_step(self, request: dict[str, Any]) -> Any:
        with self.lock:
            self.requests.append(request)
            return self.plan.pop(0) if self.plan else "ok"


class EmbeddingHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Any

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def send_body(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        state: EmbeddingServer = self.server.state
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        headers = {name.lower(): value for name, value in self.headers.items()}
        body = json.loads(raw)
        step = state.next_step({"path": self.path, "headers": headers, "body": body})
        inputs = body["input"]
        dimensions = body.get("dimensions") or state.default_dimensions
        try:
            if isinstance(step, tuple) and step[0] == "sleep":
                time.sleep(step[1])
                step = "ok"
            if step == "ok":
                data = [
                    {"object": "embedding", "index": i, "embedding": fake_vector(text, dimensions)}
                    for i, text in enumerate(inputs)
                ]
                data.reverse()  # the client must sort by index
                payload = {"object": "list", "data": data, "model": body["model"]}
                self.send_body(200, json.dumps(payload).encode())
            elif step[0] == "status":
                _, status, extra = step
                # Like some real servers, echo what was sent: the key must still not leak.
                message = f"failure {status}; you sent {headers.get('authorization', 'no key')}"
                payload = {"error": {"message": message, "type": "test"}}
                self.send_body(status, json.dumps(payload).encode(), extra)
            elif step[0] == "length":
                data = [{"index": i, "embedding": [1.0] * step[1]} for i, _ in enumerate(inputs)]
                self.send_body(200, json.dumps({"data": data}).encode())
            elif step[0] == "error":
                _, status, message = step
                message = message.replace("KEY", headers.get("authorization", ""))
                self.send_body(status, json.dumps({"error": {"message": message}}).encode())
            elif step[0] == "raw":
                self.send_body(step[1], step[2])
            elif step[0] == "payload":
                self.send_body(200, json.dumps(step[1]).encode())
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout tests)


@pytest.fixture
def server():
    state = EmbeddingServer()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), EmbeddingHandler)
    httpd.daemon_threads = True
    httpd.state = state  # type: ignore[attr-defined]
    state.httpd = httpd
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield state
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def sleeps():
    return []


@pytest.fixture
def remote(server, sleeps):
    """Build OpenAIEmbedders that talk to the test server and record their back-off sleeps."""
    built: list[OpenAIEmbedder] = []

    def build(**options: Any) -> OpenAIEmbedder:
        options = {"BASE_URL": server.base_url, "MODEL": "test-model", **options}
        embedder = OpenAIEmbedder("remote", options, sleep=sleeps.append)
        built.append(embedder)
        return embedder

    yield build
    for embedder in built:
        embedder.close()


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


# --- SentenceTransformerEmbedder --------------------------------------------------------------


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


# --- get_embedder ------------------------------------------------------------------------------


def embedders_setting(**entries: dict[str, Any]) -> dict[str, Any]:
    return {"EMBEDDERS": entries}


def test_get_embedder_builds_the_default_once(settings):
    settings.BAILING_KNOWLEDGE = {}
    embedder = get_embedder()
    assert isinstance(embedder, HashingEmbedder)
    assert embedder.alias == "default"
    assert get_embedder("default") is embedder


def test_get_embedder_rebuilds_when_the_setting_changes(settings):
    settings.BAILING_KNOWLEDGE = embedders_setting(default={"BACKEND": HASHING})
    before = get_embedder("default")
    settings.BAILING_KNOWLEDGE = embedders_setting(
        default={"BACKEND": HASHING, "OPTIONS": {"DIMENSIONS": 64}},
        other={"BACKEND": HASHING},
    )
    after = get_embedder("default")
    assert after is not before
    assert after.dimensions == 64
    assert get_embedder("other").dimensions == 384


def test_get_embedder_closes_dropped_instances(settings, server):
    settings.BAILING_KNOWLEDGE = embedders_setting(
        remote={"BACKEND": OPENAI, "OPTIONS": {"BASE_URL": server.base_url, "MODEL": "m"}}
    )
    remote = get_embedder("remote")
    assert isinstance(remote, OpenAIEmbedder)
    assert remote.embed_query("q")
    settings.BAILING_KNOWLEDGE = {}
    assert remote._client.is_closed


def test_get_embedder_names_an_unknown_alias(settings):
    settings.BAILING_KNOWLEDGE = embedders_setting(default={"BACKEND": HASHING})
    with pytest.raises(ImproperlyConfigured, match=r"Unknown embedder 'nope'.*'default'"):
        get_embedder("nope")


class NotAnEmbedder:
    pass


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"BACKEND": "no.such.Module"}, "cannot import"),
        ({"BACKEND": f"{__name__}.NotAnEmbedder"}, "BaseEmbedder subclass"),
        ({"OPTIONS": {}}, "'BACKEND' dotted path"),
        ({"BACKEND": HASHING, "OPTION": {}}, "unknown key"),
        ({"BACKEND": HASHING, "OPTIONS": ["DIMENSIONS"]}, "must be a dict"),
        ({"BACKEND": HASHING, "OPTIONS": {"DIMENSIONS": "x"}}, "DIMENSIONS"),
    ],
)
def test_get_embedder_rejects_bad_entries(settings, entry, message):
    settings.BAILING_KNOWLEDGE = embedders_setting(broken=entry)
    with pytest.raises(ImproperlyConfigured, match=message):
        get_embedder("broken")


def test_get_embedder_rejects_a_non_dict_setting(settings):
    settings.BAILING_KNOWLEDGE = {"EMBEDDERS": ["default"]}
    with pytest.raises(ImproperlyConfigured, match="must be a dict"):
        get_embedder("default")


def test_custom_backends_subclass_base_embedder():
    class Constant(BaseEmbedder):
        dimensions = 2
        model_name = "constant-v1"

        def embed_documents(self, texts):
            return [[1.0, 0.0] for _ in texts]

    embedder = Constant("c")
    assert embedder.embed_query("x") == [1.0, 0.0]
    assert "constant-v1" in repr(embedder)


def test_registry_is_thread_safe(settings):
    settings.BAILING_KNOWLEDGE = embedders_setting(default={"BACKEND": HASHING})
    results: list[BaseEmbedder] = []
    threads = [threading.Thread(target=lambda: results.append(get_embedder())) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(embedder) for embedder in results}) == 1
    assert embedders._embedders["default"] is results[0]
