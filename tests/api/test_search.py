"""The search endpoint: hybrid retrieval, visibility, validation of hits, budgets, errors."""

from __future__ import annotations

import json
from unittest import mock

import pytest
from django.db import OperationalError, connection
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from bailing_knowledge import services, signing
from bailing_knowledge.ingestion.documents import upsert_document
from bailing_knowledge.models import Chunk, Document, KnowledgeBase, Run
from bailing_knowledge.retrieval.postings import encode_terms
from bailing_knowledge.services.search import SearchOptions, search
from tests.hnsw import rebuild_vector_index

from .conftest import AgentCaller, assert_error

pytestmark = pytest.mark.django_db

URL = "/workspaces/orders/knowledge/search"

REFUNDS = (
    "# Refund policy\n\nCustomers may return unused items within thirty days for a full refund. "
    "Refunds are paid to the original payment method within five business days."
)
SHIPPING = (
    "# Shipping\n\nOrders ship from our warehouse within two days. Express shipping costs "
    "extra and arrives the next business day."
)
CHINESE = (
    "# 退货政策\n\n顾客可以在三十天内退回未使用的商品并获得全额退款。"
    "退款将在五个工作日内退回原支付方式。"
)


@pytest.fixture
def documents(kb):
    upsert_document(kb, "refunds.md", "Refund policy", REFUNDS)
    upsert_document(kb, "shipping.md", "Shipping", SHIPPING)
    upsert_document(kb, "zh/refunds.md", "退货政策", CHINESE)
    return kb


def _search(agent, body):
    response = agent.post(URL, body)
    assert response["Cache-Control"] == "no-store"
    return response


def test_search_returns_budgeted_hints_with_signed_refs(agent, issued, route, documents):
    response = _search(agent, {"query": "how long do refunds take"})
    assert response.status_code == 200, response.content
    assert len(response.content) <= 4096
    body = json.loads(response.content)
    assert body["schema_version"] == "bailing.agent-knowledge-search.v1"
    assert body["route"] == "orders"
    assert "run_id" not in body
    assert body["knowledge_scope_revision"] == route.knowledge_scope_revision
    assert (body["status"], body["trust"], body["truncated"]) == ("ok", "reference_only", False)
    assert 1 <= len(body["hints"]) <= 3
    top = body["hints"][0]
    assert top["title"] == "Refund policy"
    assert top["summary"] in REFUNDS
    assert 0 < top["score"] <= 1
    assert top["expires_at"].endswith("Z")
    identity = signing.Identity.for_session(issued.session, "orders")
    claims = signing.verify_reference(top["ref"], identity, run_id=None)
    document = Document.objects.get(source_key="refunds.md")
    assert (claims.document_id, claims.revision) == (document.pk, document.revision)
    assert claims.content_hash == document.content_hash
    assert REFUNDS[claims.hit_start : claims.hit_end] == top["summary"]
    # One hint per document, best first.
    titles = [hint["title"] for hint in body["hints"]]
    assert len(titles) == len(set(titles))
    scores = [hint["score"] for hint in body["hints"]]
    assert scores == sorted(scores, reverse=True)


def test_limit_caps_the_hints(agent, documents):
    body = json.loads(
        _search(agent, {"query": "refund shipping business days", "limit": 1}).content
    )
    assert len(body["hints"]) == 1


def test_route_max_docs_caps_the_hints(agent, route, documents):
    services.update_route(route, max_docs=1)
    body = json.loads(_search(agent, {"query": "refund shipping business days"}).content)
    assert len(body["hints"]) == 1


def test_min_score_filters_hints(agent, route, documents):
    services.update_route(route, min_score=1.0)
    body = json.loads(_search(agent, {"query": "express shipping"}).content)
    assert body["status"] == "ok"
    assert all(hint["score"] >= 1.0 for hint in body["hints"])


def test_zero_hits_is_ok_not_failure(agent, documents):
    body = json.loads(_search(agent, {"query": "xylophone"}).content)
    assert (body["status"], body["hints"]) == ("ok", [])


def test_knowledge_off_is_disabled(agent, route, documents):
    services.update_route(route, knowledge_enabled=False)
    body = json.loads(_search(agent, {"query": "refund"}).content)
    assert (body["status"], body["hints"]) == ("disabled", [])


def test_disabled_kb_is_not_searched(agent, kb, documents):
    services.set_knowledge_base_enabled(kb, False)
    body = json.loads(_search(agent, {"query": "refund"}).content)
    assert (body["status"], body["hints"]) == ("disabled", [])


def test_chinese_query_finds_chinese_document_lexically(issued, route, documents):
    body = search(issued.session, route, "退款需要多久", options=SearchOptions(use_vector=False))
    assert body["status"] == "ok"
    assert body["hints"][0]["title"] == "退货政策"


def test_failing_embedder_degrades_to_partial_with_lexical_hits(agent, documents, settings):
    settings.BAILING_KNOWLEDGE = {
        "EMBEDDERS": {
            "default": {
                "BACKEND": "bailing_knowledge.retrieval.embedders.OpenAIEmbedder",
                # Nothing listens on the discard port: a real connection failure.
                "OPTIONS": {
                    "BASE_URL": "http://127.0.0.1:9/v1",
                    "MODEL": "m",
                    "MAX_RETRIES": 0,
                    "TIMEOUT": 2,
                    "DIMENSIONS": 384,
                },
            }
        }
    }
    body = json.loads(_search(agent, {"query": "refund policy"}).content)
    assert body["status"] == "partial"
    assert body["hints"][0]["title"] == "Refund policy"


def test_a_kb_language_the_stemmers_lack_fails_only_the_lexical_leg(agent, kb, documents, caplog):
    # Written past the validation (a queryset update, a fixture, a stemmer package that
    # lost a language): the vector leg still answers.
    KnowledgeBase.objects.filter(pk=kb.pk).update(language="klingon")
    with connection.cursor() as cursor:
        rebuild_vector_index(cursor)  # the vector leg alone answers: only this test's rows
    body = json.loads(_search(agent, {"query": "refund policy"}).content)
    assert body["status"] == "partial"
    assert body["hints"][0]["title"] == "Refund policy"
    assert "unsupported language 'klingon'" in caplog.text


def test_database_failure_is_503_without_leak(agent, issued, documents):
    secret = "SELECT body FROM bailing_knowledge_document -- refund"
    with mock.patch(
        "bailing_knowledge.retrieval.hybrid.HybridSearch._lexical",
        side_effect=OperationalError(secret),
    ):
        response = _search(agent, {"query": "refund secret-query-text"})
    assert_error(response, 503, "knowledge_unavailable", secret, "secret-query-text")


def test_stale_index_rows_are_never_returned(agent, kb, documents):
    document = Document.objects.get(source_key="shipping.md")
    fresh = Chunk.objects.filter(document=document).first()
    with connection.cursor() as cursor:
        # An index row left from an older revision, and one whose text no longer matches.
        for revision, text in [(document.revision + 5, "quokka"), (document.revision, "wombat")]:
            cursor.execute(
                "INSERT INTO bailing_knowledge_chunk (document_id, knowledge_base_id, revision, "
                'ordinal, "start", "end", "text", text_hash, search_vector, lexical_terms, '
                "lexical_length) VALUES (%s, %s, %s, 999, 0, 6, %s, '', %s::tsvector, "
                "%s::tsvector, 1)",
                [document.pk, kb.pk, revision, text, *_lexical(text)],
            )
    assert fresh is not None
    for word in ("quokka", "wombat"):
        body = json.loads(_search(agent, {"query": word}).content)
        assert body["hints"] == [], word


def _lexical(text):
    encoded = encode_terms([text])
    return encoded.levels, encoded.terms


def _scores(caller, query):
    body = json.loads(caller.post(URL, {"query": query}).content)
    return {hint["title"]: hint["score"] for hint in body["hints"]}


def test_tenant_bound_kbs_are_invisible_and_do_not_change_scores(agent, route, documents):
    with connection.cursor() as cursor:
        rebuild_vector_index(cursor)  # the scores hold the vector leg's ranks: its rows alone
    baseline = _scores(agent, "refund policy thirty days")
    other = services.create_knowledge_base("other-tenant", tenant="globex")
    services.bind_knowledge_bases(route, [other])
    for i in range(5):
        upsert_document(other, f"r{i}.md", f"Secret refund {i}", REFUNDS + f" globex {i}")
    assert _scores(agent, "refund policy thirty days") == baseline
    assert "globex" not in _search(agent, {"query": "globex"}).content.decode()


def test_audience_and_role_restricted_documents(agent, kb, documents):
    with connection.cursor() as cursor:
        rebuild_vector_index(cursor)  # as above
    baseline = _scores(agent, "refund policy thirty days")
    upsert_document(kb, "partners.md", "Partner refunds", REFUNDS, {"audiences": ["partners"]})
    upsert_document(kb, "finance.md", "Finance refunds", REFUNDS, {"roles": ["finance"]})
    assert _scores(agent, "refund policy thirty days") == baseline
    # The principal is audience "staff" with role "support": these are visible.
    upsert_document(kb, "staff.md", "Staff refunds", REFUNDS + " staff", {"audiences": ["staff"]})
    upsert_document(kb, "support.md", "Support refunds", REFUNDS, {"roles": ["support", "x"]})
    titles = set(_scores(agent, "refund policy thirty days staff"))
    assert {"Staff refunds", "Support refunds"} & titles


def _run(issued, route, state=Run.State.CONTEXT_READY, **kwargs):
    return Run.objects.create(
        session=issued.session,
        client=issued.session.client,
        route=route,
        client_conversation_id="c",
        client_turn_id=kwargs.pop("turn", "t"),
        user_message_id="m",
        request_hash="0" * 64,
        state=state,
        **kwargs,
    )


def test_search_within_a_current_run(agent, issued, route, documents):
    run = _run(issued, route)
    body = json.loads(_search(agent, {"query": "refund", "run_id": run.run_id}).content)
    assert body["run_id"] == run.run_id
    identity = signing.Identity.for_session(issued.session, "orders")
    signing.verify_reference(body["hints"][0]["ref"], identity, run_id=run.run_id)
    with pytest.raises(signing.ReferenceInvalid):
        signing.verify_reference(body["hints"][0]["ref"], identity, run_id=None)


@pytest.mark.parametrize("state", ["preparing", "completed", "failed", "cancelled"])
def test_search_with_a_run_that_is_not_current(agent, issued, route, documents, state):
    run = _run(issued, route, state=state)
    assert_error(_search(agent, {"query": "x", "run_id": run.run_id}), 409, "run_not_current")


def test_search_with_someone_elses_run(agent, issued, route, agent_client, documents):
    other = services.issue_session(agent_client, principal_id="user-1", routes=[route])
    run = _run(other, route)
    assert_error(_search(agent, {"query": "x", "run_id": run.run_id}), 409, "run_not_current")
    assert_error(_search(agent, {"query": "x", "run_id": "run_nope"}), 409, "run_not_current")


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"query": ""},
        {"query": "   "},
        {"query": "x" * 2001},
        {"query": 42},
        {"query": "x", "limit": 0},
        {"query": "x", "limit": 4},
        {"query": "x", "limit": "2"},
        {"query": "x", "limit": True},
        {"query": "x", "limit": 2.0},
        {"query": "x", "run_id": 7},
        {"query": "x", "client_id": "acme"},
        {"query": "x", "knowledge_base_id": 1},
        {"query": "x", "route": "other"},
        ["query"],
        "query",
    ],
)
def test_invalid_requests(agent, route, body):
    response = agent.post(URL, body)
    payload = assert_error(response, 400, "invalid_request")
    assert "x" * 50 not in response.content.decode()
    assert "fields" in payload


def test_malformed_json(agent, route):
    response = agent.http.post(
        "/agent-api/v1" + URL,
        data="{not json",
        content_type="application/json",
        headers={"Authorization": f"Bearer {agent.token}"},
    )
    assert_error(response, 400, "invalid_request", "not json")


def test_query_is_never_echoed_in_errors(agent, route):
    query = "my-secret-query " * 200
    response = agent.post(URL, {"query": query})
    assert_error(response, 400, "invalid_request", "my-secret-query")


def test_exactly_2000_characters_is_accepted(agent, route, documents):
    assert agent.post(URL, {"query": "é" * 2000}).status_code == 200


text_strategy = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)), min_size=0, max_size=300
)


@hsettings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    docs=st.lists(
        st.tuples(
            st.text(min_size=1, max_size=200).filter(lambda t: t.strip() and "\x00" not in t),
            text_strategy,
            st.sampled_from(["", "😀👨‍👩‍👧‍👦", "e\u0301" * 50, "中文" * 500, '"\\' * 800]),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_search_response_invariants(issued, route, kb, docs):
    Document.objects.all().delete()
    bodies = {}
    for i, (title, text, extra) in enumerate(docs):
        body = f"zebra {text} {extra} zebra"
        upsert_document(kb, f"doc-{i}", title, body)
        bodies[title.replace("\x00", "").strip()] = body
    response = AgentCaller(issued.access_token).post(URL, {"query": "zebra"})
    assert response.status_code == 200
    assert len(response.content) <= 4096
    payload = json.loads(response.content)
    assert len(payload["hints"]) <= 3
    identity = signing.Identity.for_session(issued.session, "orders")
    documents_seen = set()
    for hint in payload["hints"]:
        claims = signing.verify_reference(hint["ref"], identity, run_id=None)
        documents_seen.add(claims.document_id)
        current = Document.objects.get(pk=claims.document_id).body
        assert hint["summary"] in current[claims.hit_start : claims.hit_end]
    assert len(documents_seen) == len(payload["hints"])
