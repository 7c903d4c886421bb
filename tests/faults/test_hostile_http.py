"""What an outsider can throw at the live server: forged, foreign and swapped references,
hostile bodies on every endpoint, and fuzzed searches and reads against their budgets."""

from __future__ import annotations

import base64
import json
import random

import httpx
import pytest

from . import figures

SEARCH = "/workspaces/orders/knowledge/search"
READ = "/workspaces/orders/knowledge/read"
B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


@pytest.fixture(scope="module")
def http(fault_server):
    headers = {"Authorization": f"Bearer {fault_server.token}"}
    with httpx.Client(base_url=fault_server.url, timeout=30, headers=headers) as client:
        yield client


def _hints(http, query="refunds policy"):
    response = http.post(SEARCH, json={"query": query})
    assert response.status_code == 200, response.text
    return response.json()["hints"]


@pytest.fixture(scope="module")
def genuine(fault_server, http):
    """A ref with a cursor of ours, and a ref issued to another session on another route."""
    policy = next(h for h in _hints(http, "refunds policy clause") if h["title"] == "Refund policy")
    page = http.post(READ, json={"ref": policy["ref"], "max_bytes": 4096}).json()
    assert page["next_cursor"]
    other_headers = {"Authorization": f"Bearer {fault_server.other_token}"}
    other = httpx.post(
        fault_server.url + "/workspaces/billing/knowledge/search",
        json={"query": "refunds"},
        headers=other_headers,
        timeout=30,
    ).json()["hints"]
    return {"ref": policy["ref"], "cursor": page["next_cursor"], "foreign": other[0]["ref"]}


def _mutations(rng: random.Random, ref: str, cursor: str, foreign: str):
    """(body, kind): a request that must not be accepted."""
    token, field = (ref, "ref") if rng.random() < 0.5 else (cursor, "cursor")

    def body(value: str) -> dict:
        return {"ref": value} if field == "ref" else {"ref": ref, "cursor": value}

    kind = rng.choice(
        ["flip", "truncate", "extend", "swap", "foreign", "random", "pad", "case", "foreign-cursor"]
    )
    if kind == "flip":
        at = rng.randrange(len(token))
        replacement = rng.choice(B64.replace(token[at], ""))
        return body(token[:at] + replacement + token[at + 1 :]), kind
    if kind == "truncate":
        return body(token[: rng.randrange(len(token))] or "A"), kind
    if kind == "extend":
        return body(token + "".join(rng.choices(B64, k=rng.randint(1, 8)))), kind
    if kind == "swap":
        return ({"ref": cursor} if field == "ref" else {"ref": ref, "cursor": ref}), kind
    if kind == "foreign":
        return {"ref": foreign}, kind
    if kind == "foreign-cursor":
        return {"ref": foreign, "cursor": cursor}, kind
    if kind == "random":
        raw = base64.urlsafe_b64encode(rng.randbytes(len(token) * 3 // 4)).rstrip(b"=")
        return body(raw.decode()), kind
    if kind == "pad":
        return body(rng.choice([" ", "\n", "\t", "="]) + token), kind
    swapped = token.swapcase()
    return body(swapped if swapped != token else token + "A"), kind


def test_mutated_foreign_and_swapped_references_are_never_accepted(http, genuine):
    rng = random.Random(13)
    tried, accepted, bodies = 0, 0, set()
    statuses: dict[int, int] = {}
    for _ in range(figures.scale(200, 10000)):
        body, _kind = _mutations(rng, genuine["ref"], genuine["cursor"], genuine["foreign"])
        response = http.post(READ, json={**body, "max_bytes": 4096})
        tried += 1
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        if response.status_code == 200:
            accepted += 1
        elif response.status_code == 400:
            bodies.add(response.content)
    figures.count("refs_mutated_requests", tried)
    figures.record("refs_forged_or_foreign_accepted", accepted, 0)
    figures.record("refs_distinct_400_bodies", len(bodies), 1)
    assert accepted == 0, statuses
    assert set(statuses) == {400}, statuses
    assert len(bodies) == 1, bodies
    # The genuine pair still works: the mutations were tried against live references.
    real = http.post(READ, json={"ref": genuine["ref"], "cursor": genuine["cursor"]})
    assert real.status_code in {200, 409}, real.text


ENDPOINTS = [
    ("post", SEARCH),
    ("post", READ),
    ("post", "/workspaces/orders/turns"),
    ("post", "/runs/run_x/complete"),
    ("get", "/workspaces/orders/knowledge/capabilities"),
]


def _hostile_body(rng: random.Random) -> tuple[bytes, str]:
    kind = rng.choice(["deep", "wide-deep", "large", "bytes", "surrogate", "nul", "number"])
    if kind == "deep":
        depth = rng.choice([33, 1000, 5000, 100_000])
        return ("[" * depth + "]" * depth).encode(), kind
    if kind == "wide-deep":
        depth = rng.randint(20, 2000)
        return ('{"query":' + '{"a":' * depth + "1" + "}" * depth + "}").encode(), kind
    if kind == "large":
        size = rng.choice([1024 * 1024 + 1, 3 * 1024 * 1024])
        return json.dumps({"query": "x" * size}).encode(), kind
    if kind == "bytes":
        return rng.randbytes(rng.randint(1, 200)), kind
    if kind == "surrogate":
        escape = rng.choice(["\\ud800", "\\udfff", "\\udbff\\u0041", "\\ud83d"])
        return ('{"query": "a' + escape + '"}').encode(), kind
    if kind == "nul":
        where = rng.choice(['{"query": "a\\u0000"}', '{"\\u0000": 1}', '{"query": "\\u0000"}'])
        return where.encode(), kind
    return rng.choice([b'{"query": 1e400}', b'{"query": -1e999}', b'{"limit": 1e400}']), kind


def test_hostile_bodies_on_every_endpoint_are_json_4xx(fault_server, http):
    rng = random.Random(1013)
    tried, server_errors, not_json = 0, 0, 0
    for _ in range(figures.scale(100, 2000)):
        method, path = rng.choice(ENDPOINTS)
        raw, kind = _hostile_body(rng)
        response = http.request(
            method, path, content=raw, headers={"Content-Type": "application/json"}
        )
        tried += 1
        server_errors += response.status_code >= 500
        try:
            answer = response.json()
            not_json += not ((isinstance(answer, dict) and "error" in answer) or method == "get")
        except ValueError:
            not_json += 1
        assert response.status_code < 500, (kind, response.status_code, response.text)
    figures.count("hostile_body_requests", tried)
    figures.record("hostile_body_5xx", server_errors, 0)
    figures.record("hostile_body_not_json", not_json, 0)
    assert not_json == 0


def _fuzzed_query(rng: random.Random) -> str:
    pieces = ["refunds", "policy", "退款", "🙂", "e\u0301", "👩\u200d👩\u200d👧", "clause 7", "ß"]
    alphabet = "abcdefghijklmnopqrstuvwxyz  退款政策éüñ🙂\u0301\u200d"
    words = [
        rng.choice(pieces) if rng.random() < 0.6 else "".join(rng.choices(alphabet, k=8))
        for _ in range(rng.randint(1, 12))
    ]
    return " ".join(words)[:2000]


def test_fuzzed_searches_and_reads_stay_within_their_budgets(http):
    rng = random.Random(2013)
    tried = over = 0
    for _ in range(figures.scale(40, 1500)):
        response = http.post(SEARCH, json={"query": _fuzzed_query(rng), "limit": rng.randint(1, 3)})
        tried += 1
        assert response.status_code == 200, response.text
        over += len(response.content) > 4096
        for hint in response.json()["hints"][:1]:
            max_bytes = rng.randint(4096, 32768)
            page = http.post(READ, json={"ref": hint["ref"], "max_bytes": max_bytes})
            tried += 1
            assert page.status_code in {200, 409}, page.text
            over += len(page.content) > max_bytes
    figures.count("fuzz_search_read_requests", tried)
    figures.record("fuzz_budget_violations", over, 0)
    assert over == 0
