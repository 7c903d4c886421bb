"""The database wait budget of a request: slow queries and lock waits end in a fast 503."""

from __future__ import annotations

import json
import time
from unittest import mock

import pytest
from django.db import connection, connections

from bailing_knowledge import services
from bailing_knowledge.deadline import bounded_database_wait
from bailing_knowledge.models import Run

from .api.conftest import AgentCaller, assert_error

pytestmark = pytest.mark.django_db(transaction=True)

TURN = {
    "client_conversation_id": "c",
    "client_turn_id": "t",
    "user_message_id": "m",
    "user_input": "refunds",
}


@pytest.fixture
def agent():
    kb = services.create_knowledge_base("handbook")
    route = services.create_route("orders", knowledge_bases=[kb])
    client = services.create_client("acme-agent", routes=[route])
    issued = services.issue_session(client, principal_id="u", routes=[route])
    return AgentCaller(issued.access_token)


@pytest.fixture
def budget(settings):
    settings.BAILING_KNOWLEDGE = {"THROTTLE_RATES": {}, "DATABASE_WAIT_MS": 500}


def _slow_query(route):
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(20)")
    return {}


def test_a_slow_query_is_cut_at_the_budget(agent, budget):
    with mock.patch("bailing_knowledge.services.capabilities", side_effect=_slow_query):
        started = time.monotonic()
        response = agent.get("/workspaces/orders/knowledge/capabilities")
        elapsed = time.monotonic() - started
    assert_error(response, 503, "knowledge_unavailable", "pg_sleep")
    assert response["Retry-After"]
    assert elapsed < 2.0
    # The broken connection was dropped: the next request gets a new one and succeeds.
    assert agent.get("/workspaces/orders/knowledge/capabilities").status_code == 200


def test_a_lock_wait_is_cut_at_the_budget_and_the_turn_survives(agent, budget):
    first = agent.post("/workspaces/orders/turns", TURN)
    assert first.status_code == 200, first.content
    holder = connections.create_connection("default")
    try:
        holder.set_autocommit(False)
        with holder.cursor() as cursor:
            cursor.execute(f"SELECT 1 FROM {Run._meta.db_table} FOR UPDATE")
        started = time.monotonic()
        response = agent.post("/workspaces/orders/turns", TURN)
        elapsed = time.monotonic() - started
        assert_error(response, 503, "knowledge_unavailable")
        assert elapsed < 2.0
    finally:
        holder.rollback()
        holder.close()
    replay = agent.post("/workspaces/orders/turns", TURN)
    assert replay.status_code == 200
    assert json.loads(replay.content) == json.loads(first.content)


def test_no_budget_when_disabled(settings, agent):
    settings.BAILING_KNOWLEDGE = {"THROTTLE_RATES": {}, "DATABASE_WAIT_MS": 0}
    with bounded_database_wait() as deadline:
        assert deadline is None
    assert agent.get("/workspaces/orders/knowledge/capabilities").status_code == 200


def test_the_budget_is_shared_by_the_queries_of_a_request(budget):
    with bounded_database_wait() as deadline, connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(0.3)")
        assert 0.1 < deadline.remaining < 0.25
        with pytest.raises(Exception, match="budget is exhausted"):
            cursor.execute("SELECT pg_sleep(0.3)")
    connection.close()
