"""Real servers for the client tests: the app under `live_server`, and tiny scripted hubs.

The scripted hub is a real HTTP server on 127.0.0.1 that answers each path with a fixed
status, body and delay. It stands in for servers this app is not: one that predates the
protocol (404/405/501), one that is broken (500/503, HTML, an unknown schema), a slow one.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bailing_knowledge import constants, services
from bailing_knowledge.ingestion.documents import upsert_document
from bailing_knowledge.models import Run

ROUTE = "orders"

REFUNDS = (
    "# Refund policy\n\nCustomers may return unused items within thirty days for a full refund. "
    "Refunds are paid to the original payment method within five business days."
)
SHIPPING = (
    "# Shipping\n\nOrders ship from our warehouse within two days. Express shipping costs "
    "extra and arrives the next business day."
)


def manual_body(target_bytes: int, topic: str = "forklift") -> str:
    """A long, varied document (ASCII, accents, CJK, emoji) of about `target_bytes`."""
    parts = [f"# Warehouse {topic} manual\n\n"]
    i = 0
    while len("".join(parts).encode()) < target_bytes:
        i += 1
        parts.append(
            f"## Section {i}: {topic} safety\n\n"
            f"Step {i}. Inspect the {topic} before each shift; report damage to the supervisor. "
            f"Crème brûlée rule {i}: keep aisles clear. 仓库安全第{i}条：保持通道畅通。 👷‍♀️🚜\n\n"
        )
    return "".join(parts)


MANUAL = manual_body(40_000)


@dataclass
class Hub:
    """The app under `live_server`, seeded with one route, one KB and one session."""

    url: str
    route: str
    token: str
    issued: services.IssuedSession
    kb: object
    route_obj: object


@pytest.fixture
def hub(live_server, transactional_db) -> Hub:
    kb = services.create_knowledge_base("handbook", title="Handbook")
    route = services.create_route(ROUTE, name="Order assistant", knowledge_bases=[kb])
    client = services.create_client("acme-agent", routes=[route])
    issued = services.issue_session(client, principal_id="user-1", tenant="acme", routes=[route])
    upsert_document(kb, "refunds.md", "Refund policy", REFUNDS)
    upsert_document(kb, "shipping.md", "Shipping", SHIPPING)
    return Hub(live_server.url, ROUTE, issued.access_token, issued, kb, route)


@pytest.fixture
def manual(hub) -> str:
    """The ~40 KB `MANUAL` in the hub's knowledge base (only where a test reads it)."""
    upsert_document(hub.kb, "manual.md", "Forklift manual", MANUAL)
    return MANUAL


@dataclass
class Answer:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


class ScriptedHub:
    """A real HTTP server answering `(method, path)` with a scripted `Answer`, or with what a
    scripted function of the request body returns."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, str], Answer | Callable[[bytes], Answer]] = {}
        self.requests: list[tuple[str, str, bytes, dict[str, str]]] = []
        self.received = threading.Event()
        self.release = threading.Event()
        self.release.set()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # else every answer waits for a delayed ACK

            def _answer(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                hub.requests.append((method, self.path, body, dict(self.headers)))
                answer = hub.answers.get((method, self.path)) or Answer(
                    404, b"<html><body>Not Found</body></html>", {"Content-Type": "text/html"}
                )
                if callable(answer):
                    answer = answer(body)
                hub.received.set()
                if answer.delay:
                    hub.release.wait(answer.delay)
                self.send_response(answer.status)
                headers = {"Content-Type": "application/json", **answer.headers}
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def path(self, action: str, route: str = ROUTE) -> str:
        return f"/agent-api/v1/workspaces/{route}/knowledge/{action}"

    def answer(
        self,
        method: str,
        action: str,
        answer: Answer | Callable[[bytes], Answer],
        route: str = ROUTE,
    ) -> None:
        self.answers[(method, self.path(action, route))] = answer

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted():
    hub = ScriptedHub()
    yield hub
    hub.close()


def capabilities_body(**changes) -> dict:
    body = {
        "schema_version": constants.SCHEMA_CAPABILITIES,
        "protocol": constants.PROTOCOL,
        "supported": True,
        "route": ROUTE,
        "enabled": True,
        "knowledge_scope_revision": "ksr_00000000000000000000000000000000",
        "delivery_modes": ["inline", "on_demand"],
        "limits": dict(constants.LIMITS),
    }
    body.update(changes)
    return body


def search_body(*hints: dict, **changes) -> dict:
    body = {
        "schema_version": constants.SCHEMA_SEARCH,
        "route": ROUTE,
        "knowledge_scope_revision": "ksr_00000000000000000000000000000000",
        "status": "ok",
        "trust": "reference_only",
        "hints": list(hints),
        "truncated": False,
    }
    body.update(changes)
    return body


def hint(ref: str = "ref-1", title: str = "Doc", summary: str = "text") -> dict:
    return {
        "ref": ref,
        "title": title,
        "summary": summary,
        "revision": 1,
        "score": 0.5,
        "expires_at": "2030-01-01T00:00:00Z",
    }


def read_body(ref: str = "ref-1", content: str = "text", **changes) -> dict:
    body = {
        "schema_version": constants.SCHEMA_READ,
        "route": ROUTE,
        "knowledge_scope_revision": "ksr_00000000000000000000000000000000",
        "ref": ref,
        "revision": 1,
        "title": "Doc",
        "content": content,
        "trust": "reference_only",
        "next_cursor": None,
        "truncated": False,
        "budget_exhausted": False,
        "total_content_bytes": len(content.encode()),
        "read_chain_max_bytes": constants.READ_CHAIN_MAX_BYTES,
    }
    body.update(changes)
    return body


def as_json(body: object) -> bytes:
    return json.dumps(body).encode()


class DripHub:
    """A hostile hub that answers every request a byte at a time, every `interval` seconds:
    each read gets its byte well within any per-read timeout, so only a total deadline ends
    the call. `drip_from` is where the dripping starts in the answer (0: the status line)."""

    def __init__(self, answer: bytes, drip_from: int, interval: float = 0.1) -> None:
        self.answer, self.drip_from, self.interval = answer, drip_from, interval
        self.stop = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                request += chunk
            try:
                conn.sendall(self.answer[: self.drip_from])
                for byte in self.answer[self.drip_from :]:
                    if self.stop.wait(self.interval):
                        return
                    conn.sendall(bytes([byte]))
            except OSError:
                return

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def drip_answer(body: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def ready_run(hub: Hub) -> Run:
    """A run of the hub's session on its route, its context ready: run-bound refs need one."""
    return Run.objects.create(
        session=hub.issued.session,
        client=hub.issued.session.client,
        route=hub.route_obj,
        client_conversation_id="c",
        client_turn_id="t",
        user_message_id="m",
        request_hash="h",
        state=Run.State.CONTEXT_READY,
    )
