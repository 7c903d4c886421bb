"""Issuing, listing and revoking agent sessions; tokens never stored in the clear."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test import Client
from django.utils import timezone

from bailing_knowledge import services
from bailing_knowledge.models import AgentSession
from tests.api.conftest import BASE

pytestmark = pytest.mark.django_db


def test_issue_returns_a_prefixed_high_entropy_token(issued):
    token = issued.access_token
    assert token.startswith("bka_")
    assert len(token) >= 4 + 43
    assert issued.session.token_hash == hashlib.sha256(token.encode()).hexdigest()
    assert token not in repr(issued)


def test_tokens_are_unique(agent_client, route):
    tokens = {
        services.issue_session(agent_client, principal_id="u", routes=[route]).access_token
        for _ in range(20)
    }
    assert len(tokens) == 20


def test_issue_records_the_principal(issued, route):
    session = AgentSession.objects.get(pk=issued.session.pk)
    assert session.principal == {
        "id": "user-1",
        "tenant": "acme",
        "roles": ["support"],
        "audience": "staff",
    }
    assert list(session.allowed_routes.all()) == [route]
    lifetime = session.expires_at - session.created_at
    assert lifetime == timedelta(hours=8)


def test_no_raw_token_anywhere_in_the_database(issued):
    token = issued.access_token
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND data_type IN "
            "('text', 'character varying', 'character', 'jsonb', 'json', 'ARRAY')"
        )
        columns = cursor.fetchall()
        for table, column in columns:
            cursor.execute(
                f'SELECT count(*) FROM "{table}" WHERE "{column}"::text LIKE %s',
                [f"%{token[4:]}%"],
            )
            assert cursor.fetchone()[0] == 0, (table, column)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"principal_id": " "}, "principal_id"),
        ({"routes": []}, "routes"),
        ({"lifetime": 0}, "lifetime"),
        ({"lifetime": timedelta(days=365)}, "lifetime"),
        ({"lifetime": True}, "lifetime"),
        ({"lifetime": 10**30}, "lifetime"),
        ({"lifetime": 1.5}, "lifetime"),
        ({"roles": ["", "x"]}, "principal_roles"),
    ],
)
def test_issue_rejects_bad_input(agent_client, route, kwargs, field):
    args = {"principal_id": "u", "routes": [route], **kwargs}
    with pytest.raises(ValidationError) as info:
        services.issue_session(agent_client, **args)
    assert field in info.value.message_dict
    assert not AgentSession.objects.exists()


def test_issue_refuses_routes_outside_the_client(agent_client):
    services.create_route("elsewhere")
    with pytest.raises(ValidationError, match="elsewhere"):
        services.issue_session(agent_client, principal_id="u", routes=["elsewhere"])


def test_issue_names_the_routes_that_refuse_the_sessions_audience(agent_client, route):
    """Issuing still succeeds (a route's audiences may change later), but says which of its
    routes would refuse every call, as the request's own check does."""
    staff = services.create_route("staff-only", audiences=["staff"])
    services.update_client(agent_client, routes=[route, staff])

    plain = services.issue_session(agent_client, principal_id="u", routes=[route, staff])
    assert plain.refused_routes == ("staff-only",)
    assert plain.refused_routes_warning() == (
        "The session has no audience, which route(s) 'staff-only' do not admit: its calls "
        "there will answer 403 route_not_allowed until those routes admit it."
    )
    guest = services.issue_session(agent_client, principal_id="u", routes=[staff], audience="guest")
    assert guest.refused_routes == ("staff-only",)
    assert "audience 'guest'" in guest.refused_routes_warning()
    admitted = services.issue_session(
        agent_client, principal_id="u", routes=[route, staff], audience="staff"
    )
    assert admitted.refused_routes == () and admitted.refused_routes_warning() is None

    http = Client()
    for issued, key, status in [
        (plain, "staff-only", 403),
        (plain, "orders", 200),
        (guest, "staff-only", 403),
        (admitted, "staff-only", 200),
    ]:
        response = http.get(
            f"{BASE}/workspaces/{key}/knowledge/capabilities",
            headers={"Authorization": f"Bearer {issued.access_token}"},
        )
        assert response.status_code == status, (key, response.content)


def test_issue_refuses_a_disabled_client(agent_client, route):
    services.set_client_enabled(agent_client, False)
    with pytest.raises(ValidationError, match="disabled"):
        services.issue_session(agent_client, principal_id="u", routes=[route])


def test_list_sessions_filters(issued, agent_client, route):
    other = services.issue_session(agent_client, principal_id="user-2", routes=[route])
    services.revoke_session(other.session)
    assert list(services.list_sessions(active=True)) == [issued.session]
    assert list(services.list_sessions(active=False)) == [other.session]
    assert list(services.list_sessions(principal_id="user-2")) == [other.session]
    assert services.list_sessions(client="acme-agent", route="orders").count() == 2


def test_list_sessions_counts_expired_as_inactive(issued):
    AgentSession.objects.filter(pk=issued.session.pk).update(
        created_at=timezone.now() - timedelta(hours=2),
        expires_at=timezone.now() - timedelta(hours=1),
    )
    assert not services.list_sessions(active=True).exists()


def test_revoke_is_idempotent(issued):
    first = services.revoke_session(issued.session.session_id).revoked_at
    assert first is not None
    assert services.revoke_session(issued.session).revoked_at == first


def test_revoke_unknown_session():
    with pytest.raises(AgentSession.DoesNotExist):
        services.revoke_session("ses_missing")
