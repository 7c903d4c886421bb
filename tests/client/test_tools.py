"""Tool definitions and the tool-call executor, run against the live app."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from bailing_knowledge.client import (
    AsyncKnowledgeClient,
    Hint,
    KnowledgeClient,
    SearchResult,
    tools,
)
from bailing_knowledge.client.tools import (
    aexecute_tool_call,
    anthropic_tools,
    dumps_result,
    execute_tool_call,
    is_error,
    openai_tools,
    tool_definitions,
)

from .conftest import MANUAL, REFUNDS, Answer, as_json, hint, search_body

ROOT = Path(__file__).resolve().parents[2]
live = pytest.mark.django_db(transaction=True)


def test_the_client_imports_without_django():
    code = (
        "import sys; sys.modules['django'] = None; sys.modules['rest_framework'] = None; "
        "import bailing_knowledge.client, bailing_knowledge.client.tools; "
        "assert not any(m.startswith(('django', 'rest_framework')) and sys.modules[m] "
        "for m in sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def test_definitions_in_both_formats():
    names = [tool["name"] for tool in tool_definitions()]
    assert names == ["knowledge_search", "knowledge_read"]

    chat = openai_tools()
    assert [t["type"] for t in chat] == ["function", "function"]
    assert chat[0]["function"]["name"] == "knowledge_search"
    assert chat[0]["function"]["parameters"]["required"] == ["query"]
    assert chat[1]["function"]["parameters"]["properties"]["follow"]["type"] == "boolean"

    responses = openai_tools("responses")
    assert responses[1]["name"] == "knowledge_read"
    assert responses[1]["parameters"]["required"] == ["ref"]

    anthropic = anthropic_tools()
    assert anthropic[0]["input_schema"]["properties"]["limit"]["maximum"] == 3
    assert set(anthropic[1]) == {"name", "description", "input_schema"}
    assert "reference_only" in anthropic[0]["description"]
    # Each call returns fresh copies: a host may edit them freely.
    anthropic[0]["input_schema"]["properties"].clear()
    assert anthropic_tools()[0]["input_schema"]["properties"]
    json.dumps([chat, responses, anthropic])


@live
def test_search_and_read_tools(hub, manual):
    with KnowledgeClient(hub.url, hub.route, hub.token) as client:
        found = execute_tool_call(client, "knowledge_search", {"query": "refund", "limit": 2})
        assert not is_error(found)
        assert (found["status"], found["trust"]) == ("ok", "reference_only")
        assert len(found["hints"]) <= 2
        assert len(dumps_result(found).encode()) <= 4096
        ref = found["hints"][0]["ref"]

        whole = execute_tool_call(client, "knowledge_read", json.dumps({"ref": ref}))
        assert (whole["content"], whole["trust"], whole["truncated"]) == (
            REFUNDS,
            "reference_only",
            False,
        )

        manual_ref = execute_tool_call(
            client, "knowledge_search", {"query": "forklift safety inspection", "limit": 1}
        )["hints"][0]["ref"]
        page = execute_tool_call(
            client, "knowledge_read", {"ref": manual_ref, "follow": False, "max_bytes": 4096}
        )
        assert page["next_cursor"] and page["truncated"]
        assert len(dumps_result(page).encode()) <= 4096
        rest = execute_tool_call(
            client, "knowledge_read", {"ref": manual_ref, "cursor": page["next_cursor"]}
        )
        assert page["content"] + rest["content"] == MANUAL
        assert (rest["from_cursor"], rest["truncated"]) == (True, False)

        bad = execute_tool_call(client, "knowledge_read", {"ref": "AAAA"})
        assert (
            bad
            == {
                "error": "knowledge_reference_invalid",
                "reason": bad["reason"],
            }
            and bad["reason"]
        )

    with KnowledgeClient(hub.url, hub.route, "bka_" + "z" * 43) as stranger:
        denied = execute_tool_call(stranger, "knowledge_search", {"query": "refund"})
    assert denied["error"] == "unauthorized"


@live
def test_async_tools(hub):
    async def scenario():
        async with AsyncKnowledgeClient(hub.url, hub.route, hub.token) as client:
            found = await aexecute_tool_call(client, "knowledge_search", {"query": "shipping"})
            ref = found["hints"][0]["ref"]
            return found, await aexecute_tool_call(client, "knowledge_read", {"ref": ref})

    found, read = asyncio.run(scenario())
    assert found["hints"][0]["title"] == "Shipping"
    assert read["content"].startswith("# Shipping")


@pytest.mark.parametrize(
    ("name", "arguments", "code"),
    [
        ("knowledge_delete", {}, "unknown_tool"),
        ("knowledge_search", "{not json", "invalid_arguments"),
        ("knowledge_search", [], "invalid_arguments"),
        ("knowledge_search", {}, "invalid_arguments"),
        ("knowledge_search", {"query": "  "}, "invalid_arguments"),
        ("knowledge_search", {"query": "x" * 2001}, "invalid_arguments"),
        ("knowledge_search", {"query": "x", "limit": 4}, "invalid_arguments"),
        ("knowledge_search", {"query": "x", "limit": True}, "invalid_arguments"),
        ("knowledge_search", {"query": "x", "run_id": "run_1"}, "invalid_arguments"),
        ("knowledge_read", {"ref": ""}, "invalid_arguments"),
        ("knowledge_read", {"ref": "r", "max_bytes": 100}, "invalid_arguments"),
        ("knowledge_read", {"ref": "r", "follow": "yes"}, "invalid_arguments"),
        # Lone surrogates (an emoji cut in half) have no UTF-8 form: the HTTP layer raised.
        ("knowledge_search", '{"query": "refund \\ud83d"}', "invalid_arguments"),
        ("knowledge_search", {"query": "refund \ud800"}, "invalid_arguments"),
        ("knowledge_read", '{"ref": "AAAA\\udfff"}', "invalid_arguments"),
        ("knowledge_read", {"ref": "AAAA", "cursor": "\ud800"}, "invalid_arguments"),
    ],
)
def test_bad_calls_are_tool_errors_without_a_request(scripted, name, arguments, code):
    with KnowledgeClient(scripted.url, "orders", "bka_x") as client:
        result = execute_tool_call(client, name, arguments)
    assert result["error"] == code and result["reason"]
    assert scripted.requests == []


def test_invalid_unicode_is_named_as_such_by_both_executors(scripted):
    arguments = '{"query": "a\\ud83d"}'

    async def run():
        async with AsyncKnowledgeClient(scripted.url, "orders", "bka_x") as client:
            return await aexecute_tool_call(client, "knowledge_search", arguments)

    with KnowledgeClient(scripted.url, "orders", "bka_x") as client:
        results = [execute_tool_call(client, "knowledge_search", arguments), asyncio.run(run())]
    for result in results:
        assert result == {
            "error": "invalid_arguments",
            "reason": "'query' contains invalid Unicode.",
        }
    assert scripted.requests == []


def test_null_optionals_mean_absent(scripted):
    scripted.answer("POST", "search", Answer(200, as_json(search_body(hint()))))
    with KnowledgeClient(scripted.url, "orders", "bka_x") as client:
        result = execute_tool_call(client, "knowledge_search", {"query": "x", "limit": None})
    assert result["hints"][0]["ref"] == "ref-1"
    assert json.loads(scripted.requests[0][2]) == {"query": "x", "limit": 3}


def test_search_results_stay_within_the_budget(scripted):
    # A server that breaks its budget: the tool result still fits, and says it was cut.
    big = [hint(f"r{i}", summary="é" * 900) for i in range(3)]
    scripted.answer("POST", "search", Answer(200, as_json(search_body(*big))))
    with KnowledgeClient(scripted.url, "orders", "bka_x") as client:
        result = execute_tool_call(client, "knowledge_search", {"query": "x"})
    assert len(dumps_result(result).encode()) <= 4096
    assert result["truncated"] and len(result["hints"]) == 2


def _trim_by_popping(result: SearchResult) -> dict:
    """The former cut, one hint at a time: the reference the linear cut must match."""
    shaped = {
        "status": result.status,
        "trust": result.trust,
        "truncated": result.truncated,
        "hints": [hint.to_dict() for hint in result.hints],
    }
    while len(dumps_result(shaped).encode()) > 4096 and shaped["hints"]:
        shaped["hints"].pop()
        shaped["truncated"] = True
    return shaped


def test_the_cut_of_an_oversized_search_is_unchanged():
    rng = random.Random(7)
    cases = []
    for _ in range(400):
        hints = tuple(
            Hint(f"r{i}", "T", rng.choice("aé仓👷") * rng.randrange(0, 1500), 1, 0.5, "2030")
            for i in range(rng.randrange(0, 8))
        )
        cases.append(hints)
    # The boundary where "truncated": false does not fit and "truncated": true would.
    base = SearchResult("v", "orders", None, "k", "ok", "reference_only", (), False)
    one = dumps_result(tools.search_result(replace(base, hints=(Hint("r", "T", "", 1, 0.5, "x"),))))
    room = 4096 - len(one.encode())
    cases.append((Hint("r", "T", "s" * (room + 1), 1, 0.5, "x"),))
    cases.append((Hint("r", "T", "s" * room, 1, 0.5, "x"), Hint("q", "T", "", 1, 0.5, "x")))
    for hints in cases:
        for truncated in (False, True):
            result = replace(base, hints=hints, truncated=truncated)
            assert tools.search_result(result) == _trim_by_popping(result)


def test_thousands_of_hints_are_cut_in_linear_time(scripted):
    """A hub's 5,000 hints took 68 s of CPU to cut, one serialisation per dropped hint."""
    many = [hint(f"r{i}", summary="é" * 900) for i in range(5_000)]
    scripted.answer("POST", "search", Answer(200, as_json(search_body(*many))))
    with KnowledgeClient(scripted.url, "orders", "bka_x") as client:
        started = time.process_time()
        result = execute_tool_call(client, "knowledge_search", {"query": "x"})
        elapsed = time.process_time() - started
    assert result["truncated"] and len(result["hints"]) == 2
    assert elapsed < 5
