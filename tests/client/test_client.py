"""The sync and async clients against the app served on a real socket (`live_server`)."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import pytest

from bailing_knowledge import services
from bailing_knowledge.client import (
    AsyncKnowledgeClient,
    InvalidRequest,
    KnowledgeChanged,
    KnowledgeClient,
    ProtocolError,
    RateLimited,
    ReferenceInvalid,
    ReferenceRejected,
    RouteNotAllowed,
    RunNotCurrent,
    ScopeChanged,
    Unauthorized,
    Unreachable,
)
from bailing_knowledge.client.tools import dumps_result, execute_tool_call
from bailing_knowledge.ingestion.documents import upsert_document
from bailing_knowledge.models import Document, Run

from .conftest import (
    MANUAL,
    REFUNDS,
    Answer,
    DripHub,
    as_json,
    capabilities_body,
    drip_answer,
    hint,
    manual_body,
    read_body,
    ready_run,
    search_body,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def client(hub):
    with KnowledgeClient(hub.url, hub.route, hub.token, timeout=20) as client:
        yield client


def test_capabilities(client, hub):
    capabilities = client.capabilities()
    assert capabilities.protocol == "bailing.agent-knowledge.v1"
    assert (capabilities.route, capabilities.supported, capabilities.enabled) == (
        "orders",
        True,
        True,
    )
    assert capabilities.on_demand
    assert capabilities.knowledge_scope_revision == hub.route_obj.knowledge_scope_revision
    assert capabilities.limits.read_chain_max_bytes == 131072
    assert hub.token not in repr(client)


def test_search_then_read_a_page(client):
    result = client.search("how long do refunds take")
    assert (result.status, result.trust, result.route, result.run_id) == (
        "ok",
        "reference_only",
        "orders",
        None,
    )
    assert 1 <= len(result.hints) <= 3
    top = result.hints[0]
    assert top.title == "Refund policy"
    assert top.summary in REFUNDS
    assert top.trust == "reference_only"

    page = client.read(top.ref)
    assert (page.title, page.content, page.trust) == ("Refund policy", REFUNDS, "reference_only")
    assert (page.next_cursor, page.truncated, page.budget_exhausted) == (None, False, False)
    assert page.total_content_bytes == len(REFUNDS.encode())


def test_read_chain_follows_every_cursor(client, manual):
    ref = client.search("forklift safety inspection", limit=1).hints[0].ref
    first = client.read(ref, max_bytes=4096)
    assert first.next_cursor is not None and first.truncated
    assert MANUAL.startswith(first.content)

    chain = client.read_chain(ref, max_bytes=4096)
    assert len(chain.pages) >= 10
    assert chain.content == MANUAL == Document.objects.get(source_key="manual.md").body
    assert chain.complete and not chain.budget_exhausted
    assert chain.total_content_bytes == len(MANUAL.encode())
    assert chain.trust == "reference_only"
    assert all(page.trust == "reference_only" for page in chain.pages)
    assert chain.pages[-1].next_cursor is None

    # Continuing from a page's cursor reads the rest of the chain only: never "complete".
    rest = client.read_chain(ref, cursor=first.next_cursor, max_bytes=4096)
    assert first.content + rest.content == MANUAL
    assert not rest.truncated and not rest.complete
    assert (rest.start_cursor, chain.start_cursor) == (first.next_cursor, None)


def test_a_chain_stops_at_its_budget(client, hub):
    body = manual_body(140_000, topic="pallet")
    upsert_document(hub.kb, "pallets.md", "Pallet manual", body)
    ref = client.search("pallet manual safety", limit=1).hints[0].ref
    chain = client.read_chain(ref, max_bytes=32768)
    assert chain.truncated and chain.budget_exhausted
    assert 100_000 < len(chain.content.encode()) <= 131072
    assert body.startswith(chain.content)


def test_errors_carry_protocol_codes(client, hub):
    stranger = KnowledgeClient(hub.url, hub.route, "bka_" + "x" * 43)
    with stranger, pytest.raises(Unauthorized) as caught:
        stranger.search("refund")
    assert (caught.value.code, caught.value.status) == ("unauthorized", 401)

    elsewhere = KnowledgeClient(hub.url, "no-such-route", hub.token)
    with elsewhere, pytest.raises(RouteNotAllowed) as caught:
        elsewhere.capabilities()
    assert (caught.value.code, caught.value.status) == ("route_not_allowed", 403)

    ref = client.search("refund").hints[0].ref
    raw = bytearray(base64.urlsafe_b64decode(ref + "=" * (-len(ref) % 4)))
    raw[-1] ^= 1
    tampered = base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()
    with pytest.raises(ReferenceInvalid) as caught:
        client.read(tampered)
    assert (caught.value.code, caught.value.status) == ("knowledge_reference_invalid", 400)
    assert isinstance(caught.value, ReferenceRejected)

    with pytest.raises(InvalidRequest) as caught:
        client.search("refund", limit=5)
    assert caught.value.code == "invalid_request" and "limit" in caught.value.fields

    with pytest.raises(RunNotCurrent):
        client.search("refund", run_id="run_unknown")


def test_changed_documents_and_scopes_are_refused(client, hub):
    ref = client.search("refund").hints[0].ref
    upsert_document(hub.kb, "refunds.md", "Refund policy", REFUNDS + "\n\nUpdated.")
    with pytest.raises(KnowledgeChanged) as caught:
        client.read(ref)
    assert caught.value.status == 409

    ref = client.search("refund").hints[0].ref
    services.update_route(hub.route, top_k=4)
    with pytest.raises(ScopeChanged) as caught:
        client.read(ref)
    assert caught.value.code == "knowledge_scope_changed"


def test_run_bound_search_and_read(client, hub):
    run = ready_run(hub)
    result = client.search("refund", run_id=run.run_id)
    assert result.run_id == run.run_id
    page = client.read(result.hints[0].ref, run_id=run.run_id)
    assert page.run_id == run.run_id
    # A ref bound to a run is not valid outside it.
    with pytest.raises(ReferenceInvalid):
        client.read(result.hints[0].ref)
    run.state = Run.State.COMPLETED
    run.save()
    with pytest.raises(RunNotCurrent):
        client.read(result.hints[0].ref, run_id=run.run_id)


def test_unreachable_hub_is_an_error():
    client = KnowledgeClient("http://127.0.0.1:9", "orders", "bka_x", timeout=2)
    with client, pytest.raises(Unreachable) as caught:
        client.capabilities()
    assert caught.value.status == 0 and caught.value.code == "hub_unreachable"


def test_constructor_rejects_nonsense():
    with pytest.raises(ValueError):
        KnowledgeClient("ftp://hub", "orders", "bka_x")
    with pytest.raises(ValueError):
        KnowledgeClient("http://hub", "../admin", "bka_x")
    with pytest.raises(ValueError):  # else ".../workspaces/orders%0A/..." is a 404, read as
        KnowledgeClient("http://hub", "orders\n", "bka_x")  # a server that predates the protocol
    with pytest.raises(ValueError):
        KnowledgeClient("http://hub", "orders", "")


@pytest.mark.parametrize(
    "url", ["http://hub/agent-api/v1", "http://hub/agent-api/v1/", "https://hub/erp/agent-api/v1"]
)
def test_a_hub_url_holding_the_api_prefix_is_refused(url):
    """Else capabilities would answer 404 and negotiation would quietly pick `inline`."""
    with pytest.raises(ValueError, match="without the API prefix: drop '/agent-api/v1'"):
        KnowledgeClient(url, "orders", "bka_x")
    with pytest.raises(ValueError, match="without the API prefix"):
        AsyncKnowledgeClient(url, "orders", "bka_x")
    # A system mounted under a path of its own, and a custom prefix, stay as they were.
    KnowledgeClient("https://hub/erp", "orders", "bka_x").close()
    KnowledgeClient(url, "orders", "bka_x", api_prefix="/knowledge-api").close()


def test_async_client(hub, manual):
    async def scenario():
        async with AsyncKnowledgeClient(hub.url, hub.route, hub.token) as client:
            capabilities = await client.capabilities()
            result = await client.search("forklift safety inspection", limit=1)
            chain = await client.read_chain(result.hints[0].ref, max_bytes=4096)
            with pytest.raises(ReferenceInvalid):
                await client.read("AAAA")
            return capabilities, result, chain

    capabilities, result, chain = asyncio.run(scenario())
    assert capabilities.on_demand
    assert result.hints[0].title == "Forklift manual"
    assert chain.content == MANUAL and len(chain.pages) > 1


def test_a_chain_that_repeats_a_cursor_is_refused(scripted):
    """A hub sending the same cursor forever would be followed for ~130,000 requests."""
    page = read_body(content="x", next_cursor="again", truncated=True)
    scripted.answer("POST", "read", Answer(200, as_json(page)))
    with KnowledgeClient(scripted.url, "orders", "bka_x") as client:
        with pytest.raises(ProtocolError, match="repeated a cursor"):
            client.read_chain("ref-1")
        assert len(scripted.requests) == 2
        # The cursor a chain starts at counts as seen.
        with pytest.raises(ProtocolError, match="repeated a cursor"):
            client.read_chain("ref-1", cursor="again")
        assert len(scripted.requests) == 3


def test_a_chain_ends_within_its_page_bound(scripted):
    served = []

    def next_page(body: bytes) -> Answer:
        served.append(body)
        return Answer(200, as_json(read_body(content="x", next_cursor=f"c{len(served)}")))

    scripted.answer("POST", "read", next_page)

    async def scenario():
        async with AsyncKnowledgeClient(scripted.url, "orders", "bka_x") as client:
            await client.read_chain("ref-1")

    with pytest.raises(ProtocolError, match="past 1024 pages"):
        asyncio.run(scenario())
    assert len(served) == 1024


def test_an_undecodable_answer_is_a_protocol_error(scripted):
    """A hub sending a bad Content-Encoding raised httpx.DecodingError out of the client."""
    scripted.answer("GET", "capabilities", Answer(200, b"not gzip", {"Content-Encoding": "gzip"}))

    async def scenario():
        async with AsyncKnowledgeClient(scripted.url, "orders", "bka_x") as client:
            await client.capabilities()

    client = KnowledgeClient(scripted.url, "orders", "bka_x")
    with client, pytest.raises(ProtocolError, match="Content-Encoding"):
        client.capabilities()
    with pytest.raises(ProtocolError, match="Content-Encoding"):
        asyncio.run(scenario())


def test_text_with_no_utf8_form_is_refused_before_sending(scripted):
    """A lone surrogate raised UnicodeEncodeError from inside httpx."""
    with KnowledgeClient(scripted.url, "orders", "bka_x") as client:
        calls = [
            ("query", lambda: client.search("refund \ud83d")),
            ("run_id", lambda: client.search("refund", run_id="run_\udfff")),
            ("ref", lambda: client.read("AAAA\ud800")),
            ("cursor", lambda: client.read("AAAA", cursor="\ud800")),
            ("cursor", lambda: client.read_chain("AAAA", cursor="\ud800")),
        ]
        for name, call in calls:
            with pytest.raises(InvalidRequest) as caught:
                call()
            assert (caught.value.code, caught.value.status) == ("invalid_request", 0)
            assert list(caught.value.fields) == [name]
    assert scripted.requests == []


@pytest.mark.parametrize(
    "token", ["bka_é", "bka_ x", "bka_x\n", "bka_\x00", "bka_\ud800", "bka_\u200b"]
)
def test_a_token_that_is_not_visible_ascii_is_refused(token):
    with pytest.raises(ValueError, match="visible ASCII"):
        KnowledgeClient("http://hub", "orders", token)
    with pytest.raises(ValueError, match="visible ASCII"):
        AsyncKnowledgeClient("http://hub", "orders", token)


def test_an_invalid_hub_url_is_refused_at_construction():
    with pytest.raises(ValueError, match="not a valid URL"):
        KnowledgeClient("http://hub\ud800", "orders", "bka_x")


@pytest.mark.parametrize(
    ("field", "raw"),
    [
        ("score", b"NaN"),
        ("score", b"-Infinity"),
        ("score", b"1e400"),
        ("score", b"1" + b"0" * 400),
        ("title", b'"\\ud800"'),
        ("title", b'"a\\udfffb"'),
    ],
)
def test_answers_that_are_not_strict_json_are_protocol_errors(scripted, field, raw):
    """NaN and infinities would make tool results that are not JSON; a lone surrogate has no
    UTF-8 form; a score beyond a float raised OverflowError."""
    body = as_json(search_body({**hint(), field: "@@"})).replace(b'"@@"', raw)
    scripted.answer("POST", "search", Answer(200, body))
    with KnowledgeClient(scripted.url, "orders", "bka_x") as client:
        with pytest.raises(ProtocolError):
            client.search("refund")
        result = execute_tool_call(client, "knowledge_search", {"query": "x"})
    assert result["error"] == "protocol_error"


def test_a_surrogate_pair_is_text(scripted):
    body = as_json(search_body({**hint(), "title": "@@"})).replace(b'"@@"', b'"\\ud83d\\ude9c"')
    scripted.answer("POST", "search", Answer(200, body))
    with KnowledgeClient(scripted.url, "orders", "bka_x") as client:
        assert client.search("refund").hints[0].title == "\U0001f69c"


def test_deeply_nested_answers_are_protocol_errors(scripted):
    scripted.answer("GET", "capabilities", Answer(200, b"[" * 100_000 + b"]" * 100_000))
    with KnowledgeClient(scripted.url, "orders", "bka_x") as client, pytest.raises(ProtocolError):
        client.capabilities()


@pytest.mark.parametrize("where", ["headers", "body"])
def test_timeout_is_a_deadline_for_the_whole_request(where):
    """httpx's timeout bounds each read; a hub dripping a byte per 0.1 s never tripped it."""
    answer = drip_answer(as_json(capabilities_body()))
    drip_from = 5 if where == "headers" else answer.index(b"\r\n\r\n") + 4
    hub = DripHub(answer, drip_from)  # about 40 s for the whole answer

    async def scenario():
        async with AsyncKnowledgeClient(hub.url, "orders", "bka_x", timeout=1) as client:
            await client.capabilities()

    try:
        for run in (
            lambda: KnowledgeClient(hub.url, "orders", "bka_x", timeout=1).capabilities(),
            lambda: asyncio.run(scenario()),
        ):
            started = time.monotonic()
            with pytest.raises(Unreachable, match="did not answer within 1 seconds"):
                run()
            assert time.monotonic() - started < 2.5
    finally:
        hub.close()


PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


def test_both_clients_go_through_the_proxy_the_environment_names(scripted, monkeypatch):
    """A host behind a proxy names it in HTTP_PROXY (and the others), as for any httpx
    client; the deadline holds through it too."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.setenv("HTTP_PROXY", scripted.url)
    hub = "http://hub.invalid"  # reachable only through the proxy
    body = as_json(capabilities_body())
    scripted.answers[("GET", hub + scripted.path("capabilities"))] = Answer(200, body)

    async def through_async() -> None:
        async with AsyncKnowledgeClient(hub, "orders", "bka_x") as client:
            await client.capabilities()

    with KnowledgeClient(hub, "orders", "bka_x") as client:
        client.capabilities()
    asyncio.run(through_async())
    assert [path for _, path, _, _ in scripted.requests] == [
        hub + scripted.path("capabilities")
    ] * 2

    dripping = DripHub(drip_answer(body), drip_from=5)
    monkeypatch.setenv("HTTP_PROXY", dripping.url)
    try:
        started = time.monotonic()
        with pytest.raises(Unreachable, match="did not answer within 1 seconds"):
            KnowledgeClient(hub, "orders", "bka_x", timeout=1).capabilities()
        assert time.monotonic() - started < 2.5
    finally:
        dripping.close()


def test_timeout_must_be_a_positive_finite_number():
    for timeout in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="timeout"):
            KnowledgeClient("http://hub", "orders", "bka_x", timeout=timeout)


def test_the_fields_of_an_invalid_request_are_bounded(scripted):
    """A hub's `fields` went into tool results whole, megabytes of them if it liked."""
    fields = {f"field_{i}": ["m" * 5_000] * 3 for i in range(500)}
    body = {"error": "invalid_request", "reason": "Bad.", "fields": fields}
    scripted.answer("POST", "search", Answer(400, as_json(body)))
    with KnowledgeClient(scripted.url, "orders", "bka_x") as client:
        with pytest.raises(InvalidRequest) as caught:
            client.search("refund")
        result = execute_tool_call(client, "knowledge_search", {"query": "x"})
    # 20 keys and messages in all, each message cut to 200 characters.
    assert caught.value.fields == {f"field_{i}": ["m" * 200] * 3 for i in range(5)}
    assert result["fields"] == caught.value.fields and len(dumps_result(result)) < 5000

    # Small answers are kept as they are; nesting beyond three levels is left out.
    nested = {"task_binding": {"task_id": ["Required."]}, "x": {"y": {"z": {"w": ["deep"]}}}}
    body["fields"] = nested
    scripted.answer("POST", "search", Answer(400, as_json(body)))
    client = KnowledgeClient(scripted.url, "orders", "bka_x")
    with client, pytest.raises(InvalidRequest) as caught:
        client.search("refund")
    assert caught.value.fields == {
        "task_binding": {"task_id": ["Required."]},
        "x": {"y": {"z": {}}},
    }


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("12", 12.0),
        (" 1.5 ", 1.5),
        ("inf", None),
        ("nan", None),
        ("1e400", None),
        ("-1", None),
        ("1_0", None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", None),
        ("99999999999", 86400.0),
        ("9" * 400, 86400.0),
    ],
)
def test_retry_after_is_a_finite_bounded_number(scripted, header, seconds):
    """`Retry-After: inf` made a tool result with `Infinity` in it: not JSON."""
    body = as_json({"error": "rate_limited", "reason": "Slow down."})
    scripted.answer("POST", "search", Answer(429, body, {"Retry-After": header}))
    with KnowledgeClient(scripted.url, "orders", "bka_x") as client:
        with pytest.raises(RateLimited) as caught:
            client.search("refund")
        result = execute_tool_call(client, "knowledge_search", {"query": "x"})
    assert caught.value.retry_after == seconds
    assert json.loads(dumps_result(result)).get("retry_after") == seconds
