"""A token's next search sent behind its check: used only as the verified search would
have sent it, and never left behind on the connection."""

from __future__ import annotations

import json
import time

import pytest
from django.core.cache import cache
from django.core.management import call_command
from django.db import connection
from psycopg.pq import TransactionStatus

from bailing_knowledge import services, statements, views
from bailing_knowledge.ingestion.documents import upsert_document
from bailing_knowledge.models import Run
from bailing_knowledge.retrieval import session as search_session
from bailing_knowledge.services import search as search_service
from bailing_knowledge.views import SearchView

from .conftest import assert_error

# Statements are sent behind another only outside a transaction: the test's is committed.
pytestmark = pytest.mark.django_db(transaction=True)

URL = "/workspaces/orders/knowledge/search"
QUERY = {"query": "how long do refunds take"}


@pytest.fixture(autouse=True)
def overlapping(monkeypatch):
    """Every write of statements sent ahead counts as overlapping the process's own work,
    however slow the machine running the tests: none pauses sending ahead."""
    monkeypatch.setattr(statements, "_overlap", statements._Overlap())
    monkeypatch.setattr(statements, "AHEAD_STALLED_SECONDS", float("inf"))


@pytest.fixture
def documents(kb):
    upsert_document(kb, "refunds.md", "Refund policy", "Refunds are paid within five days.")
    upsert_document(kb, "shipping.md", "Shipping", "Orders ship within two days.")
    return kb


@pytest.fixture
def claimed(monkeypatch):
    """The searches that used statements sent behind their token's check."""
    used: list[str] = []
    read = search_session.read_claimed

    def spy(cursor, pending, *args, **kwargs):
        used.append(pending.statements[0])
        return read(cursor, pending, *args, **kwargs)

    monkeypatch.setattr(search_session, "read_claimed", spy)
    return used


def _hints(response) -> list[tuple[str, str, float]]:
    assert response.status_code == 200, response.content
    body = json.loads(response.content)
    return [(h["title"], h["summary"], h["score"]) for h in body["hints"]]


def _nothing_left_behind() -> None:
    assert statements.pending_statements(connection) is None
    assert connection.connection.info.transaction_status == TransactionStatus.IDLE
    assert not any(isinstance(w, statements.Pending) for w in connection.execute_wrappers)


def test_a_tokens_next_search_is_sent_behind_its_check(agent, documents, claimed, monkeypatch):
    assert _hints(agent.post(URL, {"query": "refund"}))
    assert claimed == []  # nothing known yet of what the token searches
    early = _hints(agent.post(URL, QUERY))
    assert claimed == ["BEGIN ISOLATION LEVEL REPEATABLE READ"]
    _nothing_left_behind()
    monkeypatch.setattr(SearchView, "sends_early", False)
    assert _hints(agent.post(URL, QUERY)) == early
    assert len(claimed) == 1


def test_a_refused_token_gets_401_and_nothing_is_left_behind(agent, issued, documents, claimed):
    assert _hints(agent.post(URL, {"query": "refund"}))
    services.revoke_session(issued.session)
    assert_error(agent.post(URL, QUERY), 401, "unauthorized")
    assert claimed == []
    _nothing_left_behind()
    assert (issued.session.token_hash, "orders") not in search_service._searched


def test_a_knowledge_base_disabled_since_is_not_searched_ahead(agent, route, documents, claimed):
    other = services.create_knowledge_base("archive", title="Archive")
    upsert_document(other, "old.md", "Old refund rules", "Refunds took thirty days in 1999.")
    services.bind_knowledge_bases(route, [documents, other])
    titles = {hint[0] for hint in _hints(agent.post(URL, QUERY))}
    assert "Old refund rules" in titles
    services.set_knowledge_base_enabled(other, False)
    titles = {hint[0] for hint in _hints(agent.post(URL, QUERY))}
    assert "Old refund rules" not in titles and "Refund policy" in titles
    assert claimed == []  # what was sent ahead searched the archive: discarded unread
    _nothing_left_behind()
    _hints(agent.post(URL, QUERY))
    assert len(claimed) == 1  # what it searched last time is what it searches now


def test_a_throttled_search_is_429_and_forgets_what_to_send_ahead(
    agent, issued, documents, claimed, settings
):
    cache.clear()
    settings.BAILING_KNOWLEDGE = {"THROTTLE_RATES": {"session": "2/min", "client": "600/min"}}
    _hints(agent.post(URL, {"query": "refund"}))
    _hints(agent.post(URL, QUERY))
    assert_error(agent.post(URL, QUERY), 429, "rate_limited")
    assert len(claimed) == 1
    _nothing_left_behind()
    assert (issued.session.token_hash, "orders") not in search_service._searched
    cache.clear()


def test_an_invalid_body_is_400_and_nothing_is_left_behind(agent, documents, claimed):
    _hints(agent.post(URL, {"query": "refund"}))
    response = agent.post(URL, {"query": "refund", "limit": 0})
    assert assert_error(response, 400, "invalid_request")["fields"]
    assert claimed == []
    _nothing_left_behind()


def test_a_due_last_seen_runs_after_what_was_sent_ahead_is_discarded(
    agent, issued, documents, claimed, settings
):
    """The session's `last_seen_at` update is a statement of its own after the token's:
    what waits behind discards itself first, and the search runs as usual."""
    settings.BAILING_KNOWLEDGE = {"SESSION_LAST_SEEN_INTERVAL": 0}
    first = _hints(agent.post(URL, QUERY))
    before = type(issued.session).objects.get(pk=issued.session.pk).last_seen_at
    assert _hints(agent.post(URL, QUERY)) == first
    assert claimed == []
    _nothing_left_behind()
    assert type(issued.session).objects.get(pk=issued.session.pk).last_seen_at > before


def test_a_search_within_a_run_sends_nothing_ahead(agent, issued, route, documents, claimed):
    _hints(agent.post(URL, {"query": "refund"}))
    run = Run.objects.create(
        session=issued.session,
        client=issued.session.client,
        route=route,
        client_conversation_id="c",
        client_turn_id="t",
        user_message_id="m",
        request_hash="0" * 64,
        state=Run.State.CONTEXT_READY,
    )
    _hints(agent.post(URL, {**QUERY, "run_id": run.run_id}))
    assert claimed == []
    _nothing_left_behind()


@pytest.mark.parametrize("raw", [b"[" * 100_000 + b"]" * 100_000, b'{"query": "a\\ud800"}'])
def test_a_hostile_body_is_still_the_parsers_to_refuse(agent, documents, claimed, raw):
    _hints(agent.post(URL, {"query": "refund"}))
    response = agent.http.post(
        "/agent-api/v1" + URL,
        data=raw,
        content_type="application/json",
        headers={"Authorization": f"Bearer {agent.token}"},
    )
    assert_error(response, 400, "invalid_request")
    assert claimed == []
    _nothing_left_behind()


def test_rate_limits_kept_in_the_database_send_nothing_ahead(
    agent, documents, claimed, settings, monkeypatch
):
    """The rate limits' first read from a database cache would discard what was sent ahead
    (it is a statement of its own): nothing is, and the searches answer as before."""
    composed = []
    monkeypatch.setattr(views, "early_search", lambda *args: composed.append(args))
    settings.CACHES = {
        **settings.CACHES,
        "throttles": {
            "BACKEND": "django.core.cache.backends.db.DatabaseCache",
            "LOCATION": "bk_test_throttles",
        },
    }
    call_command("createcachetable", "bk_test_throttles", verbosity=0)
    settings.BAILING_KNOWLEDGE = {"THROTTLE_CACHE": "throttles"}
    first = _hints(agent.post(URL, QUERY))
    assert _hints(agent.post(URL, QUERY)) == first
    assert claimed == [] and composed == []
    _nothing_left_behind()


def test_an_embedder_that_does_not_embed_ahead_sends_nothing_ahead(
    agent, documents, claimed, monkeypatch
):
    """A remote or model embedder would see the query before the token is checked, twice:
    only one that declares it cheap, local and deterministic is asked ahead."""
    from bailing_knowledge.retrieval.embedders.hashing import HashingEmbedder

    monkeypatch.setattr(HashingEmbedder, "embeds_ahead", False)
    calls = []
    embed = HashingEmbedder.embed_query
    monkeypatch.setattr(
        HashingEmbedder, "embed_query", lambda self, q: calls.append(q) or embed(self, q)
    )
    _hints(agent.post(URL, {"query": "refund"}))
    _hints(agent.post(URL, QUERY))
    assert claimed == [] and calls == ["refund", QUERY["query"]]
    _nothing_left_behind()


def test_a_search_that_finds_knowledge_off_forgets_what_to_send_ahead(
    agent, issued, route, documents, claimed
):
    _hints(agent.post(URL, {"query": "refund"}))
    services.update_route(route, knowledge_enabled=False)
    body = json.loads(agent.post(URL, QUERY).content)
    assert (body["status"], body["hints"]) == ("disabled", [])
    assert (issued.session.token_hash, "orders") not in search_service._searched
    _nothing_left_behind()


def test_search_send_ahead_off_sends_nothing_ahead(agent, documents, claimed, settings):
    settings.BAILING_KNOWLEDGE = {"SEARCH_SEND_AHEAD": False}
    first = _hints(agent.post(URL, QUERY))
    assert _hints(agent.post(URL, QUERY)) == first
    assert claimed == []
    _nothing_left_behind()


def test_composing_that_fails_after_the_vector_leg_left_still_answers(
    agent, documents, claimed, monkeypatch, caplog
):
    """The vector leg's group leaves before the lexical legs' are composed: an error
    composing those ends what is sent ahead (discarded), and the search itself answers."""
    from bailing_knowledge.retrieval.lexical import LexicalLeg

    expected = _hints(agent.post(URL, QUERY))
    opening = LexicalLeg.opening
    calls = []

    def fails_once(self, limit):
        calls.append(limit)
        if len(calls) == 1:
            raise RuntimeError("cannot compose")
        return opening(self, limit)

    monkeypatch.setattr(LexicalLeg, "opening", fails_once)
    sent = []
    first_in_pipeline = statements._first_in_pipeline

    def spy(cursor, text, meanwhile, follow):
        def groups(cursor):
            for group in follow(cursor) or ():
                sent.append(group)
                yield group

        return first_in_pipeline(cursor, text, meanwhile, groups)

    monkeypatch.setattr(statements, "_first_in_pipeline", spy)
    assert _hints(agent.post(URL, QUERY)) == expected
    assert len(sent) == 1 and sent[0][-1].startswith("/* bk:vector */")  # the vector leg left
    assert claimed == [] and len(calls) == 2
    assert "Could not compose a search's opening statements" in caplog.text
    _nothing_left_behind()


def test_searches_stop_sending_ahead_for_a_while_when_the_writes_stall(
    agent, documents, claimed, monkeypatch
):
    """A write of the first statements sent ahead that takes the process off its processor
    means the server runs them in its place: past `AHEAD_STALLS` of the last
    `AHEAD_WINDOW`, searches wait for the token for `AHEAD_PAUSE_SECONDS`."""
    monkeypatch.setattr(statements, "AHEAD_STALLED_SECONDS", 0.0)  # every write stalls
    expected = _hints(agent.post(URL, QUERY))
    for _ in range(statements.AHEAD_STALLS):
        assert _hints(agent.post(URL, QUERY)) == expected
    assert len(claimed) == statements.AHEAD_STALLS
    assert not statements.sending_ahead_pays()
    assert _hints(agent.post(URL, QUERY)) == expected
    assert len(claimed) == statements.AHEAD_STALLS  # paused: nothing sent ahead
    _nothing_left_behind()
    now = time.monotonic() + statements.AHEAD_PAUSE_SECONDS
    monkeypatch.setattr(statements.time, "monotonic", lambda: now)
    assert statements.sending_ahead_pays()
    assert _hints(agent.post(URL, QUERY)) == expected
    assert len(claimed) == statements.AHEAD_STALLS + 1  # sending ahead again
