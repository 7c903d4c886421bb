"""The read endpoint: budgets, grapheme-safe pages, chain windows, every error path."""

from __future__ import annotations

import base64
import json
import random
import threading
import time
from unittest import mock

import pytest
import regex
from django.db import OperationalError, connections
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from bailing_knowledge import services, signing
from bailing_knowledge.budget import utf8_len
from bailing_knowledge.ingestion.documents import upsert_document
from bailing_knowledge.models import Document, Run, Task, content_hash
from bailing_knowledge.services.read import read

from ..services.test_read import ref_for
from .conftest import AgentCaller, assert_error

pytestmark = pytest.mark.django_db

SEARCH = "/workspaces/orders/knowledge/search"
READ = "/workspaces/orders/knowledge/read"

PIECES = [
    "Plain ASCII sentence about refunds. ",
    "中文句子，关于退款政策。",
    "👨‍👩‍👧‍👦",
    "👍🏽",
    "e\u0301a\u0300",
    '"quoted" and \\backslashed\\ ',
    "\n",
    "\x01\x1f",
    "🇨🇭",
    "\u2028",
]


def mixed_text(size: int, seed: int = 7) -> str:
    rng = random.Random(seed)
    parts, length = [], 0
    while length < size:
        piece = rng.choice(PIECES)
        parts.append(piece)
        length += len(piece.encode("utf-8"))
    return "".join(parts)


def graphemes_boundaries(text: str) -> set[int]:
    boundaries, position = {0}, 0
    for cluster in regex.findall(r"\X", text):
        position += len(cluster)
        boundaries.add(position)
    return boundaries


def first_ref(caller, query, **extra):
    response = caller.post(SEARCH, {"query": query, **extra})
    assert response.status_code == 200, response.content
    hints = json.loads(response.content)["hints"]
    assert hints, query
    return hints[0]["ref"]


def read_chain(caller, ref, max_bytes, **extra):
    pages, cursor = [], None
    while True:
        body = {"ref": ref, "max_bytes": max_bytes, **extra}
        if cursor:
            body["cursor"] = cursor
        response = caller.post(READ, body)
        assert response.status_code == 200, response.content
        assert response["Cache-Control"] == "no-store"
        assert len(response.content) <= max_bytes
        page = json.loads(response.content)
        pages.append(page)
        cursor = page["next_cursor"]
        if cursor is None:
            return pages


@pytest.fixture
def big_document(kb):
    # Over a megabyte, with a unique word past the first 128 KiB.
    body = "# Handbook\n\n" + mixed_text(600_000) + "\n\n# Far section\n\nThe zeppelin clause. "
    body += mixed_text(500_000, seed=11)
    upsert_document(kb, "big.md", "Big handbook", body)
    return Document.objects.get(source_key="big.md")


def test_small_document_reads_in_one_page(agent, issued, kb):
    body = "# Refunds\n\nRefunds take five days. 退款需要五天。👍🏽"
    upsert_document(kb, "small.md", "Refunds", body)
    ref = first_ref(agent, "refunds")
    (page,) = read_chain(agent, ref, 16384)
    assert page["schema_version"] == "bailing.agent-knowledge-read.v1"
    assert page["content"] == body
    assert (page["truncated"], page["budget_exhausted"], page["next_cursor"]) == (
        False,
        False,
        None,
    )
    assert page["total_content_bytes"] == utf8_len(body)
    assert page["read_chain_max_bytes"] == 131072
    assert (page["ref"], page["title"], page["trust"]) == (ref, "Refunds", "reference_only")
    assert "run_id" not in page
    assert page["revision"] == 1


def test_default_page_size_is_16384(agent, kb):
    upsert_document(kb, "mid.md", "Mid", "# Mid\n\n" + mixed_text(40_000))
    response = agent.post(READ, {"ref": first_ref(agent, "refunds")})
    assert 16384 - 400 < len(response.content) <= 16384


def _check_chain(pages, body, max_bytes):
    content = "".join(p["content"] for p in pages)
    start = body.index(pages[0]["content"][:200])
    assert body[start : start + len(content)] == content
    boundaries = graphemes_boundaries(body)
    position = start
    for page in pages:
        assert position in boundaries
        position += len(page["content"])
        assert position in boundaries
    assert utf8_len(content) <= 131072
    last = pages[-1]
    assert (last["truncated"], last["budget_exhausted"], last["next_cursor"]) == (True, True, None)
    assert all(p["truncated"] and not p["budget_exhausted"] for p in pages[:-1])
    assert all(p["total_content_bytes"] == utf8_len(body) for p in pages)
    return start, content


@pytest.mark.parametrize("max_bytes", [4096, 16384, 32768, "random"])
def test_one_megabyte_chain(agent, big_document, max_bytes):
    sizes = [random.Random(3).randint(4096, 32768)] if max_bytes == "random" else [max_bytes]
    ref = first_ref(agent, "zeppelin clause")
    for size in sizes:
        pages = read_chain(agent, ref, size)
        start, content = _check_chain(pages, big_document.body, size)
        # The hit lies beyond the first 128 KiB, and inside the chain's window.
        assert utf8_len(big_document.body[:start]) > 131072
        assert "zeppelin" in content
        assert utf8_len(content) > 131072 - 64


def test_window_starts_at_the_hit_section(agent, big_document):
    pages = read_chain(agent, first_ref(agent, "zeppelin clause"), 32768)
    assert pages[0]["content"].startswith("# Far section")


@hsettings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    text=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=3000),
    repeat=st.integers(min_value=1, max_value=120),
    max_bytes=st.integers(min_value=4096, max_value=32768),
    hit=st.floats(min_value=0, max_value=1),
)
def test_read_chain_properties(issued, route, kb, text, repeat, max_bytes, hit):
    body = (text * repeat).replace("\x00", "") or "x"
    title = "T"
    document, _ = Document.objects.update_or_create(
        knowledge_base=kb,
        source_key="prop",
        defaults={
            "title": title,
            "body": body,
            "content_hash": content_hash(title, body),
            "status": Document.Status.READY,
            "revision": 1,
        },
    )
    boundaries = sorted(graphemes_boundaries(body))
    hit_start = boundaries[int(hit * (len(boundaries) - 1))]
    identity = signing.Identity.for_session(issued.session, "orders")
    ref = signing.sign_reference(
        identity,
        signing.ReferenceClaims(
            run_id=None,
            knowledge_scope_revision=route.knowledge_scope_revision,
            document_id=document.pk,
            revision=1,
            content_hash=document.content_hash,
            hit_start=hit_start,
            hit_end=hit_start,
        ),
    )
    pages, cursor = [], None
    while True:
        page = read(issued.session, route, ref, cursor=cursor, max_bytes=max_bytes)
        encoded = json.dumps(page, ensure_ascii=False, separators=(",", ":")).encode()
        assert len(encoded) <= max_bytes
        pages.append(page)
        cursor = page["next_cursor"]
        if cursor is None:
            break
    content = "".join(p["content"] for p in pages)
    assert content in body
    assert utf8_len(content) <= 131072
    start = 0 if utf8_len(body) <= 131072 else None
    if start == 0:
        assert content == body
        assert pages[-1]["truncated"] is False
    else:
        assert pages[-1]["budget_exhausted"] is True
        position = body.find(content)
        assert position <= hit_start <= position + len(content)
    all_boundaries = set(boundaries)
    offset = body.find(content)
    for page in pages:
        assert offset in all_boundaries
        offset += len(page["content"])
    assert offset in all_boundaries


# --------------------------------------------------------------------------- errors


@pytest.fixture
def doc(kb):
    upsert_document(kb, "refunds.md", "Refunds", "# Refunds\n\n" + mixed_text(30_000))
    return Document.objects.get(source_key="refunds.md")


@pytest.fixture
def chain(agent, doc):
    ref = first_ref(agent, "refunds")
    page = json.loads(agent.post(READ, {"ref": ref, "max_bytes": 4096}).content)
    assert page["next_cursor"]
    return ref, page["next_cursor"]


def _flip(token: str, position: int) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    replacement = alphabet[(alphabet.index(token[position]) + 1) % len(alphabet)]
    return token[:position] + replacement + token[position + 1 :]


def test_any_changed_character_of_a_ref_or_cursor_is_invalid(agent, issued, chain):
    ref, cursor = chain
    for position in range(len(ref)):
        response = agent.post(READ, {"ref": _flip(ref, position)})
        assert_error(response, 400, "knowledge_reference_invalid", issued.access_token)
    for position in range(len(cursor)):
        response = agent.post(READ, {"ref": ref, "cursor": _flip(cursor, position)})
        assert_error(response, 400, "knowledge_reference_invalid")


def test_ref_and_cursor_cannot_stand_in_for_each_other(agent, chain):
    ref, cursor = chain
    assert_error(agent.post(READ, {"ref": cursor}), 400, "knowledge_reference_invalid")
    assert_error(agent.post(READ, {"ref": ref, "cursor": ref}), 400, "knowledge_reference_invalid")
    assert_error(
        agent.post(READ, {"ref": cursor, "cursor": ref}), 400, "knowledge_reference_invalid"
    )


def test_a_cursor_only_continues_its_own_ref(agent, kb, chain):
    ref, cursor = chain
    upsert_document(kb, "other.md", "Other", "# Other refunds\n\n" + mixed_text(30_000, seed=2))
    other = json.loads(agent.post(SEARCH, {"query": "refunds"}).content)["hints"]
    other_ref = next(h["ref"] for h in other if h["ref"] != ref)
    assert_error(
        agent.post(READ, {"ref": other_ref, "cursor": cursor}), 400, "knowledge_reference_invalid"
    )


def _run(issued, route, **kwargs):
    return Run.objects.create(
        session=issued.session,
        client=issued.session.client,
        route=route,
        client_conversation_id="c",
        client_turn_id=kwargs.pop("turn", "t"),
        user_message_id="m",
        request_hash="0" * 64,
        state=kwargs.pop("state", Run.State.CONTEXT_READY),
        **kwargs,
    )


def test_refs_and_cursors_are_bound_to_their_run(agent, issued, route, doc):
    run = _run(issued, route)
    other_run = _run(issued, route, turn="t2")
    ref = first_ref(agent, "refunds", run_id=run.run_id)
    page = json.loads(
        agent.post(READ, {"ref": ref, "run_id": run.run_id, "max_bytes": 4096}).content
    )
    assert page["run_id"] == run.run_id
    cursor = page["next_cursor"]
    for body in (
        {"ref": ref},
        {"ref": ref, "run_id": other_run.run_id},
        {"ref": ref, "cursor": cursor},
        {"ref": ref, "cursor": cursor, "run_id": other_run.run_id},
    ):
        assert_error(agent.post(READ, body), 400, "knowledge_reference_invalid")
    ok = agent.post(READ, {"ref": ref, "cursor": cursor, "run_id": run.run_id})
    assert ok.status_code == 200


def test_refs_are_bound_to_session_client_and_route(agent, issued, route, agent_client, kb, chain):
    ref, cursor = chain
    same_principal = services.issue_session(
        agent_client,
        principal_id="user-1",
        tenant="acme",
        roles=["support"],
        audience="staff",
        routes=[route],
    )
    other_client = services.create_client("other-agent", routes=[route])
    foreign = services.issue_session(
        other_client,
        principal_id="user-1",
        tenant="acme",
        roles=["support"],
        audience="staff",
        routes=[route],
    )
    for issued_other in (same_principal, foreign):
        caller = AgentCaller(issued_other.access_token)
        assert_error(caller.post(READ, {"ref": ref}), 400, "knowledge_reference_invalid")
        assert_error(
            caller.post(READ, {"ref": ref, "cursor": cursor}), 400, "knowledge_reference_invalid"
        )
    services.create_route("billing", knowledge_bases=[kb])
    services.update_client(agent_client, routes=["orders", "billing"])
    two_routes = services.issue_session(
        agent_client,
        principal_id="user-1",
        tenant="acme",
        roles=["support"],
        audience="staff",
        routes=["orders", "billing"],
    )
    caller = AgentCaller(two_routes.access_token)
    ref_here = first_ref(caller, "refunds")
    response = caller.post("/workspaces/billing/knowledge/read", {"ref": ref_here})
    assert_error(response, 400, "knowledge_reference_invalid")


def test_expiry_with_a_frozen_clock(agent, chain):
    ref, cursor = chain
    now = time.time()
    with mock.patch("bailing_knowledge.services.read.time.time", return_value=now + 290):
        assert agent.post(READ, {"ref": ref, "cursor": cursor}).status_code == 200
    with mock.patch("bailing_knowledge.services.read.time.time", return_value=now + 302):
        assert_error(agent.post(READ, {"ref": ref}), 410, "knowledge_reference_expired")
        assert_error(
            agent.post(READ, {"ref": ref, "cursor": cursor}), 410, "knowledge_reference_expired"
        )
        # Forged and expired: invalid, not expired.
        assert_error(agent.post(READ, {"ref": _flip(ref, 5)}), 400, "knowledge_reference_invalid")
        assert_error(
            agent.post(READ, {"ref": ref, "cursor": _flip(cursor, 5)}),
            400,
            "knowledge_reference_invalid",
        )


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda route, kb: services.set_knowledge_base_enabled(kb, False), id="kb-off"),
        pytest.param(lambda route, kb: services.unbind_knowledge_bases(route, [kb]), id="kb-gone"),
        pytest.param(lambda route, kb: services.update_route(route, top_k=9), id="setting"),
    ],
)
def test_scope_changes_are_409(agent, route, kb, chain, change):
    ref, cursor = chain
    change(route, kb)
    assert_error(agent.post(READ, {"ref": ref}), 409, "knowledge_scope_changed")
    assert_error(agent.post(READ, {"ref": ref, "cursor": cursor}), 409, "knowledge_scope_changed")


def _update(doc, kb):
    upsert_document(kb, doc.source_key, doc.title, doc.body + " More.")


def _delete(doc, kb):
    doc.delete()


def _unready(doc, kb):
    Document.objects.filter(pk=doc.pk).update(status=Document.Status.FAILED)


def _move(doc, kb):
    elsewhere = services.create_knowledge_base("elsewhere")
    Document.objects.filter(pk=doc.pk).update(knowledge_base=elsewhere)


def _hide(doc, kb):
    upsert_document(kb, doc.source_key, doc.title, doc.body, {"audiences": ["partners"]})


def _restrict_to_no_one(doc, kb):
    # A restricting key with no list restricts all the same, as the search's SQL has it.
    upsert_document(kb, doc.source_key, doc.title, doc.body, {"roles": None})


@pytest.mark.parametrize("change", [_update, _delete, _unready, _move, _hide, _restrict_to_no_one])
def test_document_changes_are_409(agent, kb, doc, chain, change):
    ref, cursor = chain
    change(doc, kb)
    assert_error(agent.post(READ, {"ref": ref}), 409, "knowledge_changed")
    assert_error(agent.post(READ, {"ref": ref, "cursor": cursor}), 409, "knowledge_changed")


def test_run_completed_or_task_paused_is_run_not_current(agent, issued, route, doc):
    task = Task.objects.create(title="Quarter close")
    task.members.add(issued.session)
    run = _run(issued, route, task=task)
    ref = first_ref(agent, "refunds", run_id=run.run_id)
    body = {"ref": ref, "run_id": run.run_id}
    assert agent.post(READ, body).status_code == 200
    Task.objects.filter(pk=task.pk).update(state=Task.State.PAUSED)
    assert_error(agent.post(READ, body), 409, "run_not_current")
    Task.objects.filter(pk=task.pk).update(state=Task.State.ACTIVE)
    task.members.remove(issued.session)
    assert_error(agent.post(READ, body), 409, "run_not_current")
    task.members.add(issued.session)
    Run.objects.filter(pk=run.pk).update(state=Run.State.COMPLETED)
    assert_error(agent.post(READ, body), 409, "run_not_current")


def test_database_failure_is_503(agent, issued, chain):
    ref, _ = chain
    with mock.patch(
        "bailing_knowledge.services.read._current_document",
        side_effect=OperationalError("SELECT body FROM secret"),
    ):
        response = agent.post(READ, {"ref": ref})
    assert_error(response, 503, "knowledge_unavailable", "SELECT", ref, issued.access_token)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"ref": ""},
        {"ref": 5},
        {"ref": "x", "max_bytes": 4095},
        {"ref": "x", "max_bytes": 32769},
        {"ref": "x", "max_bytes": "5000"},
        {"ref": "x", "cursor": None},
        {"ref": "x", "document_id": 3},
    ],
)
def test_invalid_read_requests(agent, route, body):
    assert_error(agent.post(READ, body), 400, "invalid_request")


def test_garbage_refs_are_reference_invalid(agent, route):
    for ref in ["x", "A" * 300, base64.urlsafe_b64encode(b"\x01" * 120).decode(), "é" * 10]:
        assert_error(agent.post(READ, {"ref": ref}), 400, "knowledge_reference_invalid")


@pytest.mark.django_db(transaction=True)
def test_reader_gets_knowledge_changed_when_the_document_changes_mid_chain():
    kb = services.create_knowledge_base("handbook")
    route = services.create_route("orders", knowledge_bases=[kb])
    client = services.create_client("acme-agent", routes=[route])
    issued = services.issue_session(client, principal_id="u", routes=[route])
    bodies = {1: "# Refunds\n\n" + mixed_text(60_000, seed=1)}
    upsert_document(kb, "doc.md", "Doc", bodies[1])
    caller = AgentCaller(issued.access_token)
    ref = first_ref(caller, "refunds")
    results: list = []
    started, updated = threading.Event(), threading.Event()

    def reader():
        try:
            local = AgentCaller(issued.access_token)
            cursor = None
            while True:
                body = {"ref": ref, "max_bytes": 4096} | ({"cursor": cursor} if cursor else {})
                response = local.post(READ, body)
                results.append((response.status_code, json.loads(response.content)))
                if response.status_code != 200:
                    return
                cursor = results[-1][1]["next_cursor"]
                if cursor is None:
                    return
                if len(results) == 2:
                    # Two pages in: let the writer commit a new revision, then go on.
                    started.set()
                    updated.wait(60)
        finally:
            connections.close_all()

    thread = threading.Thread(target=reader)
    thread.start()
    assert started.wait(60)
    for revision in range(2, 4):
        bodies[revision] = "# Refunds\n\n" + mixed_text(60_000, seed=revision)
        upsert_document(kb, "doc.md", "Doc", bodies[revision])
        updated.set()
    thread.join(60)
    statuses = [status for status, _ in results]
    assert statuses[-1] == 409
    assert results[-1][1]["error"] == "knowledge_changed"
    assert set(statuses[:-1]) == {200}
    content = "".join(page["content"] for _, page in results[:-1])
    assert bodies[1].startswith(content)


@pytest.mark.parametrize("max_bytes", [4096, 16384])
def test_a_body_that_fits_one_page_exactly_is_one_page(issued, route, kb, max_bytes):
    agent = AgentCaller(issued.access_token)
    upsert_document(kb, "exact.md", "Exact", "x")
    document = Document.objects.get(source_key="exact.md")
    response = agent.post(
        "/workspaces/orders/knowledge/read",
        {"ref": ref_for(issued, route, document, 0, time.time()), "max_bytes": max_bytes},
    )
    # What the page costs besides its content, and the size digits of a body of n bytes.
    overhead = len(response.content) - len("x") - len("1")
    size = next(n for n in range(max_bytes) if overhead + len(str(n)) + n == max_bytes)
    body = "y" * size
    upsert_document(kb, "exact.md", "Exact", body)
    document = Document.objects.get(source_key="exact.md")
    response = agent.post(
        "/workspaces/orders/knowledge/read",
        {"ref": ref_for(issued, route, document, 0, time.time()), "max_bytes": max_bytes},
    )
    assert len(response.content) == max_bytes
    page = json.loads(response.content)
    assert (page["content"], page["next_cursor"], page["truncated"]) == (body, None, False)
