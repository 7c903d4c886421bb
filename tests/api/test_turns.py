"""Turns, runs, completion and managed tasks; inline and on-demand knowledge delivery."""

from __future__ import annotations

import json
import threading
from unittest import mock

import pytest
from django.db import connections

from bailing_knowledge import services, signing
from bailing_knowledge.ingestion.documents import upsert_document
from bailing_knowledge.models import Run
from bailing_knowledge.services import turns
from bailing_knowledge.services.tasks import (
    add_task_members,
    cancel_task,
    create_task,
    pause_task,
    remove_task_members,
    task_scope_hash,
)

from .conftest import AgentCaller, assert_error

pytestmark = pytest.mark.django_db

TURNS = "/workspaces/orders/turns"
SEARCH = "/workspaces/orders/knowledge/search"
READ = "/workspaces/orders/knowledge/read"

REFUNDS = "# Refunds\n\nRefunds are paid within five business days. " * 20


@pytest.fixture
def documents(kb):
    upsert_document(kb, "refunds.md", "Refunds", REFUNDS)
    upsert_document(kb, "shipping.md", "Shipping", "# Shipping\n\nOrders ship in two days.")


def turn(**overrides):
    body = {
        "client_conversation_id": "conv-1",
        "client_turn_id": "turn-1",
        "user_message_id": "msg-1",
        "user_input": "How long do refunds take?",
    }
    body.update(overrides)
    return {k: v for k, v in body.items() if v is not None}


def post_turn(agent, body):
    response = agent.post(TURNS, body)
    assert response["Cache-Control"] == "no-store"
    return response


def test_legacy_turn_carries_inline_bodies(agent, route, documents):
    response = post_turn(agent, turn())
    assert response.status_code == 200, response.content
    body = json.loads(response.content)
    assert body["schema_version"] == "bailing.agent-turn-context.v1"
    assert body["route"] == "orders"
    assert body["knowledge_scope_revision"] == route.knowledge_scope_revision
    assert body["knowledge"], body
    assert "knowledge_delivery" not in body["context"]
    for item in body["knowledge"]:
        assert item["trust"] == "reference_only"
        assert item["content"] in REFUNDS or item["content"].startswith("# Shipping")
    assert [r["ref"] for r in body["knowledge_refs"]] == [i["ref"] for i in body["knowledge"]]
    run = Run.objects.get(run_id=body["run_id"])
    assert (run.state, run.delivery_mode) == ("context_ready", "legacy")


def test_inline_respects_route_settings_and_the_size_bound(agent, route, documents, settings):
    services.update_route(route, top_k=2, max_docs=1)
    settings.BAILING_KNOWLEDGE = {"INLINE_MAX_BYTES": 300, "THROTTLE_RATES": None}
    body = json.loads(post_turn(agent, turn(knowledge_delivery="inline")).content)
    assert 1 <= len(body["knowledge"]) <= 2
    assert len({item["title"] for item in body["knowledge"]}) == 1
    total = sum(len(json.dumps(i["content"], ensure_ascii=False)) - 2 for i in body["knowledge"])
    assert total <= 300
    assert body["knowledge"][0]["truncated"] is True


def test_document_mode_delivers_whole_documents(agent, route, documents):
    services.update_route(route, knowledge_mode="document")
    body = json.loads(post_turn(agent, turn(knowledge_delivery="inline")).content)
    assert body["knowledge"][0]["kind"] == "document"
    assert body["knowledge"][0]["content"] == REFUNDS


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("text", "metadata"),
    [
        ("# Refunds\n\nRefunds now take a month.", {}),
        ("# Refunds\n\nPartners only: the margin is 40%.", {"audiences": ["partners"]}),
    ],
)
def test_document_mode_never_delivers_a_body_changed_since_the_search(text, metadata):
    kb = services.create_knowledge_base("handbook")
    route = services.create_route("orders", knowledge_bases=[kb], knowledge_mode="document")
    client = services.create_client("acme-agent", routes=[route])
    issued = services.issue_session(client, principal_id="u", audience="staff", routes=[route])
    upsert_document(kb, "refunds.md", "Refunds", "# Refunds\n\nRefunds take five days.")
    searched = turns.sign_hits

    def edit_elsewhere():
        try:
            upsert_document(kb, "refunds.md", "Refunds", text, metadata=metadata)
        finally:
            connections.close_all()

    def sign_then_edit(*args, **kwargs):
        # Between the search and the fetch of the bodies, another process commits.
        hints = searched(*args, **kwargs)
        editor = threading.Thread(target=edit_elsewhere)
        editor.start()
        editor.join(30)
        return hints

    with mock.patch.object(turns, "sign_hits", side_effect=sign_then_edit):
        response = post_turn(AgentCaller(issued.access_token), turn(knowledge_delivery="inline"))
    (item,) = json.loads(response.content)["knowledge"]
    assert item["revision"] == 1
    # The text the search found at revision 1, never the body of revision 2.
    assert item["content"] == "# Refunds\n\nRefunds take five days."


def test_on_demand_turn_has_run_bound_hints(agent, issued, route, documents):
    body = json.loads(post_turn(agent, turn(knowledge_delivery="on_demand")).content)
    assert (body["knowledge"], body["knowledge_refs"]) == ([], [])
    delivery = body["context"]["knowledge_delivery"]
    assert delivery["schema_version"] == "bailing.agent-knowledge-delivery.v1"
    assert (delivery["mode"], delivery["protocol"]) == ("on_demand", "bailing.agent-knowledge.v1")
    assert delivery["knowledge_scope_revision"] == route.knowledge_scope_revision
    assert delivery["status"] == "ok"
    assert 1 <= len(delivery["hints"]) <= 3
    assert len(json.dumps(delivery, ensure_ascii=False, separators=(",", ":")).encode()) <= 4096
    run_id = body["run_id"]
    ref = delivery["hints"][0]["ref"]
    page = agent.post(READ, {"ref": ref, "run_id": run_id})
    assert page.status_code == 200
    assert json.loads(page.content)["run_id"] == run_id
    assert_error(agent.post(READ, {"ref": ref}), 400, "knowledge_reference_invalid")


preparation_states: list = []


def recording_hook(*, run, session, route, request):
    preparation_states.append(Run.objects.get(pk=run.pk).state)
    return {"instructions": ["Answer in English."], "tools": []}


def test_server_side_preparation_issues_hints_while_preparing(agent, issued, documents, settings):
    settings.BAILING_KNOWLEDGE = {"TURN_CONTEXT_HOOK": "tests.api.test_turns.recording_hook"}
    preparation_states.clear()
    body = json.loads(post_turn(agent, turn(knowledge_delivery="on_demand")).content)
    assert preparation_states == ["preparing"]
    assert body["instructions"] == ["Answer in English."]
    identity = signing.Identity.for_session(issued.session, "orders")
    for hint in body["context"]["knowledge_delivery"]["hints"]:
        claims = signing.verify_reference(hint["ref"], identity, run_id=body["run_id"])
        assert claims.issued_at is not None


def test_replay_is_the_same_run_byte_for_byte(agent, documents):
    first = post_turn(agent, turn(knowledge_delivery="on_demand", renderers=["markdown"]))
    again = post_turn(agent, turn(knowledge_delivery="on_demand", renderers=["markdown"]))
    assert first.status_code == again.status_code == 200
    assert first.content == again.content
    assert Run.objects.count() == 1


@pytest.mark.parametrize(
    "change",
    [
        {"user_input": "Something else"},
        {"knowledge_delivery": "inline"},
        {"knowledge_delivery": "on_demand"},
        {"page_context": {"page": "orders"}},
        {"renderers": ["markdown"]},
    ],
)
def test_replay_with_any_difference_is_a_conflict(agent, documents, change):
    assert post_turn(agent, turn()).status_code == 200
    assert_error(post_turn(agent, turn(**change)), 409, "idempotency_conflict")


def test_a_new_message_id_is_a_new_run(agent, documents):
    first = json.loads(post_turn(agent, turn()).content)["run_id"]
    second = json.loads(post_turn(agent, turn(user_message_id="msg-2")).content)["run_id"]
    assert first != second


@pytest.mark.django_db(transaction=True)
def test_concurrent_identical_turns_create_one_run():
    kb = services.create_knowledge_base("handbook")
    route = services.create_route("orders", knowledge_bases=[kb])
    client = services.create_client("acme-agent", routes=[route])
    issued = services.issue_session(client, principal_id="u", routes=[route])
    upsert_document(kb, "refunds.md", "Refunds", REFUNDS)
    barrier = threading.Barrier(10)
    answers: list = []

    def call():
        try:
            barrier.wait()
            response = AgentCaller(issued.access_token).post(TURNS, turn())
            answers.append((response.status_code, response.content))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=call) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert [status for status, _ in answers] == [200] * 10
    assert len({content for _, content in answers}) == 1
    assert Run.objects.count() == 1


@pytest.mark.parametrize(
    "change",
    [
        {"surprise": 1},
        {"route": "other"},
        {"client_id": "x"},
        {"user_input": "x" * 64001},
        {"user_input": None},
        {"user_input": 7},
        {"renderers": ["a", "a"]},
        {"renderers": [f"r{i}" for i in range(21)]},
        {"renderers": ["Not Valid"]},
        {"knowledge_delivery": "sometimes"},
        {"page_context": ["list"]},
        {"task_binding": {"task_id": "t"}},
    ],
)
def test_invalid_turns(agent, route, change):
    assert_error(post_turn(agent, turn(**change)), 400, "invalid_request", "sometimes")


def test_exactly_64000_characters_and_20_renderers_are_accepted(agent, route):
    body = turn(user_input="é" * 64000, renderers=[f"r{i}" for i in range(20)])
    assert post_turn(agent, body).status_code == 200


def _run_with(issued, route, state):
    return Run.objects.create(
        session=issued.session,
        client=issued.session.client,
        route=route,
        client_conversation_id="c",
        client_turn_id=state,
        user_message_id="m",
        request_hash="0" * 64,
        state=state,
    )


@pytest.mark.parametrize("state", ["preparing", "completed", "cancelled", "failed"])
def test_search_and_read_refuse_runs_that_are_not_current(agent, issued, route, documents, state):
    run = _run_with(issued, route, state)
    assert_error(
        agent.post(SEARCH, {"query": "refunds", "run_id": run.run_id}), 409, "run_not_current"
    )


def test_runs_of_other_sessions_clients_or_routes_are_not_current(
    agent, issued, route, agent_client, kb, documents
):
    other_session = services.issue_session(agent_client, principal_id="user-1", routes=[route])
    other_client = services.create_client("other", routes=[route])
    foreign = services.issue_session(other_client, principal_id="user-1", routes=[route])
    for owner in (other_session, foreign):
        run = json.loads(AgentCaller(owner.access_token).post(TURNS, turn()).content)["run_id"]
        assert_error(agent.post(SEARCH, {"query": "x", "run_id": run}), 409, "run_not_current")
    services.create_route("billing", knowledge_bases=[kb])
    services.update_client(agent_client, routes=["orders", "billing"])
    both = services.issue_session(agent_client, principal_id="u", routes=["orders", "billing"])
    caller = AgentCaller(both.access_token)
    run = json.loads(caller.post("/workspaces/billing/turns", turn()).content)["run_id"]
    assert_error(caller.post(SEARCH, {"query": "x", "run_id": run}), 409, "run_not_current")


def _complete(agent, run_id, **overrides):
    body = {
        "assistant_message_id": "a-1",
        "status": "completed",
        "content": "Refunds take five days.",
        "model": "m-1",
        "runtime": {"host": "test"},
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }
    body.update(overrides)
    return agent.post(f"/runs/{run_id}/complete", body)


def test_complete_is_idempotent_and_ends_the_run(agent, issued, documents):
    body = json.loads(post_turn(agent, turn(knowledge_delivery="on_demand")).content)
    run_id = body["run_id"]
    ref = body["context"]["knowledge_delivery"]["hints"][0]["ref"]
    first = _complete(agent, run_id)
    assert first.status_code == 200, first.content
    assert first["Cache-Control"] == "no-store"
    assert json.loads(first.content)["state"] == "completed"
    again = _complete(agent, run_id)
    assert (again.status_code, again.content) == (200, first.content)
    for change in ({"content": "Other"}, {"status": "failed"}, {"usage": {}}, {"model": "m-2"}):
        assert_error(_complete(agent, run_id, **change), 409, "idempotency_conflict")
    # A completed run is no longer current, and its refs die with it.
    assert_error(agent.post(SEARCH, {"query": "x", "run_id": run_id}), 409, "run_not_current")
    assert_error(agent.post(READ, {"ref": ref, "run_id": run_id}), 409, "run_not_current")


def test_only_the_owner_completes(agent, issued, agent_client, route, documents):
    run_id = json.loads(post_turn(agent, turn()).content)["run_id"]
    other = services.issue_session(agent_client, principal_id="user-1", routes=[route])
    assert_error(_complete(AgentCaller(other.access_token), run_id), 409, "run_not_current")
    assert_error(_complete(agent, "run_unknown"), 409, "run_not_current")
    assert_error(_complete(agent, "run%00unknown"), 409, "run_not_current")
    assert_error(_complete(AgentCaller(None), run_id), 401, "unauthorized")
    assert_error(agent.post(f"/runs/{run_id}/complete", {"status": "x"}), 400, "invalid_request")


def test_complete_rechecks_the_route(agent, route, documents):
    run_id = json.loads(post_turn(agent, turn()).content)["run_id"]
    services.set_route_enabled(route, False)
    assert_error(_complete(agent, run_id), 403, "route_not_allowed")


def binding(task):
    return {
        "schema_version": "bailing.agent-task-binding.v1",
        "task_id": task.task_id,
        "scope_hash": task_scope_hash(task),
    }


def test_task_bound_runs_follow_the_task(agent, issued, route, documents):
    task = create_task("Quarter close", members=[issued.session])
    body = json.loads(post_turn(agent, turn(task_binding=binding(task))).content)
    run = Run.objects.get(run_id=body["run_id"])
    assert run.task_id == task.pk
    search = {"query": "refunds", "run_id": run.run_id}
    assert agent.post(SEARCH, search).status_code == 200
    pause_task(task)
    assert_error(agent.post(SEARCH, search), 409, "run_not_current")
    services.tasks.resume_task(task)
    assert agent.post(SEARCH, search).status_code == 200
    remove_task_members(task, [issued.session])
    assert_error(agent.post(SEARCH, search), 409, "run_not_current")
    add_task_members(task, [issued.session])
    cancel_task(task)
    assert_error(agent.post(SEARCH, search), 409, "run_not_current")


@pytest.mark.parametrize("change", ["pause", "cancel", "leave"])
def test_a_run_of_a_task_that_stopped_is_not_completed(agent, issued, documents, change):
    task = create_task("Quarter close", members=[issued.session])
    run_id = json.loads(post_turn(agent, turn(task_binding=binding(task))).content)["run_id"]
    done = json.loads(
        post_turn(agent, turn(task_binding=binding(task), user_message_id="m2")).content
    )["run_id"]
    first = _complete(agent, done)
    assert first.status_code == 200
    {
        "pause": lambda: pause_task(task),
        "cancel": lambda: cancel_task(task),
        "leave": lambda: remove_task_members(task, [issued.session]),
    }[change]()
    assert_error(_complete(agent, run_id), 409, "run_not_current")
    assert Run.objects.get(run_id=run_id).state == Run.State.CONTEXT_READY
    # A completion already made replays as it was answered.
    again = _complete(agent, done)
    assert (again.status_code, again.content) == (200, first.content)


def test_task_binding_checks(agent, issued, agent_client, route, documents):
    task = create_task("T", members=[issued.session])
    stale = binding(task)
    other = services.issue_session(agent_client, principal_id="p2", routes=[route])
    add_task_members(task, [other.session])
    # The membership changed: the old scope hash no longer matches.
    assert_error(post_turn(agent, turn(task_binding=stale)), 400, "invalid_request")
    outsider = create_task("Not mine")
    assert_error(post_turn(agent, turn(task_binding=binding(outsider))), 409, "run_not_current")
    pause_task(task)
    assert_error(
        post_turn(agent, turn(task_binding=binding(task), client_turn_id="t2")),
        409,
        "run_not_current",
    )


def test_agents_cannot_create_or_control_tasks(agent):
    for path in ("/tasks", "/tasks/x/pause", "/workspaces/orders/tasks"):
        assert_error(agent.post(path, {"title": "mine"}), 404, "not_found")


def test_knowledge_failure_never_fails_the_turn(agent, documents, settings):
    from unittest import mock

    from django.db import OperationalError

    with mock.patch(
        "bailing_knowledge.services.turns.search_hints", side_effect=OperationalError("x")
    ):
        body = json.loads(post_turn(agent, turn(knowledge_delivery="on_demand")).content)
    assert body["context"]["knowledge_delivery"]["status"] == "unavailable"
    with mock.patch(
        "bailing_knowledge.services.turns.find_hits", side_effect=OperationalError("x")
    ):
        response = post_turn(agent, turn(client_turn_id="t2"))
    assert response.status_code == 200
    assert json.loads(response.content)["knowledge"] == []
