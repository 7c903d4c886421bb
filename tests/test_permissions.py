"""The route re-check: one statement, every rule in it, the route's KBs brought along."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from bailing_knowledge import access, services
from bailing_knowledge.models import AgentSession, KnowledgeBase, Route, hash_token
from bailing_knowledge.permissions import AgentRoutePermission, allowed_route

pytestmark = pytest.mark.django_db


def _fields(instance) -> dict:
    """Every field's value, and its type: 1 would equal True, 1.0 equal 1."""
    values = {field.attname: getattr(instance, field.attname) for field in instance._meta.fields}
    return {name: (type(value), value) for name, value in values.items()}


def _route_outside_client(issued, route, agent_client):
    services.update_client(agent_client, routes=[])


def _route_outside_session(issued, route, agent_client):
    AgentSession.objects.get(pk=issued.session.pk).allowed_routes.clear()


def _other_clients_route(issued, route, agent_client):
    # Both link tables must name this very session and client, not merely some.
    other = services.create_client("other-agent", routes=[route])
    services.issue_session(other, principal_id="user-2", routes=[route])
    services.update_client(agent_client, routes=[])


DENIED = {
    "route unknown": lambda issued, route, agent_client: "no-such-route",
    "route disabled": lambda issued, route, agent_client: services.set_route_enabled(route, False),
    "agent client switch off": lambda issued, route, agent_client: (
        services.set_agent_client_enabled(route, False)
    ),
    "route outside client routes": _route_outside_client,
    "route outside session routes": _route_outside_session,
    "route only another client's": _other_clients_route,
    "audience mismatch": lambda issued, route, agent_client: services.update_route(
        route, audiences=["partners"]
    ),
}

ADMITTED = {
    "every audience": lambda issued, route, agent_client: None,
    "audience listed": lambda issued, route, agent_client: services.update_route(
        route, audiences=["partners", "staff"]
    ),
    "knowledge off": lambda issued, route, agent_client: services.update_route(
        route, knowledge_enabled=False
    ),
}


def _combined(issued, route_key: str) -> Route | None:
    token_hash = hash_token(issued.access_token)
    session = access.live_session_and_route(token_hash, timezone.now(), route_key)
    checked, found = access.checked_route(session, route_key)
    assert checked
    return found


def _session(issued) -> AgentSession:
    return AgentSession.objects.select_related("client").get(pk=issued.session.pk)


@pytest.mark.parametrize("case", sorted(DENIED))
def test_each_rule_denies(case, issued, route, agent_client):
    route_key = DENIED[case](issued=issued, route=route, agent_client=agent_client)
    route_key = route_key if isinstance(route_key, str) else "orders"
    assert allowed_route(_session(issued), route_key) is None
    assert _combined(issued, route_key) is None


@pytest.mark.parametrize("case", sorted(ADMITTED))
def test_admitted(case, issued, route, agent_client):
    ADMITTED[case](issued=issued, route=route, agent_client=agent_client)
    assert allowed_route(_session(issued), "orders").pk == route.pk
    assert _combined(issued, "orders").pk == route.pk


def test_a_principal_without_audience_is_refused_where_audiences_are_listed(agent_client, route):
    issued = services.issue_session(agent_client, principal_id="user-3", routes=[route])
    assert allowed_route(_session(issued), "orders").pk == route.pk
    services.update_route(route, audiences=["staff"])
    assert allowed_route(_session(issued), "orders") is None
    assert _combined(issued, "orders") is None


@pytest.fixture
def knowledge_bases(route):
    # Created out of slug order, with every field a search or a scope revision reads set.
    kbs = [
        services.create_knowledge_base("zeta", title="Zeta"),
        services.create_knowledge_base("alpha", title="Alpha", tenant="acme"),
        KnowledgeBase.objects.create(
            slug="mid", title="Mid", description="d", enabled=False, language="simple"
        ),
    ]
    services.bind_knowledge_bases(route, kbs)
    services.create_knowledge_base("unbound", title="Not the route's")
    return kbs


@pytest.mark.parametrize("how", ["alone", "with the session"])
def test_the_route_and_its_knowledge_bases_in_one_statement(how, issued, route, knowledge_bases):
    session = _session(issued)
    with CaptureQueriesContext(connection) as queries:
        found = allowed_route(session, "orders") if how == "alone" else _combined(issued, "orders")
        kbs = list(found.knowledge_bases.all())
        revision = found.knowledge_scope_revision
    assert len(queries) == 1

    stored = Route.objects.prefetch_related("knowledge_bases").get(pk=route.pk)
    assert _fields(found) == _fields(stored)
    assert found.get_deferred_fields() == set()
    assert revision == stored.knowledge_scope_revision
    expected = list(stored.knowledge_bases.all())
    assert [kb.slug for kb in kbs] == ["alpha", "handbook", "mid", "zeta"]
    assert [_fields(kb) for kb in kbs] == [_fields(kb) for kb in expected]
    assert all(kb.get_deferred_fields() == set() for kb in kbs)
    assert all(kb._state.adding is False and kb._state.db == "default" for kb in kbs)


def test_a_route_without_knowledge_bases(issued, route):
    services.update_route(route, knowledge_bases=[])
    expected = Route.objects.get(pk=route.pk).knowledge_scope_revision
    found = allowed_route(_session(issued), "orders")
    with CaptureQueriesContext(connection) as queries:
        assert list(found.knowledge_bases.all()) == []
        assert found.knowledge_scope_revision == expected
    assert len(queries) == 0
    assert _combined(issued, "orders").knowledge_bases.all()._result_cache == []


def test_refining_the_prefetched_knowledge_bases_stays_within_the_route(
    issued, route, knowledge_bases
):
    found = allowed_route(_session(issued), "orders")
    assert sorted(found.knowledge_bases.filter(enabled=True).values_list("slug", flat=True)) == [
        "alpha",
        "handbook",
        "zeta",
    ]


def _permission(session, route_key):
    request = SimpleNamespace(auth=session)
    view = SimpleNamespace(kwargs={"route": route_key})
    return AgentRoutePermission().has_permission(request, view), request


def test_the_permission_reuses_the_answer_of_the_authentication_statement(issued, route):
    token_hash = hash_token(issued.access_token)
    session = access.live_session_and_route(token_hash, timezone.now(), "orders")
    with CaptureQueriesContext(connection) as queries:
        granted, request = _permission(session, "orders")
    assert granted and request.agent_route.pk == route.pk
    assert len(queries) == 0


def test_the_permission_asks_itself_when_nothing_was_answered(issued, route, agent_client):
    services.create_route("billing")
    services.update_client(agent_client, routes=["orders", "billing"])
    token_hash = hash_token(issued.access_token)
    session = access.live_session_and_route(token_hash, timezone.now(), "orders")
    with CaptureQueriesContext(connection) as queries:
        granted, _ = _permission(session, "billing")  # not among the session's routes
    assert not granted and len(queries) == 1
    loaded_otherwise = _session(issued)
    with CaptureQueriesContext(connection) as queries:
        granted, request = _permission(loaded_otherwise, "orders")
    assert granted and request.agent_route.pk == route.pk and len(queries) == 1


def test_the_permission_refuses_what_the_statement_refused(issued, route):
    services.set_route_enabled(route, False)
    token_hash = hash_token(issued.access_token)
    session = access.live_session_and_route(token_hash, timezone.now(), "orders")
    with CaptureQueriesContext(connection) as queries:
        granted, request = _permission(session, "orders")
    assert not granted and not hasattr(request, "agent_route") and len(queries) == 0


def test_the_permission_refuses_anything_but_an_agent_session(db):
    assert _permission(None, "orders")[0] is False


@pytest.mark.parametrize(("use_tz", "time_zone"), [(True, "UTC"), (False, "Asia/Shanghai")])
def test_knowledge_base_timestamps_are_what_the_orm_loads(
    use_tz, time_zone, issued, route, knowledge_bases, settings
):
    settings.USE_TZ, settings.TIME_ZONE = use_tz, time_zone
    found = allowed_route(_session(issued), "orders")
    stored = Route.objects.prefetch_related("knowledge_bases").get(pk=route.pk)
    loaded = [(kb.created_at, kb.updated_at) for kb in found.knowledge_bases.all()]
    assert loaded == [(kb.created_at, kb.updated_at) for kb in stored.knowledge_bases.all()]
    assert all((moment.tzinfo is not None) == use_tz for pair in loaded for moment in pair)
    assert found.created_at == stored.created_at


def test_the_knowledge_bases_arrive_with_every_field(issued, route):
    # Every value distinct, so that two fields read in each other's place would show.
    kb = KnowledgeBase.objects.create(
        slug="every-field",
        title="Title",
        description="Description",
        enabled=False,
        embedder="embedder",
        tenant="tenant",
        language="simple",
    )
    services.update_route(route, knowledge_bases=[kb])
    session = issued.session
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT bailing_knowledge_admitted_route(%s, %s, %s, %s)",
            ["orders", session.principal_audience, session.client_id, session.pk],
        )
        ((row,),) = [answer["knowledge_bases"] for (answer,) in cursor.fetchall()]
    fields = KnowledgeBase._meta.concrete_fields
    assert sorted(row) == sorted(field.column for field in fields)
    values = [field.to_python(row[field.column]) for field in fields]
    assert values == [getattr(kb, field.attname) for field in fields]
    found = allowed_route(AgentSession.objects.get(pk=session.pk), "orders")
    assert [_fields(loaded) for loaded in found.knowledge_bases.all()] == [_fields(kb)]
