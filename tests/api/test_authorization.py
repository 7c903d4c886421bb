"""Every 401/403 condition on every agent endpoint, and their effect on the next request."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from bailing_knowledge import services
from bailing_knowledge.ingestion.documents import upsert_document
from bailing_knowledge.models import AgentSession, Route

from .conftest import AGENT_ENDPOINTS, AgentCaller, assert_error

pytestmark = pytest.mark.django_db


def _expire(issued, **_):
    AgentSession.objects.filter(pk=issued.session.pk).update(
        created_at=timezone.now() - timedelta(hours=2),
        expires_at=timezone.now() - timedelta(seconds=1),
    )


def _revoke(issued, **_):
    services.revoke_session(issued.session)


def _disable_client(issued, **_):
    services.set_client_enabled(issued.session.client, False)


def _route_outside_client(issued, route, **_):
    services.update_client(issued.session.client, routes=[])


def _route_outside_session(issued, agent_client, **_):
    # The session was issued for "orders" only; a route the client has but the session lacks.
    services.create_route("billing")
    services.update_client(agent_client, routes=["orders", "billing"])
    return "billing"


def _disable_route(issued, route, **_):
    services.set_route_enabled(route, False)


def _audience_mismatch(issued, route, **_):
    services.update_route(route, audiences=["partners"])


def _agent_client_off(issued, route, **_):
    services.set_agent_client_enabled(route, False)


def _unknown_route(issued, **_):
    return "no-such-route"


def _leave_session_routes(issued, **_):
    AgentSession.objects.get(pk=issued.session.pk).allowed_routes.clear()


UNAUTHORIZED = {
    "missing header": {"token": None},
    "wrong scheme": {"headers": {"Authorization": "Basic dXNlcjpwYXNz"}, "token": None},
    "bearer without token": {"headers": {"Authorization": "Bearer"}, "token": None},
    "bearer with two words": {"headers": {"Authorization": "Bearer a b"}, "token": None},
    "unknown token": {"token": "bka_" + "A" * 43},
    "token without prefix": {"token": "A" * 47},
    "non-ascii token": {"headers": {"Authorization": "Bearer bka_ä"}, "token": None},
    "expired": {"setup": _expire},
    "revoked": {"setup": _revoke},
    "client disabled": {"setup": _disable_client},
}

FORBIDDEN = {
    "route unknown": _unknown_route,
    "route outside client routes": _route_outside_client,
    "route outside session routes": _route_outside_session,
    "route disabled": _disable_route,
    "audience mismatch": _audience_mismatch,
    "agent client switch off": _agent_client_off,
}


@pytest.mark.parametrize(("method", "path", "body"), AGENT_ENDPOINTS)
@pytest.mark.parametrize("case", sorted(UNAUTHORIZED))
def test_unauthorized_matrix(case, method, path, body, issued, route, agent_client):
    spec = UNAUTHORIZED[case]
    if "setup" in spec:
        spec["setup"](issued=issued, route=route, agent_client=agent_client)
    caller = AgentCaller(issued.access_token)
    kwargs = {"headers": spec.get("headers")}
    if "token" in spec:
        kwargs["token"] = spec["token"]
    response = caller.call(method, path.format(route=route.route_key), body, **kwargs)
    assert_error(response, 401, "unauthorized", issued.access_token, issued.session.token_hash)
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(("method", "path", "body"), AGENT_ENDPOINTS)
@pytest.mark.parametrize("case", sorted(FORBIDDEN))
def test_forbidden_matrix(case, method, path, body, issued, route, agent_client):
    route_key = FORBIDDEN[case](issued=issued, route=route, agent_client=agent_client)
    route_key = route_key or route.route_key
    response = AgentCaller(issued.access_token).call(method, path.format(route=route_key), body)
    body = assert_error(response, 403, "route_not_allowed", issued.access_token)
    # One answer for every cause: no oracle for which routes exist.
    assert body["reason"] == "This route is not available to this agent session."


@pytest.mark.parametrize(("method", "path", "body"), AGENT_ENDPOINTS)
def test_matching_audience_is_allowed(method, path, body, issued, route):
    services.update_route(route, audiences=["partners", "staff"])
    response = AgentCaller(issued.access_token).call(method, path.format(route="orders"), body)
    # Past authorization (the read endpoint then rejects the placeholder ref itself).
    assert response.status_code not in (401, 403)


LOCKOUTS = [
    _expire,
    _revoke,
    _disable_client,
    _disable_route,
    _agent_client_off,
    _audience_mismatch,
    _route_outside_client,
    _leave_session_routes,
]


@pytest.mark.parametrize(("method", "path", "body"), AGENT_ENDPOINTS)
@pytest.mark.parametrize("lockout", LOCKOUTS, ids=lambda lockout: lockout.__name__)
def test_lockout_takes_effect_on_the_very_next_request(lockout, method, path, body, issued, route):
    caller = AgentCaller(issued.access_token)
    url = path.format(route=route.route_key)
    assert caller.call(method, url, body).status_code not in (401, 403)
    lockout(issued=issued, route=route)
    assert caller.call(method, url, body).status_code in (401, 403)


CAPABILITIES = "/workspaces/orders/knowledge/capabilities"


def _reading(queries, model_or_table) -> list[str]:
    """The captured statements that read a table (a model's, or an M2M through table).

    A statement reads it by naming it, or by calling one of the app's functions that does.
    """
    table = getattr(getattr(model_or_table, "_meta", None), "db_table", model_or_table)
    with connection.cursor() as cursor:
        cursor.execute(
            r"SELECT proname FROM pg_proc WHERE proname LIKE 'bailing\_knowledge\_%%' "
            r"AND prosrc ~ ('\m' || %s || '\M')",
            [table],
        )
        names = [table, *(name for (name,) in cursor.fetchall())]
    pattern = rf"\b({'|'.join(names)})\b"
    return [q["sql"] for q in queries if re.search(pattern, q["sql"])]


def test_capabilities_is_one_statement(agent, route, settings):
    settings.BAILING_KNOWLEDGE = {"SESSION_LAST_SEEN_INTERVAL": 3600}
    agent.get(CAPABILITIES)  # the first call records last_seen
    # However many KBs the route has: no query per KB, nor one for the KBs at all.
    for extra in range(5):
        services.bind_knowledge_bases(route, [services.create_knowledge_base(f"kb-{extra}")])
    with CaptureQueriesContext(connection) as queries:
        response = agent.get(CAPABILITIES)
    assert response.status_code == 200
    assert len(queries) == 1, [q["sql"] for q in queries]
    body = json.loads(response.content)
    expected = Route.objects.prefetch_related("knowledge_bases").get(pk=route.pk)
    assert body["knowledge_scope_revision"] == expected.knowledge_scope_revision


def test_a_due_last_seen_costs_one_more_statement(agent, settings):
    settings.BAILING_KNOWLEDGE = {"SESSION_LAST_SEEN_INTERVAL": 0}
    with CaptureQueriesContext(connection) as queries:
        assert agent.get(CAPABILITIES).status_code == 200
    assert len(queries) == 2 and queries[1]["sql"].startswith("UPDATE")


def test_denials_cost_one_statement(agent, issued, route, settings):
    settings.BAILING_KNOWLEDGE = {"SESSION_LAST_SEEN_INTERVAL": 3600}
    agent.get(CAPABILITIES)  # the first call records last_seen
    services.set_route_enabled(route, False)
    with CaptureQueriesContext(connection) as queries:
        assert agent.get(CAPABILITIES).status_code == 403
    services.revoke_session(issued.session)
    with CaptureQueriesContext(connection) as more:
        assert agent.get(CAPABILITIES).status_code == 401
    assert len(queries) == len(more) == 1


def test_completing_a_run_rechecks_its_route_in_one_statement(agent, issued, route):
    turn = {
        "client_conversation_id": "c",
        "client_turn_id": "t",
        "user_message_id": "m",
        "user_input": "refund",
    }
    response = agent.post("/workspaces/orders/turns", turn)
    assert response.status_code == 200, response.content
    run_id = json.loads(response.content)["run_id"]
    with CaptureQueriesContext(connection) as queries:
        response = agent.post(
            f"/runs/{run_id}/complete",
            {"assistant_message_id": "a-1", "status": "completed", "content": "Done."},
        )
    assert response.status_code == 200, response.content
    # The run's route is re-checked, its KBs brought along, in one statement.
    rechecks = _reading(queries, AgentSession.allowed_routes.through)
    assert len(rechecks) == 1
    assert rechecks == _reading(queries, Route.knowledge_bases.through)


@pytest.fixture
def refunds(kb):
    upsert_document(kb, "refunds.md", "Refund policy", "# Refunds\n\nRefunds take five days.")
    return kb


def test_search_and_read_do_not_ask_for_the_route_again(agent, route, refunds, settings):
    settings.BAILING_KNOWLEDGE = {"SESSION_LAST_SEEN_INTERVAL": 3600}
    with CaptureQueriesContext(connection) as queries:
        response = agent.post("/workspaces/orders/knowledge/search", {"query": "refunds"})
    assert response.status_code == 200, response.content
    ref = json.loads(response.content)["hints"][0]["ref"]
    with CaptureQueriesContext(connection) as read_queries:
        response = agent.post("/workspaces/orders/knowledge/read", {"ref": ref})
    assert response.status_code == 200, response.content
    for captured in (queries, read_queries):
        first = [captured[0]["sql"]]
        # Only the first statement (authentication with the route re-check) reads these.
        for table in (Route, Route.knowledge_bases.through):
            assert _reading(captured, table) == first


def _capabilities(agent) -> dict:
    response = agent.get(CAPABILITIES)
    assert response.status_code == 200
    return json.loads(response.content)


def test_knowledge_changes_are_seen_on_the_very_next_request(agent, route, kb):
    first = _capabilities(agent)
    assert first["enabled"] is True

    services.set_knowledge_base_enabled(kb, False)
    disabled = _capabilities(agent)
    assert disabled["enabled"] is False
    assert disabled["knowledge_scope_revision"] != first["knowledge_scope_revision"]

    services.set_knowledge_base_enabled(kb, True)
    assert _capabilities(agent) == first

    services.bind_knowledge_bases(route, [services.create_knowledge_base("faq", title="FAQ")])
    bound = _capabilities(agent)
    assert bound["knowledge_scope_revision"] not in {
        first["knowledge_scope_revision"],
        disabled["knowledge_scope_revision"],
    }
    expected = Route.objects.prefetch_related("knowledge_bases").get(pk=route.pk)
    assert bound["knowledge_scope_revision"] == expected.knowledge_scope_revision

    services.update_route(route, knowledge_bases=[])
    assert _capabilities(agent)["enabled"] is False


def test_a_kb_disabled_between_two_searches_is_not_searched(agent, refunds):
    search = "/workspaces/orders/knowledge/search"
    assert json.loads(agent.post(search, {"query": "refunds"}).content)["hints"]
    services.set_knowledge_base_enabled(refunds, False)
    body = json.loads(agent.post(search, {"query": "refunds"}).content)
    assert (body["status"], body["hints"]) == ("disabled", [])


def test_a_revoked_session_is_refused_on_the_very_next_request(agent, issued):
    assert agent.get(CAPABILITIES).status_code == 200
    services.revoke_session(issued.session)
    assert_error(agent.get(CAPABILITIES), 401, "unauthorized", issued.access_token)


def test_last_seen_is_written_at_most_once_per_interval(agent, issued, settings):
    settings.BAILING_KNOWLEDGE = {"SESSION_LAST_SEEN_INTERVAL": 3600}
    agent.get("/workspaces/orders/knowledge/capabilities")
    first = AgentSession.objects.get(pk=issued.session.pk).last_seen_at
    assert first is not None
    agent.get("/workspaces/orders/knowledge/capabilities")
    assert AgentSession.objects.get(pk=issued.session.pk).last_seen_at == first

    settings.BAILING_KNOWLEDGE = {"SESSION_LAST_SEEN_INTERVAL": 0}
    agent.get("/workspaces/orders/knowledge/capabilities")
    assert AgentSession.objects.get(pk=issued.session.pk).last_seen_at > first
