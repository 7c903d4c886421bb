"""`knowledge_route create|list|update`."""

from __future__ import annotations

import pytest
from django.core.management.base import CommandError

from bailing_knowledge import services
from bailing_knowledge.models import Route
from tests.management import run, run_json

pytestmark = pytest.mark.django_db


@pytest.fixture
def second_kb(db):
    return services.create_knowledge_base("faq", title="FAQ")


def test_create_with_every_option(kb, second_kb):
    data = run_json(
        "knowledge_route",
        "create",
        "support",
        "--name",
        "Support desk",
        "--kb",
        kb.slug,
        "--kb",
        second_kb.slug,
        "--audience",
        "staff",
        "--audience",
        "partners",
        "--disabled",
        "--agent-client",
        "off",
        "--knowledge",
        "off",
        "--top-k",
        "12",
        "--min-score",
        "0.25",
        "--max-docs",
        "7",
        "--mode",
        "document",
    )
    route = Route.objects.get(route_key="support")
    assert data["route_key"] == "support"
    assert data["knowledge_bases"] == ["faq", "handbook"]
    assert data["knowledge_scope_revision"] == route.knowledge_scope_revision
    assert route.name == "Support desk"
    assert route.allowed_audiences == ["staff", "partners"]
    assert route.enabled is False
    assert route.agent_client_enabled is False
    assert route.knowledge_enabled is False
    assert (route.top_k, route.min_score, route.max_docs) == (12, 0.25, 7)
    assert route.knowledge_mode == Route.Mode.DOCUMENT
    assert set(route.knowledge_bases.values_list("slug", flat=True)) == {"faq", "handbook"}


def test_create_with_defaults(db):
    out = run("knowledge_route", "create", "plain")
    assert "Created route plain." in out
    route = Route.objects.get(route_key="plain")
    assert route.name == "plain"
    assert route.enabled and route.agent_client_enabled and route.knowledge_enabled
    assert (route.top_k, route.min_score, route.max_docs) == (5, 0.0, 3)
    assert route.knowledge_mode == Route.Mode.CHUNK
    assert route.allowed_audiences == []
    assert not route.knowledge_bases.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--top-k", "0"], r"--top-k: Ensure this value is greater than or equal to 1"),
        (["--top-k", "51"], r"--top-k: Ensure this value is less than or equal to 50"),
        (["--top-k", "many"], r"invalid int value"),
        (["--min-score", "1.5"], r"--min-score: Ensure this value is less than or equal to 1"),
        (["--min-score", "nan"], r"expected a finite number"),
        (["--max-docs", "21"], r"--max-docs: Ensure this value is less than or equal to 20"),
        (["--mode", "paragraph"], r"invalid choice"),
        (["--agent-client", "maybe"], r"expected 'on' or 'off'"),
        (["--audience", " "], r"--audience: Audiences must be non-empty"),
        (["--kb", "missing"], r"No knowledge base with slug 'missing'"),
    ],
)
def test_create_rejects_bad_settings(db, args, message):
    with pytest.raises(CommandError, match=message):
        run("knowledge_route", "create", "bad", *args)
    assert not Route.objects.filter(route_key="bad").exists()


def test_create_rejects_a_duplicate_key(route):
    with pytest.raises(CommandError, match=r"ROUTE_KEY: .*already exists"):
        run("knowledge_route", "create", route.route_key)


def test_create_rejects_an_invalid_key(db):
    with pytest.raises(CommandError, match="ROUTE_KEY: Enter a valid"):
        run("knowledge_route", "create", "no spaces")


def test_an_overlong_key_is_reported_against_the_key_alone(db):
    with pytest.raises(CommandError) as caught:
        run("knowledge_route", "create", "r" * 500)
    assert "ROUTE_KEY: Ensure this value has at most 64 characters" in str(caught.value)
    assert "--name" not in str(caught.value)


def test_list(route, second_kb):
    services.create_route("empty", audiences=["staff"], knowledge_mode="document")
    data = run_json("knowledge_route", "list")
    assert [item["route_key"] for item in data] == ["empty", "orders"]
    empty, orders = data
    assert empty["knowledge_bases"] == []
    assert empty["allowed_audiences"] == ["staff"]
    assert empty["knowledge_mode"] == "document"
    assert orders["knowledge_bases"] == ["handbook"]
    assert orders["name"] == "Order assistant"
    assert orders["knowledge_scope_revision"] == route.knowledge_scope_revision
    for key in ("enabled", "agent_client_enabled", "knowledge_enabled", "top_k", "min_score"):
        assert key in orders

    out = run("knowledge_route", "list")
    assert out.splitlines()[0].startswith("ROUTE_KEY")
    assert "handbook" in out


def test_list_empty(db):
    assert run_json("knowledge_route", "list") == []
    assert "No routes." in run("knowledge_route", "list")


def test_update_changes_only_the_given_settings(route):
    before = route.knowledge_scope_revision
    data = run_json("knowledge_route", "update", route.route_key, "--top-k", "9")
    route.refresh_from_db()
    assert route.top_k == 9
    assert route.name == "Order assistant"
    assert route.max_docs == 3
    assert data["knowledge_bases"] == ["handbook"]
    assert data["knowledge_scope_revision"] != before


def test_update_switches(route):
    run(
        "knowledge_route",
        "update",
        route.route_key,
        "--disable",
        "--agent-client",
        "off",
        "--knowledge",
        "off",
        "--mode",
        "document",
        "--min-score",
        "0.5",
        "--max-docs",
        "10",
        "--name",
        "Orders",
    )
    route.refresh_from_db()
    assert route.enabled is False
    assert route.agent_client_enabled is False
    assert route.knowledge_enabled is False
    assert (route.knowledge_mode, route.min_score, route.max_docs) == ("document", 0.5, 10)
    assert route.name == "Orders"

    run("knowledge_route", "update", route.route_key, "--enable", "--agent-client", "on")
    route.refresh_from_db()
    assert route.enabled is True
    assert route.agent_client_enabled is True
    assert route.knowledge_enabled is False


def test_update_knowledge_bases(route, kb, second_kb):
    data = run_json("knowledge_route", "update", route.route_key, "--add-kb", second_kb.slug)
    assert data["knowledge_bases"] == ["faq", "handbook"]

    data = run_json("knowledge_route", "update", route.route_key, "--remove-kb", kb.slug)
    assert data["knowledge_bases"] == ["faq"]

    data = run_json("knowledge_route", "update", route.route_key, "--kb", kb.slug)
    assert data["knowledge_bases"] == ["handbook"]
    assert list(route.knowledge_bases.values_list("slug", flat=True)) == ["handbook"]

    data = run_json("knowledge_route", "update", route.route_key, "--no-kbs")
    assert data["knowledge_bases"] == []
    assert not route.knowledge_bases.exists()


def test_update_audiences(route):
    run_json("knowledge_route", "update", route.route_key, "--audience", "a", "--audience", "b")
    route.refresh_from_db()
    assert route.allowed_audiences == ["a", "b"]

    run_json("knowledge_route", "update", route.route_key, "--no-audiences")
    route.refresh_from_db()
    assert route.allowed_audiences == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--top-k", "0"], "--top-k: Ensure this value is greater than or equal to 1"),
        (["--max-docs", "0"], "--max-docs: Ensure this value is greater than or equal to 1"),
        (["--add-kb", "missing"], "No knowledge base with slug 'missing'"),
        (["--kb", "handbook", "--no-kbs"], "cannot be combined"),
        (["--audience", "a", "--no-audiences"], "cannot be combined"),
        (["--enable", "--disable"], "not allowed with argument"),
        ([], "Nothing to update"),
    ],
)
def test_update_rejects_bad_input(route, args, message):
    before = route.knowledge_scope_revision
    with pytest.raises(CommandError, match=message):
        run("knowledge_route", "update", route.route_key, *args)
    route.refresh_from_db()
    assert route.top_k == 5
    assert route.knowledge_scope_revision == before


def test_update_rejects_an_unknown_route(db):
    with pytest.raises(CommandError, match="No route with route_key 'missing'"):
        run("knowledge_route", "update", "missing", "--top-k", "3")
