"""Hostile bodies, paths and strings: always a JSON 4xx, never a 500, never a burned turn."""

from __future__ import annotations

import json

import pytest
from django.test import Client as DjangoClient

from bailing_knowledge.ingestion.documents import upsert_document
from bailing_knowledge.models import Run

from .conftest import BASE, assert_error

pytestmark = pytest.mark.django_db

TURNS = "/workspaces/orders/turns"
SEARCH = "/workspaces/orders/knowledge/search"
READ = "/workspaces/orders/knowledge/read"


def turn_body(**overrides):
    body = {
        "client_conversation_id": "conv-1",
        "client_turn_id": "turn-1",
        "user_message_id": "msg-1",
        "user_input": "How long do refunds take?",
    }
    return {**body, **overrides}


def post_raw(agent, path: str, raw: bytes | str, content_type: str = "application/json"):
    """POST `raw` as the body, byte for byte, under `content_type`."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    return agent.http.post(
        BASE + path,
        data=data,
        content_type=content_type,
        headers={"Authorization": f"Bearer {agent.token}"},
    )


def _with(body: dict, key: str, raw_value: str) -> str:
    """`body` as JSON text with `key` set to the JSON text `raw_value`, unparsed."""
    text = json.dumps({**body, key: "__RAW__"})
    return text.replace('"__RAW__"', raw_value)


@pytest.fixture
def run_id(agent, route):
    response = agent.post(TURNS, turn_body(client_turn_id="for-completion"))
    assert response.status_code == 200, response.content
    return json.loads(response.content)["run_id"]


def _endpoints(run_id: str) -> list[tuple[str, dict, str]]:
    """(path, a valid body, a free-form field of it) for every endpoint taking a body."""
    return [
        (SEARCH, {"query": "refunds"}, "query"),
        (READ, {"ref": "AAAA"}, "ref"),
        (TURNS, turn_body(client_turn_id="hostile"), "page_context"),
        (f"/runs/{run_id}/complete", {"assistant_message_id": "a"}, "usage"),
    ]


HOSTILE_VALUES = {
    "nested_1000": "[" * 1000 + "]" * 1000,
    "nested_100000": "[" * 100_000 + "]" * 100_000,
    "nested_past_the_limit": '{"a":' * 40 + "1" + "}" * 40,
    "lone_surrogate": '"\\ud800"',
    "lone_surrogate_key": '{"\\udfff": 1}',
    "nul": '"a\\u0000b"',
    "nul_key": '{"\\u0000": 1}',
    "huge_number": "1e400",
    "nan": "NaN",
}


@pytest.mark.parametrize("kind", sorted(HOSTILE_VALUES))
def test_hostile_values_are_400_on_every_endpoint(agent, run_id, kind):
    for path, body, key in _endpoints(run_id):
        response = post_raw(agent, path, _with(body, key, HOSTILE_VALUES[kind]))
        assert_error(response, 400, "invalid_request", agent.token)
    assert not Run.objects.filter(client_turn_id="hostile").exists()


@pytest.mark.parametrize(
    "raw",
    [
        b'{"query": "caf\xe9"}',  # Latin-1, not UTF-8
        b"\xff\xfe{}",
        b'{"query": "refunds"',
        b"",
        b"[]",
    ],
)
def test_malformed_bodies_are_400(agent, route, raw):
    assert_error(post_raw(agent, SEARCH, raw), 400, "invalid_request")


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"query": "caf\xe9"}', "The request body is not valid UTF-8."),
        (b'{"query": "refunds"', "The request body is not valid JSON."),
        (b'{"query": NaN}', "The request body is not valid JSON: NaN is not a JSON number."),
        (b"-Infinity", "The request body is not valid JSON: -Infinity is not a JSON number."),
    ],
)
def test_a_malformed_body_is_refused_with_the_rule_it_breaks(agent, route, raw, reason):
    assert assert_error(post_raw(agent, SEARCH, raw), 400, "invalid_request")["reason"] == reason


@pytest.mark.parametrize(
    "content_type", ["Application/JSON", "APPLICATION/JSON; charset=UTF-8", "application/json "]
)
def test_the_media_type_is_matched_without_regard_to_case(agent, route, content_type):
    response = post_raw(agent, SEARCH, b'{"query": "refunds"}', content_type)
    assert response.status_code == 200, response.content


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
def test_a_body_sent_as_anything_but_json_names_the_content_type(agent, route, content_type):
    """`curl -d` sends a form's content type: the reason says what to send instead."""
    response = post_raw(agent, SEARCH, b'{"query": "refunds"}', content_type)
    error = assert_error(response, 400, "invalid_request", agent.token)
    assert error["reason"] == (
        "The request body must be JSON, sent with Content-Type: application/json."
    )


def test_a_body_larger_than_the_limit_is_400_with_its_reason(agent, run_id, settings):
    big = "x" * (3 * 1024 * 1024)  # beyond Django's own 2.5 MB upload limit too
    for path, body, key in _endpoints(run_id):
        response = post_raw(agent, path, json.dumps({**body, key: big}))
        error = assert_error(response, 400, "invalid_request")
        assert "larger than 1048576 bytes" in error["reason"]
    settings.BAILING_KNOWLEDGE = {"THROTTLE_RATES": None, "MAX_BODY_BYTES": 100}
    response = post_raw(agent, SEARCH, json.dumps({"query": "r" * 100}))
    assert "larger than 100 bytes" in assert_error(response, 400, "invalid_request")["reason"]


def test_nesting_within_the_limit_is_accepted(agent, route):
    context = json.loads('{"a":' * 30 + "1" + "}" * 30)
    response = agent.post(TURNS, turn_body(page_context=context))
    assert response.status_code == 200, response.content


def test_a_nul_in_page_context_burns_no_turn(agent, route):
    bad = _with(turn_body(), "page_context", '{"note": "a\\u0000b"}')
    for _ in range(2):
        assert_error(post_raw(agent, TURNS, bad), 400, "invalid_request")
    assert not Run.objects.exists()
    corrected = agent.post(TURNS, turn_body(page_context={"note": "ab"}))
    assert corrected.status_code == 200, corrected.content


def test_a_lone_surrogate_in_page_context_burns_no_turn(agent, route):
    bad = _with(turn_body(), "page_context", '{"note": "\\ud800"}')
    assert_error(post_raw(agent, TURNS, bad), 400, "invalid_request")
    assert not Run.objects.exists()
    assert agent.post(TURNS, turn_body(page_context={"note": "ok"})).status_code == 200


@pytest.mark.parametrize(
    ("key", "value"),
    [("usage", '{"t": "\\ud800"}'), ("runtime", '{"t": "a\\u0000"}'), ("usage", '"\\u0000"')],
)
def test_a_refused_completion_leaves_the_run_completable(agent, run_id, key, value):
    url = f"/runs/{run_id}/complete"
    bad = _with({"assistant_message_id": "a"}, key, value)
    assert_error(post_raw(agent, url, bad), 400, "invalid_request")
    assert Run.objects.get(run_id=run_id).state == Run.State.CONTEXT_READY
    response = agent.post(url, {"assistant_message_id": "a", key: {"t": "fine"}})
    assert response.status_code == 200, response.content


def test_null_runtime_and_usage_are_the_same_as_leaving_them_out(agent, run_id):
    url = f"/runs/{run_id}/complete"
    first = agent.post(url, {"assistant_message_id": "a", "runtime": None, "usage": None})
    assert first.status_code == 200, first.content
    assert agent.post(url, {"assistant_message_id": "a"}).content == first.content


def test_null_page_context_is_refused(agent, route):
    response = agent.post(TURNS, turn_body(page_context=None))
    assert "page_context" in assert_error(response, 400, "invalid_request")["fields"]


UNKNOWN_PATHS = [
    "/workspaces/orders/knowledge/search/",
    "/workspaces/orders/turns/",
    "/workspaces/not a slug/knowledge/search",
    "/workspaces/orders%2Fx/knowledge/search",
    "/runs//complete",
    "/runs/run_x/complete/",
    "/nope",
]


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete", "get", "options"])
@pytest.mark.parametrize("path", UNKNOWN_PATHS)
def test_unknown_paths_are_json_404_for_every_method_even_with_csrf_checks(issued, path, method):
    http = DjangoClient(enforce_csrf_checks=True)
    response = http.generic(
        method.upper(),
        BASE + path,
        data=json.dumps({"query": "x"}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {issued.access_token}"},
    )
    assert_error(response, 404, "not_found", issued.access_token)


def test_nested_validation_errors_are_nested_json(agent, route):
    binding = {"schema_version": "", "task_id": 5, "scope_hash": "h"}
    response = agent.post(TURNS, turn_body(task_binding=binding, renderers=["ok", 7]))
    fields = assert_error(response, 400, "invalid_request")["fields"]
    assert set(fields["task_binding"]) == {"schema_version", "task_id"}
    assert all(isinstance(m, str) for m in fields["task_binding"]["schema_version"])
    assert fields["task_binding"]["task_id"] == ["Not a valid string."]
    assert fields["renderers"] == {"1": ["Not a valid string."]}
    assert "ErrorDetail" not in response.content.decode()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (SEARCH, {"query": ""}),
        (SEARCH, {"query": " \n\t"}),
        (SEARCH, {"query": "refunds", "run_id": ""}),
        (READ, {"ref": ""}),
        (READ, {"ref": "AAAA", "cursor": ""}),
        (READ, {"ref": "AAAA", "run_id": ""}),
        (TURNS, turn_body(client_turn_id="")),
        (TURNS, turn_body(user_input="")),
    ],
)
def test_empty_strings_are_refused(agent, route, path, body):
    assert_error(agent.post(path, body), 400, "invalid_request")


def test_empty_assistant_message_id_is_refused(agent, run_id):
    response = agent.post(f"/runs/{run_id}/complete", {"assistant_message_id": ""})
    assert_error(response, 400, "invalid_request")


@pytest.fixture
def chain(agent, kb, route):
    upsert_document(kb, "refunds.md", "Refunds", "# Refunds\n\n" + "Refunds take days. " * 400)
    hints = json.loads(agent.post(SEARCH, {"query": "refunds"}).content)["hints"]
    ref = hints[0]["ref"]
    page = json.loads(agent.post(READ, {"ref": ref, "max_bytes": 4096}).content)
    assert page["next_cursor"]
    return ref, page["next_cursor"]


@pytest.mark.parametrize("pad", [(" ", ""), ("", "\n"), ("\t", " "), ("", "\r\n")])
def test_a_genuine_ref_or_cursor_with_whitespace_is_invalid(agent, chain, pad):
    ref, cursor = chain
    before, after = pad
    padded_ref = {"ref": before + ref + after, "max_bytes": 4096}
    assert_error(agent.post(READ, padded_ref), 400, "knowledge_reference_invalid")
    padded_cursor = {"ref": ref, "cursor": before + cursor + after, "max_bytes": 4096}
    assert_error(agent.post(READ, padded_cursor), 400, "knowledge_reference_invalid")
    exact = agent.post(READ, {"ref": ref, "cursor": cursor, "max_bytes": 4096})
    assert exact.status_code == 200
