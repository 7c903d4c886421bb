"""Delivery negotiation against every kind of server answer, each from a real HTTP server."""

from __future__ import annotations

import asyncio

import pytest

from bailing_knowledge import constants, services
from bailing_knowledge.client import (
    AsyncKnowledgeClient,
    KnowledgeClient,
    ProtocolError,
    RouteNotAllowed,
    ServerError,
    Unauthorized,
    Unavailable,
    anegotiate_delivery,
    delivery_from_capabilities,
    negotiate_delivery,
    turn_knowledge,
    turn_request_options,
)

from .conftest import Answer, as_json, capabilities_body, hint

# Only the tests against the app need the database (and a live server).
live = pytest.mark.django_db(transaction=True)


def _negotiate(url: str, route: str = "orders", token: str | None = None) -> str:
    token = token or "bka_x"
    with KnowledgeClient(url, route, token, timeout=10) as client:
        return negotiate_delivery(client)


# --- the app itself --------------------------------------------------------------------------


@live
def test_supported_and_enabled_is_on_demand(hub):
    assert _negotiate(hub.url, token=hub.token) == "on_demand"


@live
def test_knowledge_disabled_is_inline(hub):
    services.update_route(hub.route, knowledge_enabled=False)
    assert _negotiate(hub.url, token=hub.token) == "inline"


@live
def test_every_kb_disabled_is_inline(hub):
    services.set_knowledge_base_enabled(hub.kb, False)
    assert _negotiate(hub.url, token=hub.token) == "inline"


@live
def test_unauthorized_and_forbidden_are_errors(hub):
    with pytest.raises(Unauthorized):
        _negotiate(hub.url, token="bka_" + "y" * 43)
    with pytest.raises(RouteNotAllowed):
        _negotiate(hub.url, route="elsewhere", token=hub.token)
    services.set_agent_client_enabled(hub.route, False)
    with pytest.raises(RouteNotAllowed):
        _negotiate(hub.url, token=hub.token)


@live
def test_async_negotiation(hub):
    async def scenario():
        async with AsyncKnowledgeClient(hub.url, hub.route, hub.token) as client:
            return await anegotiate_delivery(client)

    assert asyncio.run(scenario()) == "on_demand"


# --- servers that are not this app: old ones, broken ones ------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        Answer(404, b"<html>Not Found</html>", {"Content-Type": "text/html"}),
        Answer(404, as_json({"error": "not_found", "reason": "No such endpoint."})),
        Answer(405, b"", {"Allow": "POST"}),
        Answer(501, b"Not Implemented", {"Content-Type": "text/plain"}),
        Answer(200, as_json(capabilities_body(enabled=False))),
        Answer(200, as_json(capabilities_body(supported=False))),
        Answer(200, as_json(capabilities_body(delivery_modes=["inline"]))),
    ],
    ids=["404-html", "404-json", "405", "501", "disabled", "unsupported", "no-on-demand"],
)
def test_old_or_disabled_servers_fall_back_to_inline(scripted, answer):
    scripted.answer("GET", "capabilities", answer)
    assert _negotiate(scripted.url) == "inline"


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (Answer(401, as_json({"error": "unauthorized", "reason": "No."})), Unauthorized),
        (Answer(403, b"<html>Forbidden</html>", {"Content-Type": "text/html"}), RouteNotAllowed),
        (Answer(500, b"<html>Server Error</html>", {"Content-Type": "text/html"}), ServerError),
        (
            Answer(
                503,
                as_json({"error": "knowledge_unavailable", "reason": "Later."}),
                {"Retry-After": "5"},
            ),
            Unavailable,
        ),
        (Answer(502, b"Bad Gateway", {"Content-Type": "text/plain"}), ServerError),
        (Answer(200, as_json(capabilities_body(schema_version="v2"))), ProtocolError),
        (Answer(200, as_json(capabilities_body(protocol="other.v9"))), ProtocolError),
        (Answer(200, as_json(capabilities_body(route="another"))), ProtocolError),
        (Answer(200, as_json(capabilities_body(enabled="yes"))), ProtocolError),
        (Answer(200, b"<html>ok</html>", {"Content-Type": "text/html"}), ProtocolError),
        (Answer(302, b"", {"Location": "http://127.0.0.1:9/steal"}), ProtocolError),
        (Answer(429, as_json({"error": "rate_limited", "reason": "Slow down."})), Exception),
    ],
    ids=[
        "401",
        "403",
        "500",
        "503",
        "502",
        "schema",
        "protocol",
        "route",
        "type",
        "html-200",
        "redirect",
        "429",
    ],
)
def test_failures_are_never_read_as_success(scripted, answer, error):
    scripted.answer("GET", "capabilities", answer)
    with pytest.raises(error) as caught:
        _negotiate(scripted.url)
    assert caught.value.status == answer.status
    # A redirect is not followed: the token never reaches the target.
    assert len(scripted.requests) == 1


def test_retry_after_is_kept(scripted):
    scripted.answer(
        "GET",
        "capabilities",
        Answer(
            503,
            as_json({"error": "knowledge_unavailable", "reason": "Later."}),
            {"Retry-After": "7"},
        ),
    )
    with pytest.raises(Unavailable) as caught:
        _negotiate(scripted.url)
    assert (caught.value.code, caught.value.retry_after) == ("knowledge_unavailable", 7.0)
    assert caught.value.to_dict() == {
        "error": "knowledge_unavailable",
        "reason": "Later.",
        "retry_after": 7.0,
    }


# --- the rule as a pure function -------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (200, capabilities_body(), "on_demand"),
        (200, as_json(capabilities_body()), "on_demand"),
        (200, as_json(capabilities_body()).decode(), "on_demand"),
        (200, capabilities_body(enabled=False), "inline"),
        (404, None, "inline"),
        (405, b"", "inline"),
        (501, "Not Implemented", "inline"),
    ],
)
def test_pure_rule(status, body, expected):
    assert delivery_from_capabilities(status, body) == expected


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (401, None),
        (403, {"error": "route_not_allowed", "reason": "No."}),
        (500, None),
        (503, b""),
        (400, {"error": "invalid_request", "reason": "No."}),
        (200, {"schema_version": "bailing.agent-knowledge-capabilities.v2"}),
        (200, b"not json"),
        (200, []),
        (204, None),
    ],
)
def test_pure_rule_raises(status, body):
    with pytest.raises(Exception) as caught:
        delivery_from_capabilities(status, body)
    assert caught.value.status in (status, 200)


def test_route_must_match():
    with pytest.raises(ProtocolError):
        delivery_from_capabilities(200, capabilities_body(), route="billing")


# --- the turn side ---------------------------------------------------------------------------


def test_turn_request_options():
    assert turn_request_options("on_demand") == {"knowledge_delivery": "on_demand"}
    # Inline is the legacy request: an old server rejects the unknown field.
    assert turn_request_options("inline") == {}
    with pytest.raises(ValueError):
        turn_request_options("eager")


def _turn(**changes):
    body = {
        "schema_version": constants.SCHEMA_TURN_CONTEXT,
        "run_id": "run_1",
        "route": "orders",
        "knowledge_scope_revision": "ksr_1",
        "knowledge": [],
        "knowledge_refs": [],
        "context": {},
    }
    body.update(changes)
    return body


def test_turn_knowledge_on_demand():
    delivery = {
        "schema_version": constants.SCHEMA_DELIVERY,
        "mode": "on_demand",
        "protocol": constants.PROTOCOL,
        "knowledge_scope_revision": "ksr_1",
        "status": "ok",
        "hints": [hint("r1")],
    }
    result = turn_knowledge(_turn(context={"knowledge_delivery": delivery}), "on_demand")
    assert (result.mode, result.run_id, result.status) == ("on_demand", "run_1", "ok")
    assert [h.ref for h in result.hints] == ["r1"]
    assert result.trust == "reference_only"
    # Asked inline, answered on_demand: bodies would silently be missing.
    with pytest.raises(ProtocolError):
        turn_knowledge(_turn(context={"knowledge_delivery": delivery}), "inline")


def test_turn_knowledge_inline_keeps_bodies():
    body = _turn(knowledge=[{"title": "Refunds", "content": "..."}], knowledge_refs=[{"id": 1}])
    for requested in ("inline", "on_demand"):
        result = turn_knowledge(body, requested)
        assert result.mode == "inline"
        assert result.knowledge == ({"title": "Refunds", "content": "..."},)
        assert result.knowledge_refs == ({"id": 1},)
    with pytest.raises(ProtocolError):
        turn_knowledge(_turn(schema_version="bailing.agent-turn-context.v9"), "inline")
