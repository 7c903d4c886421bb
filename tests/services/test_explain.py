"""The search explanation: per-leg ranks, outcomes, and what visibility hid, and why."""

from __future__ import annotations

import pytest
from django.db import connection

from bailing_knowledge import services
from bailing_knowledge.ingestion.documents import upsert_document
from bailing_knowledge.models import Document
from bailing_knowledge.services.explain import explain_search, principal_session
from bailing_knowledge.services.search import search
from tests.hnsw import rebuild_vector_index

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def vector_index_without_earlier_tests_rows():
    """The vector leg's scan must reach this test's rows (`tests.hnsw`)."""
    with connection.cursor() as cursor:
        rebuild_vector_index(cursor)


# In every hidden document: its title, source key and body.
MARKER = "Zebraquartz"

REFUNDS = (
    "# Refund policy\n\nCustomers may return unused items within thirty days for a full refund. "
    "Refunds are paid to the original payment method within five business days."
)
SHIPPING = "# Shipping\n\nOrders ship within two days. A refund of shipping costs is not offered."


def hidden_text(reason: str) -> str:
    return f"# {MARKER} {reason}\n\nThe refund policy for {MARKER} insiders: refunds in one day."


@pytest.fixture
def corpus(kb, route):
    """Visible documents, and one hidden document per reason, all about refunds.

    The first document has many chunks, so chunk ids and document ids differ.
    """
    upsert_document(kb, "returns.md", "Returns", "# Returns\n\n" + "Bring it back. " * 400)
    upsert_document(kb, "refunds.md", "Refund policy", REFUNDS)
    upsert_document(kb, "shipping.md", "Shipping", SHIPPING)
    upsert_document(
        kb,
        f"{MARKER}-partners.md",
        f"{MARKER} partners",
        hidden_text("partners"),
        {"audiences": ["partners"]},
    )
    upsert_document(
        kb,
        f"{MARKER}-finance.md",
        f"{MARKER} finance",
        hidden_text("finance"),
        {"roles": ["finance"]},
    )
    disabled = services.create_knowledge_base("internal", title="Internal", enabled=False)
    upsert_document(
        disabled, f"{MARKER}-internal.md", f"{MARKER} internal", hidden_text("internal")
    )
    other = services.create_knowledge_base("globex", title="Globex", tenant="globex")
    upsert_document(other, f"{MARKER}-globex.md", f"{MARKER} globex", hidden_text("globex"))
    services.bind_knowledge_bases(route, [disabled, other])
    return {doc.source_key: doc.pk for doc in Document.objects.all()}


def route_with_kbs(route):
    return type(route).objects.prefetch_related("knowledge_bases").get(pk=route.pk)


def test_candidates_carry_leg_ranks_and_outcomes(corpus, issued, route):
    route = route_with_kbs(route)
    body = search(issued.session, route, "refund policy")
    explanation = explain_search(issued.session, route, "refund policy", body["hints"])
    assert explanation.status == "ok"
    assert explanation.searched == ["handbook"]
    candidates = explanation.candidates
    assert candidates
    visible = {corpus["refunds.md"], corpus["shipping.md"], corpus["returns.md"]}
    assert {c.document_id for c in candidates} <= visible
    returned = [c for c in candidates if c.outcome == "returned"]
    assert [c.title for c in returned] == [hint["title"] for hint in body["hints"]]
    assert [c.fused_score for c in returned] == [hint["score"] for hint in body["hints"]]
    assert [c.text for c in returned] == [hint["summary"] for hint in body["hints"]]
    top = candidates[0]
    assert top.document_id == corpus["refunds.md"]
    assert top.lexical_rank == 1 and top.lexical_score > 0
    # The vector leg is approximate (HNSW): it finds some of the candidates, not necessarily
    # the lexical top one.
    vector_ranks = sorted(c.vector_rank for c in candidates if c.vector_rank is not None)
    assert vector_ranks and vector_ranks[0] >= 1 and len(set(vector_ranks)) == len(vector_ranks)
    assert all(-1 <= c.vector_similarity <= 1 for c in candidates)
    assert [c.fused_score for c in candidates] == sorted(
        (c.fused_score for c in candidates), reverse=True
    )
    # A second chunk of an answered document, when there is one, is not "over the limit".
    for candidate in candidates:
        if candidate.outcome != "returned":
            assert candidate.outcome in {"same_document", "over_limit", "below_min_score"}


def test_min_score_outcome(corpus, issued, route):
    services.update_route(route, min_score=0.99)
    route = route_with_kbs(route)
    body = search(issued.session, route, "refund policy")
    explanation = explain_search(issued.session, route, "refund policy", body["hints"])
    below = [c for c in explanation.candidates if c.fused_score < 0.99]
    assert below and all(c.outcome == "below_min_score" for c in below)


def test_hidden_documents_are_named_with_their_reason_only(corpus, issued, route):
    route = route_with_kbs(route)
    explanation = explain_search(issued.session, route, "refund policy")
    reasons = {hidden.document_id: hidden.reason for hidden in explanation.hidden}
    assert set(reasons) == {
        corpus[f"{MARKER}-partners.md"],
        corpus[f"{MARKER}-finance.md"],
        corpus[f"{MARKER}-internal.md"],
        corpus[f"{MARKER}-globex.md"],
    }
    assert "partners" in reasons[corpus[f"{MARKER}-partners.md"]]
    assert "'staff'" in reasons[corpus[f"{MARKER}-partners.md"]]
    assert "finance" in reasons[corpus[f"{MARKER}-finance.md"]]
    assert "disabled" in reasons[corpus[f"{MARKER}-internal.md"]]
    assert "tenant" in reasons[corpus[f"{MARKER}-globex.md"]]
    for hidden in explanation.hidden:
        assert hidden.lexical_rank is not None or hidden.vector_rank is not None
    assert MARKER.lower() not in repr(explanation).lower()


def test_a_principal_who_may_see_them_gets_them_as_candidates(corpus, route):
    route = route_with_kbs(route)
    partner = principal_session(tenant="acme", roles=["finance"], audience="partners")
    explanation = explain_search(partner, route, f"{MARKER} refund")
    titles = {c.title for c in explanation.candidates}
    assert {f"{MARKER} partners", f"{MARKER} finance"} <= titles
    hidden = {h.document_id for h in explanation.hidden}
    assert corpus[f"{MARKER}-partners.md"] not in hidden
    assert corpus[f"{MARKER}-internal.md"] in hidden


def test_knowledge_switched_off_hides_every_kb(corpus, issued, route):
    services.update_route(route, knowledge_enabled=False)
    route = route_with_kbs(route)
    explanation = explain_search(issued.session, route, "refund policy")
    assert (explanation.status, explanation.knowledge_available) == ("disabled", False)
    assert explanation.candidates == []
    assert explanation.hidden
    assert all("switched off" in h.reason for h in explanation.hidden)


def test_documents_not_ready_are_listed(corpus, issued, route):
    Document.objects.filter(pk=corpus["shipping.md"]).update(status=Document.Status.FAILED)
    route = route_with_kbs(route)
    explanation = explain_search(issued.session, route, "refund policy")
    assert [(d.document_id, d.status) for d in explanation.not_ready] == [
        (corpus["shipping.md"], "failed")
    ]
    assert corpus["shipping.md"] not in {c.document_id for c in explanation.candidates}
