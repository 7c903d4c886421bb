"""The database wait budget of a request: slow queries and lock waits end in a fast 503."""

from __future__ import annotations

import json
import time
from unittest import mock

import pytest
from django.db import close_old_connections, connection, connections

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
    settings.BAILING_KNOWLEDGE = {"THROTTLE_RATES": None, "DATABASE_WAIT_MS": 500}


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
    settings.BAILING_KNOWLEDGE = {"THROTTLE_RATES": None, "DATABASE_WAIT_MS": 0}
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


# --------------------------------------------------------------------------------------------
# Kept connections: the request's first statement is their health check


@pytest.fixture
def kept_connections():
    """Persistent, health-checked connections, as a production server keeps them."""
    settings_dict = connection.settings_dict
    saved = {key: settings_dict[key] for key in ("CONN_MAX_AGE", "CONN_HEALTH_CHECKS")}
    connection.close()
    settings_dict.update(CONN_MAX_AGE=60, CONN_HEALTH_CHECKS=True)
    yield
    connection.close()
    settings_dict.update(saved)


def _request(agent, path="/workspaces/orders/knowledge/capabilities", body=None):
    """A request as a WSGI server makes it: the test client leaves out Django's request
    signals, which reset the health check and drop unusable connections."""
    close_old_connections()
    response = agent.post(path, body) if body is not None else agent.get(path)
    close_old_connections()
    return response


def _backend_pid() -> int:
    return connection.connection.info.backend_pid


def test_a_kept_connection_is_checked_by_the_first_statement_alone(agent, kept_connections):
    assert _request(agent).status_code == 200
    pid = _backend_pid()
    with mock.patch.object(connection, "is_usable", wraps=connection.is_usable) as is_usable:
        assert _request(agent).status_code == 200
        assert (
            _request(agent, "/workspaces/orders/knowledge/search", {"query": "x"}).status_code
            == 200
        )
    is_usable.assert_not_called()
    assert _backend_pid() == pid


def _terminate(pid: int) -> None:
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
            assert cursor.fetchone() == (True,)
    finally:
        other.close()
    # The server ends the backend after answering; wait until it is gone.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        other = connections.create_connection("default")
        try:
            with other.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
                if cursor.fetchone() == (0,):
                    return
        finally:
            other.close()
        time.sleep(0.02)
    raise AssertionError("the backend outlived pg_terminate_backend")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/workspaces/orders/knowledge/capabilities", None),
        ("/workspaces/orders/knowledge/search", {"query": "refunds"}),
    ],
)
def test_a_dead_kept_connection_is_replaced_and_the_request_answers(
    agent, kept_connections, path, body
):
    assert _request(agent).status_code == 200
    pid = _backend_pid()
    _terminate(pid)
    response = _request(agent, path, body)
    assert response.status_code == 200, response.content
    assert _backend_pid() != pid
    assert _request(agent).status_code == 200


def test_a_statement_that_fails_on_a_live_connection_is_not_run_again(agent, kept_connections):
    assert _request(agent).status_code == 200
    pid = _backend_pid()
    statements = []

    def failing(execute, sql, params, many, context):
        statements.append(sql)
        return execute("SELECT 1 / 0", None, many, context)

    with connection.execute_wrapper(failing):
        response = _request(agent)
    assert_error(response, 503, "knowledge_unavailable")
    assert len(statements) == 1
    assert _backend_pid() == pid


@pytest.fixture
def atomic_requests():
    connection.settings_dict["ATOMIC_REQUESTS"] = True
    yield
    connection.settings_dict["ATOMIC_REQUESTS"] = False
    connection.close()


def test_atomic_requests_leave_the_agent_views_to_their_own_transactions(
    agent, kept_connections, atomic_requests
):
    assert _request(agent).status_code == 200
    pid = _backend_pid()
    _terminate(pid)
    # No request transaction holds the connection: the first statement is still its check.
    with mock.patch.object(connection, "is_usable", wraps=connection.is_usable) as is_usable:
        assert _request(agent).status_code == 200
        assert _request(agent, "/workspaces/orders/turns", TURN).status_code == 200
    is_usable.assert_not_called()
    assert _backend_pid() != pid
    assert Run.objects.count() == 1


def test_under_atomic_requests_the_commit_is_within_the_budget(agent, budget, atomic_requests):
    table = Run._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION bk_test_slow_commit() RETURNS trigger LANGUAGE plpgsql"
            " AS $$ BEGIN PERFORM pg_sleep(3); RETURN NULL; END $$"
        )
        # Runs at COMMIT: a commit that takes three seconds.
        cursor.execute(
            f"CREATE CONSTRAINT TRIGGER bk_test_slow AFTER INSERT ON {table}"
            " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION bk_test_slow_commit()"
        )
    try:
        started = time.monotonic()
        response = agent.post("/workspaces/orders/turns", TURN)
        elapsed = time.monotonic() - started
    finally:
        connection.close()
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER bk_test_slow ON {table}")
            cursor.execute("DROP FUNCTION bk_test_slow_commit()")
    assert_error(response, 503, "knowledge_unavailable")
    assert elapsed < 2.0
    assert not Run.objects.exists()


def test_when_sessions_are_read_elsewhere_django_checks_the_connection(agent, kept_connections):
    assert _request(agent).status_code == 200
    with (
        mock.patch("bailing_knowledge.access.session_database", return_value="replica"),
        mock.patch.object(connection, "is_usable", wraps=connection.is_usable) as is_usable,
    ):
        assert _request(agent).status_code == 200
    is_usable.assert_called_once()


def test_a_request_refused_before_any_statement_leaves_the_check_to_django(agent, kept_connections):
    assert _request(agent).status_code == 200
    _terminate(_backend_pid())
    close_old_connections()  # request_started
    response = agent.get("/workspaces/orders/knowledge/capabilities", token=None)
    assert response.status_code == 401
    # Still within the request, as a middleware after the view: Django's check runs first
    # and replaces the dead connection.
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)
    close_old_connections()


def test_without_a_wait_budget_django_checks_the_connection(settings, agent, kept_connections):
    settings.BAILING_KNOWLEDGE = {"THROTTLE_RATES": None, "DATABASE_WAIT_MS": 0}
    assert _request(agent).status_code == 200
    with mock.patch.object(connection, "is_usable", wraps=connection.is_usable) as is_usable:
        assert _request(agent).status_code == 200
    is_usable.assert_called_once()
