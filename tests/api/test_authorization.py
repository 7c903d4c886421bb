"""Every 401/403 condition on every agent endpoint, and their effect on the next request."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from bailing_knowledge import services
from bailing_knowledge.models import AgentSession

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


@pytest.mark.parametrize(("method", "path", "body"), AGENT_ENDPOINTS)
@pytest.mark.parametrize("lockout", [_revoke, _disable_client, _disable_route, _agent_client_off])
def test_lockout_takes_effect_on_the_very_next_request(lockout, method, path, body, issued, route):
    caller = AgentCaller(issued.access_token)
    url = path.format(route=route.route_key)
    assert caller.call(method, url, body).status_code not in (401, 403)
    lockout(issued=issued, route=route)
    assert caller.call(method, url, body).status_code in (401, 403)


def test_authentication_costs_a_bounded_number_of_queries(
    agent, route, django_assert_max_num_queries
):
    agent.get("/workspaces/orders/knowledge/capabilities")  # first call records last_seen
    # Token lookup, route check, the route's KBs: no query per KB or per route.
    for extra in range(5):
        services.bind_knowledge_bases(route, [services.create_knowledge_base(f"kb-{extra}")])
    with django_assert_max_num_queries(3):
        response = agent.get("/workspaces/orders/knowledge/capabilities")
    assert response.status_code == 200


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
