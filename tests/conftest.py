"""Fixtures that build real rows through the public services."""

from __future__ import annotations

import pytest

from bailing_knowledge import services


@pytest.fixture
def kb(db):
    return services.create_knowledge_base("handbook", title="Handbook")


@pytest.fixture
def route(kb):
    return services.create_route("orders", name="Order assistant", knowledge_bases=[kb])


@pytest.fixture
def agent_client(route):
    return services.create_client("acme-agent", name="Acme agent", routes=[route])


@pytest.fixture
def issued(agent_client, route):
    return services.issue_session(
        agent_client,
        principal_id="user-1",
        tenant="acme",
        roles=["support"],
        audience="staff",
        routes=[route],
    )
