"""The capabilities endpoint: exact body and the scope revision's behaviour."""

from __future__ import annotations

import json

import pytest

from bailing_knowledge import services
from bailing_knowledge.models import Document, content_hash

pytestmark = pytest.mark.django_db

URL = "/workspaces/orders/knowledge/capabilities"


def _body(agent):
    response = agent.get(URL)
    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    return json.loads(response.content)


def test_exact_body(agent, route):
    assert _body(agent) == {
        "schema_version": "bailing.agent-knowledge-capabilities.v1",
        "protocol": "bailing.agent-knowledge.v1",
        "supported": True,
        "route": "orders",
        "enabled": True,
        "knowledge_scope_revision": route.knowledge_scope_revision,
        "delivery_modes": ["inline", "on_demand"],
        "limits": {
            "search_max_results": 3,
            "search_max_bytes": 4096,
            "read_default_bytes": 16384,
            "read_max_bytes": 32768,
            "reference_ttl_seconds": 300,
            "read_chain_max_bytes": 131072,
        },
    }


def test_enabled_needs_knowledge_on_and_an_enabled_kb(agent, route, kb):
    services.set_knowledge_base_enabled(kb, False)
    assert _body(agent)["enabled"] is False
    services.set_knowledge_base_enabled(kb, True)
    services.update_route(route, knowledge_enabled=False)
    assert _body(agent)["enabled"] is False
    services.update_route(route, knowledge_enabled=True, knowledge_bases=[])
    assert _body(agent)["enabled"] is False


def _revision(agent):
    return _body(agent)["knowledge_scope_revision"]


def test_scope_revision_is_stable_across_calls(agent):
    assert _revision(agent) == _revision(agent)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda route, kb: services.set_knowledge_base_enabled(kb, False), id="kb-off"),
        pytest.param(
            lambda route, kb: services.bind_knowledge_bases(
                route, [services.create_knowledge_base("extra")]
            ),
            id="kb-added",
        ),
        pytest.param(
            lambda route, kb: services.unbind_knowledge_bases(route, [kb]), id="kb-removed"
        ),
        pytest.param(lambda route, kb: services.update_route(route, top_k=9), id="top_k"),
        pytest.param(lambda route, kb: services.update_route(route, min_score=0.4), id="min_score"),
        pytest.param(lambda route, kb: services.update_route(route, max_docs=1), id="max_docs"),
        pytest.param(
            lambda route, kb: services.update_route(route, knowledge_mode="document"), id="mode"
        ),
        pytest.param(
            lambda route, kb: services.update_route(route, knowledge_enabled=False),
            id="knowledge-off",
        ),
    ],
)
def test_scope_revision_changes_with_configuration(agent, route, kb, change):
    before = _revision(agent)
    change(route, kb)
    assert _revision(agent) != before


def test_scope_revision_comes_back_when_a_kb_is_re_enabled(agent, kb):
    before = _revision(agent)
    services.set_knowledge_base_enabled(kb, False)
    services.set_knowledge_base_enabled(kb, True)
    assert _revision(agent) == before


def test_scope_revision_ignores_documents(agent, kb):
    before = _revision(agent)
    Document.objects.create(
        knowledge_base=kb,
        source_key="new.md",
        title="New",
        body="Text",
        content_hash=content_hash("New", "Text"),
        status=Document.Status.READY,
    )
    assert _revision(agent) == before


def test_scope_revision_ignores_access_settings(agent, route):
    before = _revision(agent)
    services.update_route(route, audiences=["staff"], name="Renamed")
    assert _revision(agent) == before
