"""A real OpenAI-compatible HTTP server on 127.0.0.1 for the embedder tests."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from bailing_knowledge.retrieval.embedders import OpenAIEmbedder

from .vectors import fake_vector


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
