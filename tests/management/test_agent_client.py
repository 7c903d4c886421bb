"""`agent_client create|list|update|enable|disable`."""

from __future__ import annotations

import pytest
from django.core.management.base import CommandError

from bailing_knowledge import services
from bailing_knowledge.models import Client
from tests.management import run, run_json

pytestmark = pytest.mark.django_db


@pytest.fixture
def second_route(db):
    return services.create_route("billing")


def test_create_with_routes(route, second_route):
    data = run_json(
        "agent_client",
        "create",
        "helpdesk",
        "--name",
        "Help desk",
        "--route",
        route.route_key,
        "--route",
        second_route.route_key,
        "--disabled",
    )
    assert data["app_id"] == "helpdesk"
    assert data["allowed_routes"] == ["billing", "orders"]
    assert data["enabled"] is False
    client = Client.objects.get(app_id="helpdesk")
    assert client.name == "Help desk"
    assert client.enabled is False
    assert set(client.allowed_routes.values_list("route_key", flat=True)) == {"billing", "orders"}


def test_create_with_defaults(db):
    out = run("agent_client", "create", "bare")
    assert "Created agent client bare." in out
    client = Client.objects.get(app_id="bare")
    assert client.name == "bare"
    assert client.enabled is True
    assert not client.allowed_routes.exists()


def test_create_rejects_an_unknown_route(db):
    with pytest.raises(CommandError, match="No route with route_key 'missing'"):
        run("agent_client", "create", "helpdesk", "--route", "missing")
    assert not Client.objects.exists()


def test_create_rejects_a_duplicate_app_id(agent_client):
    with pytest.raises(CommandError, match=r"APP_ID: .*already exists"):
        run("agent_client", "create", agent_client.app_id)


def test_create_rejects_an_invalid_app_id(db):
    with pytest.raises(CommandError, match="APP_ID: Enter a valid"):
        run("agent_client", "create", "bad id")


def test_an_overlong_app_id_is_reported_against_the_app_id_alone(db):
    with pytest.raises(CommandError) as caught:
        run("agent_client", "create", "a" * 500)
    assert "APP_ID: Ensure this value has at most 100 characters" in str(caught.value)
    assert "--name" not in str(caught.value)


def test_list(agent_client):
    services.create_client("zeta", enabled=False)
    data = run_json("agent_client", "list")
    assert [item["app_id"] for item in data] == ["acme-agent", "zeta"]
    assert data[0]["allowed_routes"] == ["orders"]
    assert data[1]["enabled"] is False

    out = run("agent_client", "list")
    assert out.splitlines()[0].split() == ["APP_ID", "NAME", "ENABLED", "ROUTES"]
    assert "acme-agent" in out


def test_list_empty(db):
    assert run_json("agent_client", "list") == []
    assert "No agent clients." in run("agent_client", "list")


def test_update(agent_client, second_route):
    data = run_json(
        "agent_client", "update", agent_client.app_id, "--route", second_route.route_key
    )
    assert data["allowed_routes"] == ["billing"]
    assert data["name"] == "Acme agent"

    run("agent_client", "update", agent_client.app_id, "--name", "Acme")
    agent_client.refresh_from_db()
    assert agent_client.name == "Acme"
    assert list(agent_client.allowed_routes.values_list("route_key", flat=True)) == ["billing"]

    data = run_json("agent_client", "update", agent_client.app_id, "--no-routes")
    assert data["allowed_routes"] == []
    assert not agent_client.allowed_routes.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "Nothing to update"),
        (["--route", "orders", "--no-routes"], "cannot be combined"),
        (["--route", "missing"], "No route with route_key 'missing'"),
    ],
)
def test_update_rejects_bad_input(agent_client, args, message):
    with pytest.raises(CommandError, match=message):
        run("agent_client", "update", agent_client.app_id, *args)
    assert list(agent_client.allowed_routes.values_list("route_key", flat=True)) == ["orders"]


def test_update_rejects_an_unknown_client(db):
    with pytest.raises(CommandError, match="No agent client with app_id 'missing'"):
        run("agent_client", "update", "missing", "--name", "x")


def test_disable_and_enable(agent_client):
    data = run_json("agent_client", "disable", agent_client.app_id)
    assert data["enabled"] is False
    agent_client.refresh_from_db()
    assert agent_client.enabled is False

    out = run("agent_client", "enable", agent_client.app_id)
    assert "Agent client acme-agent enabled." in out
    agent_client.refresh_from_db()
    assert agent_client.enabled is True


@pytest.mark.parametrize("subcommand", ["enable", "disable"])
def test_toggle_rejects_an_unknown_client(db, subcommand):
    with pytest.raises(CommandError, match="No agent client with app_id 'missing'"):
        run("agent_client", subcommand, "missing")
