"""Knowledge bases, routes and clients through the service API."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from bailing_knowledge import services
from bailing_knowledge.models import Client, KnowledgeBase, Route

pytestmark = pytest.mark.django_db


def test_create_knowledge_base_defaults():
    kb = services.create_knowledge_base("faq")
    assert (kb.title, kb.embedder, kb.enabled, kb.tenant) == ("faq", "default", True, "")
    assert kb.language == "english"


@pytest.mark.parametrize("language", ["german", "simple", "russian"])
def test_create_knowledge_base_in_a_language(language):
    services.create_knowledge_base("faq", language=language)
    assert KnowledgeBase.objects.get(slug="faq").language == language


def test_create_knowledge_base_rejects_an_unknown_language():
    with pytest.raises(ValidationError) as caught:
        services.create_knowledge_base("faq", language="klingon")
    assert "Unknown language 'klingon'" in caught.value.message_dict["language"][0]
    assert not KnowledgeBase.objects.exists()


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("not a slug",), {}),
        (("",), {}),
        (("faq",), {"embedder": "missing"}),
        (("faq",), {"language": "English"}),
        (("x" * 65,), {}),
    ],
)
def test_create_knowledge_base_rejects_bad_input(args, kwargs):
    with pytest.raises(ValidationError):
        services.create_knowledge_base(*args, **kwargs)
    assert not KnowledgeBase.objects.exists()


def test_create_knowledge_base_rejects_duplicates(kb):
    with pytest.raises(ValidationError):
        services.create_knowledge_base(kb.slug)


def test_toggle_knowledge_base(kb):
    assert services.set_knowledge_base_enabled("handbook", False).enabled is False
    assert KnowledgeBase.objects.get(pk=kb.pk).enabled is False
    assert services.set_knowledge_base_enabled(kb, True).enabled is True


def test_unknown_keys_raise_does_not_exist():
    with pytest.raises(KnowledgeBase.DoesNotExist, match="nope"):
        services.set_knowledge_base_enabled("nope", True)
    with pytest.raises(Route.DoesNotExist):
        services.update_route("nope", top_k=3)
    with pytest.raises(Client.DoesNotExist):
        services.set_client_enabled("nope", False)


def test_create_route_with_everything(kb):
    route = services.create_route(
        "orders",
        name="Orders",
        knowledge_bases=["handbook"],
        audiences=["staff", "staff", "partners"],
        agent_client_enabled=False,
        top_k=8,
        min_score=0.25,
        max_docs=2,
        knowledge_mode="document",
    )
    route = Route.objects.get(pk=route.pk)
    assert list(route.knowledge_bases.all()) == [kb]
    assert route.allowed_audiences == ["staff", "partners"]
    assert (route.top_k, route.min_score, route.max_docs, route.knowledge_mode) == (
        8,
        0.25,
        2,
        "document",
    )
    assert route.agent_client_enabled is False


@pytest.mark.parametrize(
    "kwargs",
    [
        {"top_k": 0},
        {"top_k": 51},
        {"min_score": 1.5},
        {"min_score": float("nan")},
        {"max_docs": 0},
        {"knowledge_mode": "paragraph"},
        {"audiences": [" "]},
        {"knowledge_bases": ["missing"]},
    ],
)
def test_create_route_rejects_bad_input_and_writes_nothing(kwargs, db):
    with pytest.raises((ValidationError, KnowledgeBase.DoesNotExist)):
        services.create_route("orders", **kwargs)
    assert not Route.objects.exists()


def test_update_route_changes_only_what_is_given(route, kb):
    services.update_route(route, top_k=9, audiences=["staff"])
    route = Route.objects.get(pk=route.pk)
    assert (route.top_k, route.max_docs, route.allowed_audiences) == (9, 3, ["staff"])
    assert list(route.knowledge_bases.all()) == [kb]


def test_update_route_edits_the_kb_set(route, kb):
    extra = services.create_knowledge_base("extra")
    services.update_route(route, add_knowledge_bases=["extra"])
    assert set(route.knowledge_bases.all()) == {kb, extra}
    services.update_route(route, remove_knowledge_bases=[kb])
    assert list(route.knowledge_bases.all()) == [extra]
    services.update_route(route, knowledge_bases=[])
    assert not route.knowledge_bases.exists()


def test_update_route_is_atomic(route, kb):
    with pytest.raises(KnowledgeBase.DoesNotExist):
        services.update_route(route, top_k=9, knowledge_bases=["missing"])
    assert Route.objects.get(pk=route.pk).top_k == 5
    with pytest.raises(ValidationError):
        services.update_route(route, top_k=0)
    with pytest.raises(ValidationError, match="colour"):
        services.update_route(route, colour="blue")


def test_route_switches(route):
    assert services.set_route_enabled("orders", False).enabled is False
    assert services.set_agent_client_enabled("orders", False).agent_client_enabled is False
    route = Route.objects.get(pk=route.pk)
    assert (route.enabled, route.agent_client_enabled) == (False, False)


def test_clients(route):
    client = services.create_client("acme", routes=["orders"])
    assert list(client.allowed_routes.all()) == [route]
    assert services.set_client_enabled("acme", False).enabled is False
    services.update_client(client, name="Acme", routes=[])
    client = Client.objects.get(pk=client.pk)
    assert (client.name, client.enabled, client.allowed_routes.count()) == ("Acme", False, 0)


@pytest.mark.parametrize("kwargs", [{"app_id": "bad id"}, {"app_id": "ok", "routes": ["nope"]}])
def test_create_client_rejects_bad_input(kwargs, db):
    with pytest.raises((ValidationError, Route.DoesNotExist)):
        services.create_client(**kwargs)
    assert not Client.objects.exists()
