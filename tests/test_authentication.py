"""Bearer authentication: one statement finds a live session, with its client, or nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.exceptions import AuthenticationFailed

from bailing_knowledge import access, services
from bailing_knowledge.authentication import AgentBearerAuthentication, AgentUser
from bailing_knowledge.models import AgentSession, Client, KnowledgeBase, Route, hash_token

pytestmark = pytest.mark.django_db


def _fields(instance) -> dict:
    """Every field's value, and its type: 1 would equal True, 1.0 equal 1."""
    values = {field.attname: getattr(instance, field.attname) for field in instance._meta.fields}
    return {name: (type(value), value) for name, value in values.items()}


def _expire(issued):
    AgentSession.objects.filter(pk=issued.session.pk).update(
        created_at=timezone.now() - timedelta(hours=2),
        expires_at=timezone.now() - timedelta(seconds=1),
    )


def _revoke(issued):
    services.revoke_session(issued.session)


def _disable_client(issued):
    services.set_client_enabled(issued.session.client, False)


DEAD = {"expired": _expire, "revoked": _revoke, "client disabled": _disable_client}


def test_live_session_is_the_stored_row_with_its_client(issued):
    with CaptureQueriesContext(connection) as queries:
        session = access.live_session(hash_token(issued.access_token), timezone.now())
        client = session.client
    assert len(queries) == 1
    stored = AgentSession.objects.select_related("client").get(pk=issued.session.pk)
    assert _fields(session) == _fields(stored)
    assert _fields(client) == _fields(stored.client)
    assert isinstance(client, Client)
    assert session._state.adding is False and session._state.db == "default"
    # Complete instances: reading any field later asks the database nothing.
    assert session.get_deferred_fields() == set() == client.get_deferred_fields()


@pytest.mark.parametrize("case", sorted(DEAD))
def test_live_session_refuses_a_dead_session(case, issued):
    DEAD[case](issued)
    assert access.live_session(hash_token(issued.access_token), timezone.now()) is None


@pytest.mark.parametrize("case", sorted(DEAD))
def test_live_session_and_route_refuses_a_dead_session(case, issued):
    DEAD[case](issued)
    token_hash = hash_token(issued.access_token)
    assert access.live_session_and_route(token_hash, timezone.now(), "orders") is None


def test_live_session_refuses_an_unknown_token(issued):
    assert access.live_session(hash_token(issued.access_token + "x"), timezone.now()) is None


def test_expiry_is_judged_at_the_time_given(issued):
    token_hash = hash_token(issued.access_token)
    assert access.live_session(token_hash, issued.expires_at - timedelta(seconds=1)) is not None
    assert access.live_session(token_hash, issued.expires_at) is None


@pytest.mark.parametrize(
    "token",
    ["", "A" * 47, "bka_" + "A" * 300, "bka_abc def", "bka_abc.def", "bka_abc=", "bka_ä"],
)
def test_malformed_tokens_are_refused_before_the_database(token, django_assert_num_queries):
    with django_assert_num_queries(0), pytest.raises(AuthenticationFailed):
        AgentBearerAuthentication().authenticate_credentials(token, route_key="orders")


def test_authentication_is_one_statement_when_last_seen_is_recent(issued, settings):
    settings.BAILING_KNOWLEDGE = {"SESSION_LAST_SEEN_INTERVAL": 3600}
    authentication = AgentBearerAuthentication()
    authentication.authenticate_credentials(issued.access_token)  # records last_seen
    with CaptureQueriesContext(connection) as queries:
        user, session = authentication.authenticate_credentials(issued.access_token, "orders")
        assert (user.client.app_id, str(user)) == ("acme-agent", "agent:acme-agent:user-1")
    assert len(queries) == 1
    assert isinstance(user, AgentUser) and user.session is session


def test_last_seen_costs_one_more_statement_only_when_due(issued, settings):
    settings.BAILING_KNOWLEDGE = {"SESSION_LAST_SEEN_INTERVAL": 0}
    authentication = AgentBearerAuthentication()
    with CaptureQueriesContext(connection) as queries:
        _, session = authentication.authenticate_credentials(issued.access_token)
    assert len(queries) == 2
    assert queries[1]["sql"].startswith("UPDATE")
    stored = AgentSession.objects.get(pk=session.pk).last_seen_at
    assert stored == session.last_seen_at is not None


def test_the_route_answer_stays_with_the_session_of_this_request(issued, route):
    token_hash = hash_token(issued.access_token)
    session = access.live_session_and_route(token_hash, timezone.now(), "orders")
    checked, found = access.checked_route(session, "orders")
    assert checked and found.pk == route.pk
    # Another route key, or a session loaded any other way, has no answer to reuse.
    assert access.checked_route(session, "billing") == (False, None)
    assert access.checked_route(issued.session, "orders") == (False, None)
    fresh = access.live_session(token_hash, timezone.now())
    assert access.checked_route(fresh, "orders") == (False, None)


def test_a_live_session_with_a_forbidden_route_is_still_authenticated(issued, route):
    services.set_route_enabled(route, False)
    token_hash = hash_token(issued.access_token)
    session = access.live_session_and_route(token_hash, timezone.now(), "orders")
    assert session.pk == issued.session.pk
    assert access.checked_route(session, "orders") == (True, None)


# What each function of migration 0006 answers: the rows of these models, keyed by column.
ANSWERS = {
    "bailing_knowledge_live_session": {"session": AgentSession, "client": Client},
    "bailing_knowledge_admitted_route": {"route": Route, "knowledge_bases": KnowledgeBase},
    "bailing_knowledge_live_session_and_route": {
        "session": AgentSession,
        "client": Client,
        "route": Route,
        "knowledge_bases": KnowledgeBase,
    },
}


def _answer(function: str, issued) -> dict:
    session = issued.session
    token_hash, now = hash_token(issued.access_token), timezone.now()
    params = {
        "bailing_knowledge_live_session": [token_hash, now],
        "bailing_knowledge_admitted_route": [
            "orders",
            session.principal_audience,
            session.client_id,
            session.pk,
        ],
        "bailing_knowledge_live_session_and_route": [token_hash, now, "orders"],
    }[function]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {function}({', '.join(['%s'] * len(params))})", params)
        return cursor.fetchone()[0]


@pytest.mark.parametrize("function", sorted(ANSWERS))
def test_access_functions_return_every_field_of_their_models(function, issued):
    # The functions list their columns: a field added to, removed from or renamed in one of
    # these models needs a migration that replaces them (see migration 0006).
    answer = _answer(function, issued)
    assert set(answer) == set(ANSWERS[function])
    for key, model in ANSWERS[function].items():
        rows = answer[key] if key == "knowledge_bases" else [answer[key]]
        assert rows
        for row in rows:
            assert sorted(row) == sorted(field.column for field in model._meta.concrete_fields)


def test_a_function_behind_the_models_is_refused_loudly(issued, monkeypatch):
    # As if a field had been added without replacing the function: nothing half-loaded.
    lagging = "SELECT (bailing_knowledge_live_session(%s, %s)::jsonb #- '{session,device_label}')"
    monkeypatch.setattr(access, "_LIVE_SESSION", lagging)
    with pytest.raises(ImproperlyConfigured, match="AgentSession column 'device_label'"):
        access.live_session(hash_token(issued.access_token), timezone.now())


@pytest.mark.parametrize(("use_tz", "time_zone"), [(True, "UTC"), (False, "Asia/Shanghai")])
def test_session_timestamps_are_what_the_orm_loads(use_tz, time_zone, issued, settings):
    settings.USE_TZ, settings.TIME_ZONE = use_tz, time_zone
    AgentBearerAuthentication().authenticate_credentials(issued.access_token)  # last_seen_at
    session = access.live_session(hash_token(issued.access_token), timezone.now())
    stored = AgentSession.objects.select_related("client").get(pk=issued.session.pk)
    assert _fields(session) == _fields(stored)
    assert _fields(session.client) == _fields(stored.client)
    names = ["created_at", "expires_at", "last_seen_at"]
    zones = [getattr(session, name).tzinfo for name in names]
    assert zones == [getattr(stored, name).tzinfo for name in names]
    assert all((zone is not None) == use_tz for zone in zones)
