"""`agent_session issue|list|revoke`, and that no token ever leaks into a listing."""

from __future__ import annotations

import hashlib
import io
import json
from datetime import datetime, timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from bailing_knowledge import services
from bailing_knowledge.models import AgentSession
from tests.management import run, run_json

pytestmark = pytest.mark.django_db


@pytest.fixture
def billing(agent_client):
    """A second route the client may use."""
    route = services.create_route("billing")
    agent_client.allowed_routes.add(route)
    return route


def _issue(*extra: str) -> dict:
    return run_json(
        "agent_session", "issue", "acme-agent", "--principal", "user-9", "--route", "orders", *extra
    )


def test_issue_json_returns_the_token_once(agent_client, route, billing):
    data = run_json(
        "agent_session",
        "issue",
        agent_client.app_id,
        "--principal",
        "user-9",
        "--tenant",
        "acme",
        "--role",
        "support",
        "--role",
        "lead",
        "--audience",
        "staff",
        "--on-behalf-of",
        "manager-1",
        "--route",
        route.route_key,
        "--route",
        billing.route_key,
        "--lifetime",
        "30m",
        "--device-label",
        "ci runner",
    )
    session = AgentSession.objects.get(session_id=data["session_id"])
    assert hashlib.sha256(data["access_token"].encode()).hexdigest() == session.token_hash
    assert datetime.fromisoformat(data["expires_at"]) == session.expires_at
    assert session.expires_at - session.created_at == timedelta(minutes=30)
    assert session.client == agent_client
    assert session.principal == {
        "id": "user-9",
        "tenant": "acme",
        "roles": ["support", "lead"],
        "audience": "staff",
    }
    assert session.on_behalf_of == "manager-1"
    assert session.device_label == "ci runner"
    assert set(session.allowed_routes.values_list("route_key", flat=True)) == {"orders", "billing"}
    assert data["session"]["routes"] == ["billing", "orders"]
    assert data["session"]["status"] == "active"
    assert "token_hash" not in data["session"]


def test_issue_text_prints_the_token_with_a_warning(agent_client):
    out = run("agent_session", "issue", "acme-agent", "--principal", "user-9", "--route", "orders")
    session = AgentSession.objects.get(principal_id="user-9")
    assert f"Issued session {session.session_id}." in out
    assert "will not be shown again" in out
    token = out.strip().splitlines()[-1]
    assert hashlib.sha256(token.encode()).hexdigest() == session.token_hash
    assert out.count(token) == 1
    assert session.token_hash not in out


def test_issue_warns_on_stderr_when_a_route_refuses_the_audience(agent_client):
    services.update_route("orders", audiences=["staff"])
    for extra in ((), ("--json",)):
        out, err = io.StringIO(), io.StringIO()
        args = ("issue", "acme-agent", "--principal", "user-9", "--route", "orders", *extra)
        call_command("agent_session", *args, stdout=out, stderr=err)
        assert err.getvalue().strip() == (
            "Warning: The session has no audience, which route(s) 'orders' do not admit: its "
            "calls there will answer 403 route_not_allowed until those routes admit it."
        )
        if extra:
            assert json.loads(out.getvalue())["access_token"]  # stdout stays one document
    err = io.StringIO()
    call_command(
        "agent_session", "issue", "acme-agent", "--principal", "u", "--route", "orders",
        "--audience", "staff", stdout=io.StringIO(), stderr=err,
    )  # fmt: skip
    assert err.getvalue() == ""


def test_issue_uses_the_default_lifetime(agent_client):
    data = _issue()
    session = AgentSession.objects.get(session_id=data["session_id"])
    assert session.expires_at - session.created_at == timedelta(hours=8)


@pytest.mark.parametrize(
    ("lifetime", "expected"),
    [
        ("3600", timedelta(hours=1)),
        ("90s", timedelta(seconds=90)),
        ("8h", timedelta(hours=8)),
        ("7D", timedelta(days=7)),
        ("2w", timedelta(weeks=2)),
    ],
)
def test_issue_lifetime_forms(agent_client, lifetime, expected):
    data = _issue("--lifetime", lifetime)
    session = AgentSession.objects.get(session_id=data["session_id"])
    assert session.expires_at - session.created_at == expected


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--route", "orders"], "the following arguments are required: --principal"),
        (["--principal", "user-9"], "the following arguments are required: --route"),
        (["--principal", " ", "--route", "orders"], "--principal: A principal id is required"),
        (["--principal", "u", "--route", "billing"], "--route: Not among client 'acme-agent'"),
        (["--principal", "u", "--route", "missing"], "No route with route_key 'missing'"),
        (["--principal", "u", "--route", "orders", "--lifetime", "soon"], "--lifetime"),
        (["--principal", "u", "--route", "orders", "--lifetime=-5m"], "expected seconds"),
        (["--principal", "u", "--route", "orders", "--lifetime", "0"], "must be positive"),
        (["--principal", "u", "--route", "orders", "--lifetime", "31d"], "may not exceed"),
        (["--principal", "u", "--route", "orders", "--lifetime", "9" * 15 + "w"], "too large"),
        (["--principal", "u", "--route", "orders", "--role", ""], "--role: Roles must be"),
    ],
)
def test_issue_rejects_bad_input(agent_client, args, message):
    services.create_route("billing")  # exists, but is not among the client's routes
    with pytest.raises(CommandError, match=message):
        run("agent_session", "issue", agent_client.app_id, *args)
    assert not AgentSession.objects.exists()


def test_issue_rejects_an_unknown_client(route):
    with pytest.raises(CommandError, match="No agent client with app_id 'missing'"):
        run("agent_session", "issue", "missing", "--principal", "u", "--route", route.route_key)


def test_issue_rejects_a_disabled_client(agent_client, route):
    services.set_client_enabled(agent_client, False)
    with pytest.raises(CommandError, match="APP_ID: Client 'acme-agent' is disabled"):
        run("agent_session", "issue", "acme-agent", "--principal", "u", "--route", "orders")


def test_list_never_shows_a_token(agent_client, issued):
    second = services.issue_session(agent_client, principal_id="user-2", routes=["orders"])
    secrets = [issued.access_token, second.access_token]
    hashes = [issued.session.token_hash, second.session.token_hash]

    json_out = run("agent_session", "list", "--json")
    text_out = run("agent_session", "list")
    for out in (json_out, text_out):
        for secret in secrets + hashes:
            assert secret not in out
        assert "token_hash" not in out

    data = run_json("agent_session", "list")
    assert [item["session_id"] for item in data] == [second.session_id, issued.session_id]
    assert data[1]["token_hint"] == issued.session.token_hint
    assert data[1]["principal"]["id"] == "user-1"
    assert data[1]["routes"] == ["orders"]
    assert issued.session_id in text_out
    assert text_out.splitlines()[0].split()[0] == "SESSION_ID"


def test_list_filters(agent_client, route, billing, issued):
    other_client = services.create_client("other", routes=[billing])
    on_billing = services.issue_session(agent_client, principal_id="user-2", routes=[billing])
    other = services.issue_session(other_client, principal_id="user-1", routes=[billing])
    revoked = services.issue_session(agent_client, principal_id="user-3", routes=[route])
    services.revoke_session(revoked.session)
    expired = services.issue_session(agent_client, principal_id="user-4", routes=[route])
    AgentSession.objects.filter(pk=expired.session.pk).update(
        created_at=timezone.now() - timedelta(days=2), expires_at=timezone.now() - timedelta(days=1)
    )

    def ids(*args: str) -> set[str]:
        return {item["session_id"] for item in run_json("agent_session", "list", *args)}

    assert ids("--client", "other") == {other.session_id}
    assert ids("--principal", "user-1") == {issued.session_id, other.session_id}
    assert ids("--route", "billing") == {on_billing.session_id, other.session_id}
    assert ids("--active", "--client", "acme-agent") == {
        issued.session_id,
        on_billing.session_id,
    }
    assert ids("--inactive") == {revoked.session_id, expired.session_id}

    statuses = {item["session_id"]: item["status"] for item in run_json("agent_session", "list")}
    assert statuses[revoked.session_id] == "revoked"
    assert statuses[expired.session_id] == "expired"
    assert statuses[issued.session_id] == "active"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--client", "missing"], "No agent client with app_id 'missing'"),
        (["--route", "missing"], "No route with route_key 'missing'"),
        (["--active", "--inactive"], "not allowed with argument"),
    ],
)
def test_list_rejects_bad_filters(db, args, message):
    with pytest.raises(CommandError, match=message):
        run("agent_session", "list", *args)


def test_list_empty(db):
    assert run_json("agent_session", "list") == []
    assert "No sessions." in run("agent_session", "list")


def test_revoke(issued):
    data = run_json("agent_session", "revoke", issued.session_id)
    session = AgentSession.objects.get(pk=issued.session.pk)
    assert session.revoked_at is not None
    assert data["status"] == "revoked"
    assert datetime.fromisoformat(data["revoked_at"]) == session.revoked_at
    assert issued.access_token not in str(data)

    # Revoking again is harmless and keeps the first revocation time.
    out = run("agent_session", "revoke", issued.session_id)
    assert f"Session {issued.session_id} revoked at {session.revoked_at.isoformat()}." in out
    assert AgentSession.objects.get(pk=session.pk).revoked_at == session.revoked_at


def test_revoke_rejects_an_unknown_session(db):
    with pytest.raises(CommandError, match="No agent session with session_id 'ses_missing'"):
        run("agent_session", "revoke", "ses_missing")


def test_revoke_requires_a_session_id(db):
    with pytest.raises(CommandError, match="required"):
        run("agent_session", "revoke")
