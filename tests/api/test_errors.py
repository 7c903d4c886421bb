"""The error contract: envelope, no-store everywhere, JSON only, quiet failures."""

from __future__ import annotations

import json
import logging
import time
from unittest import mock

import pytest
from django.db import DataError, OperationalError, connection
from psycopg.pq import TransactionStatus

from .conftest import BASE, AgentCaller, assert_error

pytestmark = pytest.mark.django_db

URL = "/workspaces/orders/knowledge/capabilities"


@pytest.mark.parametrize(
    "path",
    [
        "/nope",
        "/workspaces/orders/knowledge/unknown",
        "/workspaces/orders/knowledge/capabilities/",
        "/workspaces/bad route/knowledge/capabilities",
        "/",
        "/nope%0Anope",
        "/workspaces/orders%0A/knowledge/capabilities",
        "/%0A",
    ],
)
def test_unknown_paths_are_json_404_with_no_store(anonymous, path):
    assert_error(anonymous.get(path), 404, "not_found")


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
def test_wrong_method_is_json_405_with_no_store(agent, route, method):
    response = agent.call(method, URL, {"x": 1})
    assert_error(response, 405, "method_not_allowed")
    assert "GET" in response["Allow"]


def test_wrong_method_without_token_is_401_not_405(anonymous, route):
    assert_error(anonymous.post(URL, {}), 401, "unauthorized")


def test_accept_header_cannot_change_the_format(agent, route):
    plain = agent.get(URL)
    for accept in ["application/json; indent=8", "text/html", "application/xml", "*/*"]:
        response = agent.get(URL, headers={"Accept": accept})
        assert response.status_code == 200
        assert response["Content-Type"] == "application/json"
        assert response.content == plain.content


def test_throttle_answers_429_with_retry_after(agent, issued, route, settings):
    settings.BAILING_KNOWLEDGE = {"THROTTLE_RATES": {"session": "2/min", "client": None}}
    from django.core.cache import cache

    cache.clear()
    assert agent.get(URL).status_code == 200
    assert agent.get(URL).status_code == 200
    response = agent.get(URL)
    assert_error(response, 429, "rate_limited", issued.access_token)
    assert int(response["Retry-After"]) >= 1


def test_client_throttle_counts_all_sessions_of_the_client(agent, route, settings, agent_client):
    from bailing_knowledge import services

    from .conftest import AgentCaller

    settings.BAILING_KNOWLEDGE = {"THROTTLE_RATES": {"session": None, "client": "1/min"}}
    from django.core.cache import cache

    cache.clear()
    other = services.issue_session(agent_client, principal_id="user-2", routes=[route])
    assert agent.get(URL).status_code == 200
    assert_error(AgentCaller(other.access_token).get(URL), 429, "rate_limited")


def test_a_scope_left_out_of_the_rates_keeps_its_default(settings):
    from bailing_knowledge.throttling import ClientRateThrottle, SessionRateThrottle

    settings.BAILING_KNOWLEDGE = {"THROTTLE_RATES": {"session": "60/min"}}
    assert (SessionRateThrottle().rate, ClientRateThrottle().rate) == ("60/min", "600/min")
    settings.BAILING_KNOWLEDGE = {"THROTTLE_RATES": None}
    assert (SessionRateThrottle().rate, ClientRateThrottle().rate) == (None, None)


def test_database_failure_is_503_knowledge_unavailable_without_leak(agent, issued, route):
    secret_sql = "SELECT secret_column FROM hidden_table"
    with mock.patch(
        "bailing_knowledge.services.capabilities.knowledge_available",
        side_effect=OperationalError(secret_sql),
    ):
        response = agent.get(URL)
    body = assert_error(response, 503, "knowledge_unavailable", secret_sql, issued.access_token)
    assert response["Retry-After"]
    assert "SELECT" not in json.dumps(body)


def test_unexpected_error_is_json_500_without_leak(agent, route):
    with mock.patch(
        "bailing_knowledge.services.capabilities.knowledge_available",
        side_effect=RuntimeError("internal detail /etc/passwd"),
    ):
        response = agent.get(URL)
    assert_error(response, 500, "internal_error", "internal detail", "/etc/passwd")


@pytest.mark.urls("tests.api.urls_failing")
def test_middleware_turns_errors_outside_the_views_into_json(client):
    """A failure outside the app's views, under its prefix, is still JSON + no-store."""
    client.raise_request_exception = False
    assert_error(client.get("/agent-api/v1/db-down"), 503, "knowledge_unavailable", "SELECT")
    assert_error(client.get("/agent-api/v1/crash"), 500, "internal_error", "/etc/passwd")


@pytest.mark.parametrize("path", ["/agent-api/", "/agent-api/v2/workspaces/x/knowledge/search"])
def test_paths_under_the_prefix_that_no_pattern_matches_are_a_json_404(client, db, path):
    """Outside the mounted `v1/`, Django would answer its HTML 404 page."""
    for response in (client.get(path), client.post(path, {}, content_type="application/json")):
        body = assert_error(response, 404, "not_found")
        assert body["reason"] == "There is no such endpoint."
        # Written as the views write theirs: compact, byte for byte.
        assert response.content == json.dumps(body, separators=(",", ":")).encode()


def test_a_host_not_allowed_is_a_json_400_under_the_prefix(agent, route, settings):
    """Django refuses the Host header in CommonMiddleware, before any view: its HTML page."""
    settings.ALLOWED_HOSTS = ["testserver"]
    response = agent.http.get(
        BASE + "/workspaces/orders/knowledge/capabilities",
        headers={"Authorization": f"Bearer {agent.token}", "Host": "evil.example"},
    )
    assert assert_error(response, 400, "invalid_request", agent.token)["reason"] == (
        "The request is not valid."
    )


def test_middleware_leaves_other_paths_alone(client, db):
    assert client.get("/no-such-page/").get("Content-Type", "").startswith("text/html")
    response = client.get("/admin/login/")
    assert response.status_code == 200
    assert response.get("Cache-Control", "") != "no-store"


def test_database_errors_are_logged_without_what_the_client_sent(agent, route, caplog):
    marker = "page-context-marker-7f3a"
    error = DataError(f'invalid input\nDETAIL: Token "{marker}" is invalid.\nCONTEXT: JSON data')
    body = {
        "client_conversation_id": "c",
        "client_turn_id": "t",
        "user_message_id": "m",
        "user_input": "refunds",
        "page_context": {"note": marker},
    }
    caplog.set_level(logging.DEBUG, logger="bailing_knowledge")
    with mock.patch("bailing_knowledge.views.start_turn", side_effect=error):
        response = agent.post("/workspaces/orders/turns", body)
    assert_error(response, 503, "knowledge_unavailable", marker)
    ours = [r for r in caplog.records if r.name == "bailing_knowledge"]
    assert ours, "the error was not logged"
    logged = "\n".join(caplog.text.splitlines()) + json.dumps([r.getMessage() for r in ours])
    assert marker not in logged
    assert "DataError" in logged


SEARCH = "/workspaces/{route}/knowledge/search"
# A blank query and a field that is not accepted.
INVALID_BODY = {"query": "", "client_id": "x"}
UNKNOWN_TOKEN = "bka_" + "A" * 43  # well formed, so authentication's statement runs


@pytest.mark.parametrize("token", [None, "not-a-token", UNKNOWN_TOKEN])
def test_an_invalid_body_is_refused_only_after_authentication(anonymous, route, token):
    """The body is validated while authentication's statement runs, but its error waits:
    an unauthenticated call is 401 whatever its body."""
    response = anonymous.post(SEARCH.format(route="orders"), INVALID_BODY, token=token)
    assert_error(response, 401, "unauthorized")
    response = anonymous.call(
        "post", SEARCH.format(route="orders"), token=token, headers={"Content-Type": "text/plain"}
    )
    assert_error(response, 401, "unauthorized")


def test_an_invalid_body_is_refused_only_after_the_route_check(agent, second_route):
    response = agent.post(SEARCH.format(route="billing"), INVALID_BODY)
    assert_error(response, 403, "route_not_allowed")


def test_an_invalid_body_is_refused_only_after_the_throttles(agent, route, settings):
    settings.BAILING_KNOWLEDGE = {"THROTTLE_RATES": {"session": "1/min", "client": None}}
    from django.core.cache import cache

    cache.clear()
    assert agent.post(SEARCH.format(route="orders"), {"query": "refund"}).status_code == 200
    assert_error(agent.post(SEARCH.format(route="orders"), INVALID_BODY), 429, "rate_limited")


def test_an_invalid_body_of_an_allowed_call_is_invalid_request(agent, route):
    body = assert_error(
        agent.post(SEARCH.format(route="orders"), INVALID_BODY), 400, "invalid_request"
    )
    assert set(body["fields"]) == {"client_id"}
    body = assert_error(
        agent.post(SEARCH.format(route="orders"), {"query": ""}), 400, "invalid_request"
    )
    assert set(body["fields"]) == {"query"}


def _watch_validation(monkeypatch) -> list[bool]:
    """Whether a statement was in flight each time the search's body was validated."""
    from bailing_knowledge import views
    from bailing_knowledge.serializers import SearchRequestSerializer

    seen: list[bool] = []

    class Watched(SearchRequestSerializer):
        def is_valid(self, **kwargs):
            status = connection.connection.info.transaction_status
            seen.append(status == TransactionStatus.ACTIVE)
            return super().is_valid(**kwargs)

    monkeypatch.setattr(views.SearchView, "body_serializer", Watched)
    return seen


def test_the_body_is_validated_while_authentications_statement_runs(agent, route, monkeypatch):
    seen = _watch_validation(monkeypatch)
    response = agent.post(SEARCH.format(route="orders"), {"query": "refund"})
    assert response.status_code == 200
    assert seen == [True]


def test_a_large_body_is_validated_after_authentication(agent, route, monkeypatch):
    """Past `EARLY_BODY_BYTES` the body waits for the token's check: an unknown token costs
    no parsing of it."""
    from bailing_knowledge import views

    seen = _watch_validation(monkeypatch)
    monkeypatch.setattr(views, "EARLY_BODY_BYTES", 10)
    response = agent.post(SEARCH.format(route="orders"), {"query": "refund"})
    assert response.status_code == 200
    assert seen == [False]
    response = AgentCaller(UNKNOWN_TOKEN).post(SEARCH.format(route="orders"), {"query": "x"})
    assert_error(response, 401, "unauthorized")
    assert seen == [False]


def test_the_body_is_read_before_the_tokens_check_outside_the_database_budget(
    agent, route, settings, monkeypatch
):
    """A client slow to send its body is not waited for while the database is: the wait
    budget covers the statement, and a bad token is still 401."""
    from django.test.client import FakePayload

    settings.BAILING_KNOWLEDGE = {"DATABASE_WAIT_MS": 300}
    read = FakePayload.read

    def slow_read(self, *args, **kwargs):
        time.sleep(0.4)
        return read(self, *args, **kwargs)

    monkeypatch.setattr(FakePayload, "read", slow_read)
    assert agent.post(SEARCH.format(route="orders"), {"query": "refund"}).status_code == 200
    response = AgentCaller(UNKNOWN_TOKEN).post(SEARCH.format(route="orders"), {"query": "x"})
    assert_error(response, 401, "unauthorized")


def test_a_body_serializer_that_uses_the_database_is_validated_again_after_authentication(
    agent, route, monkeypatch
):
    from bailing_knowledge import views
    from bailing_knowledge.serializers import SearchRequestSerializer

    class Querying(SearchRequestSerializer):
        def validate_query(self, value):
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
            return value

    monkeypatch.setattr(views.SearchView, "body_serializer", Querying)
    response = agent.post(SEARCH.format(route="orders"), {"query": "refund"})
    assert response.status_code == 200, response.content
