"""Host discipline: late answers of a superseded turn are dropped; caches are per turn."""

from __future__ import annotations

import asyncio
import threading

import pytest

from bailing_knowledge.client import (
    AsyncHostSession,
    AsyncKnowledgeClient,
    HostSession,
    KnowledgeClient,
    StaleTurn,
    TurnCache,
    TurnGuard,
    Unavailable,
)
from bailing_knowledge.client.tools import aexecute_tool_call, execute_tool_call

from .conftest import Answer, as_json, hint, ready_run, search_body


def _slow_search(scripted, delay: float = 5.0) -> None:
    """A search that answers only after `delay` or when the test releases it."""
    scripted.release.clear()
    scripted.answer("POST", "search", Answer(200, as_json(search_body(hint("old"))), delay=delay))


def _run_in_thread(fn):
    outcome: dict = {}

    def target():
        try:
            outcome["value"] = fn()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    return thread, outcome


def test_a_late_answer_for_a_superseded_turn_is_dropped(scripted):
    session = HostSession(KnowledgeClient(scripted.url, "orders", "bka_x"))
    turn_1 = session.start_turn("t1")
    _slow_search(scripted)
    thread, outcome = _run_in_thread(lambda: session.search("refund", turn=turn_1))
    assert scripted.received.wait(5)

    turn_2 = session.start_turn("t2")
    scripted.answer("POST", "search", Answer(200, as_json(search_body(hint("new")))))
    scripted.release.set()  # the old answer arrives now, after turn 2 started
    thread.join(5)

    assert isinstance(outcome.get("error"), StaleTurn)
    assert (outcome["error"].turn_id, outcome["error"].current_turn_id) == ("t1", "t2")
    assert len(session.cache) == 0  # never cached

    # Turn 2 gets its own answer, then the cached one (no second request).
    assert session.search("refund").hints[0].ref == "new"
    assert session.search("refund", turn=turn_2).hints[0].ref == "new"
    assert sum(1 for method, *_ in scripted.requests if method == "POST") == 2

    # A call for an old turn is refused before any request.
    with pytest.raises(StaleTurn):
        session.search("other", turn=turn_1)
    assert len(scripted.requests) == 2


def test_a_late_error_is_dropped_too(scripted):
    session = HostSession(KnowledgeClient(scripted.url, "orders", "bka_x"))
    turn_1 = session.start_turn()
    scripted.release.clear()
    scripted.answer(
        "POST",
        "search",
        Answer(503, as_json({"error": "knowledge_unavailable", "reason": "Later."}), delay=5),
    )
    thread, outcome = _run_in_thread(
        lambda: execute_tool_call(session, "knowledge_search", {"query": "x"})
    )
    assert scripted.received.wait(5)
    session.start_turn()
    scripted.release.set()
    thread.join(5)
    assert isinstance(outcome.get("error"), StaleTurn)
    assert turn_1.generation == 1

    # In the current turn the same error is a tool result the model can read.
    scripted.answer(
        "POST",
        "search",
        Answer(503, as_json({"error": "knowledge_unavailable", "reason": "Later."})),
    )
    assert execute_tool_call(session, "knowledge_search", {"query": "x"})["error"] == (
        "knowledge_unavailable"
    )
    with pytest.raises(Unavailable):
        session.search("x")


def test_ending_a_turn_drops_its_answers(scripted):
    session = HostSession(KnowledgeClient(scripted.url, "orders", "bka_x"))
    scripted.answer("POST", "search", Answer(200, as_json(search_body(hint()))))
    with pytest.raises(RuntimeError):
        session.search("refund")  # no turn yet
    turn = session.start_turn()
    session.search("refund")
    session.end_turn()
    assert session.turn is None
    with pytest.raises(StaleTurn):
        session.search("refund", turn=turn)


def test_async_late_answer_is_dropped(scripted):
    async def scenario():
        async with AsyncKnowledgeClient(scripted.url, "orders", "bka_x") as client:
            session = AsyncHostSession(client)
            turn_1 = session.start_turn("t1")
            _slow_search(scripted)
            task = asyncio.create_task(session.search("refund", turn=turn_1))
            await asyncio.to_thread(scripted.received.wait, 5)
            session.start_turn("t2")
            scripted.answer("POST", "search", Answer(200, as_json(search_body(hint("new")))))
            scripted.release.set()
            with pytest.raises(StaleTurn):
                await task
            assert len(session.cache) == 0
            return (await session.search("refund")).hints[0].ref

    assert asyncio.run(scenario()) == "new"


def test_cache_is_keyed_by_authorization_route_and_turn(scripted):
    scripted.answer("POST", "search", Answer(200, as_json(search_body(hint("a")))))
    cache = TurnCache()
    guard = TurnGuard()
    one = HostSession(KnowledgeClient(scripted.url, "orders", "bka_one"), guard=guard, cache=cache)
    two = HostSession(KnowledgeClient(scripted.url, "orders", "bka_two"), guard=guard, cache=cache)
    one.start_turn()
    one.search("refund")
    one.search("refund")
    two.search("refund")  # same turn, same cache, other token: not served from cache
    assert len(scripted.requests) == 2
    one.start_turn()
    one.search("refund")  # a new turn forgets earlier answers
    assert len(scripted.requests) == 3


def test_cache_entries_expire():
    now = [0.0]
    cache = TurnCache(max_entries=2, ttl=10, clock=lambda: now[0])
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("c", 3)
    assert cache.get("a") is None and cache.get("c") == 3  # LRU bound
    now[0] = 11
    assert cache.get("c") is None


@pytest.mark.django_db(transaction=True)
def test_a_turn_carries_its_run(hub):
    run = ready_run(hub)
    with KnowledgeClient(hub.url, hub.route, hub.token) as client:
        session = HostSession(client)
        session.start_turn("t", run_id=run.run_id)
        result = session.search("refund")
        assert result.run_id == run.run_id
        chain = session.read_chain(result.hints[0].ref)
        assert chain.run_id == run.run_id and chain.content.startswith("# Refund policy")
        tool = execute_tool_call(session, "knowledge_read", {"ref": result.hints[0].ref})
        assert tool["content"] == chain.content and tool["trust"] == "reference_only"


def test_a_tool_call_of_a_superseded_turn_is_dropped(scripted):
    """A late tool call runs in its own turn, not in whichever turn is current now."""
    scripted.answer("POST", "search", Answer(200, as_json(search_body(hint()))))
    session = HostSession(KnowledgeClient(scripted.url, "orders", "bka_x"))
    turn_1 = session.start_turn("t1")
    turn_2 = session.start_turn("t2")
    calls = [
        ("knowledge_search", {"query": "refund"}),
        ("knowledge_read", {"ref": "ref-1"}),
        ("knowledge_read", {"ref": "ref-1", "follow": False}),
    ]
    for name, arguments in calls:
        with pytest.raises(StaleTurn) as caught:
            execute_tool_call(session, name, arguments, turn=turn_1)
        assert (caught.value.turn_id, caught.value.current_turn_id) == ("t1", "t2")
    assert scripted.requests == []

    found = execute_tool_call(session, "knowledge_search", {"query": "refund"}, turn=turn_2)
    assert found["hints"][0]["ref"] == "ref-1"

    # After end_turn, the ended turn's calls are late; a call naming no turn is a host bug.
    session.end_turn()
    with pytest.raises(StaleTurn):
        execute_tool_call(session, "knowledge_search", {"query": "refund"}, turn=turn_2)
    with pytest.raises(RuntimeError, match="No turn is current"):
        execute_tool_call(session, "knowledge_search", {"query": "refund"})
    assert len(scripted.requests) == 1


def test_async_tool_calls_carry_their_turn(scripted):
    scripted.answer("POST", "search", Answer(200, as_json(search_body(hint()))))

    async def scenario():
        async with AsyncKnowledgeClient(scripted.url, "orders", "bka_x") as client:
            session = AsyncHostSession(client)
            turn_1 = session.start_turn("t1")
            session.start_turn("t2")
            with pytest.raises(StaleTurn):
                await aexecute_tool_call(session, "knowledge_search", {"query": "x"}, turn=turn_1)
            with pytest.raises(TypeError, match="AsyncHostSession"):
                await aexecute_tool_call(client, "knowledge_search", {"query": "x"}, turn=turn_1)
            return await aexecute_tool_call(session, "knowledge_search", {"query": "x"})

    assert asyncio.run(scenario())["hints"][0]["ref"] == "ref-1"
    assert len(scripted.requests) == 1


def test_a_turn_needs_a_session(scripted):
    with KnowledgeClient(scripted.url, "orders", "bka_x") as client:
        turn = TurnGuard().start()
        with pytest.raises(TypeError, match="HostSession"):
            execute_tool_call(client, "knowledge_search", {"query": "x"}, turn=turn)
    assert scripted.requests == []
