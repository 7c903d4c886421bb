"""The signals a host connects to: sent once, after the commit, with what changed."""

from __future__ import annotations

import contextlib
from contextlib import contextmanager

import pytest
from django.db import transaction

from bailing_knowledge import services, signals
from bailing_knowledge.ingestion.documents import delete_document, upsert_document
from bailing_knowledge.models import AgentSession, Document, KnowledgeBase

pytestmark = pytest.mark.django_db


@contextmanager
def received(signal):
    calls: list[dict] = []

    def receiver(sender, **kwargs):
        kwargs.pop("signal")
        calls.append({"sender": sender, **kwargs})

    signal.connect(receiver, weak=False)
    try:
        yield calls
    finally:
        signal.disconnect(receiver)


def test_sessions_issued_and_revoked(agent_client, route, django_capture_on_commit_callbacks):
    with received(signals.session_issued) as issued, received(signals.session_revoked) as revoked:
        with django_capture_on_commit_callbacks(execute=True):
            session = services.issue_session(agent_client, principal_id="u", routes=[route])
        with django_capture_on_commit_callbacks(execute=True):
            services.revoke_session(session.session_id)
            services.revoke_session(session.session_id)  # already revoked: no second signal
    assert issued == [{"sender": AgentSession, "session": session.session}]
    assert [call["session"].pk for call in revoked] == [session.session.pk]
    assert revoked[0]["session"].revoked_at is not None


def test_documents_indexed_and_deleted(kb, django_capture_on_commit_callbacks):
    with (
        received(signals.document_indexed) as indexed,
        received(signals.document_deleted) as deleted,
    ):
        with django_capture_on_commit_callbacks(execute=True):
            upsert_document(kb, "a.md", "A", "# A\n\nFirst text.")
            upsert_document(kb, "a.md", "A", "# A\n\nFirst text.")  # unchanged: no signal
            upsert_document(kb, "a.md", "A", "# A\n\nSecond text.")
        with django_capture_on_commit_callbacks(execute=True):
            assert delete_document(kb, "a.md")
            assert not delete_document(kb, "a.md")
    assert [(c["sender"], c["outcome"], c["document"].revision) for c in indexed] == [
        (Document, "created", 1),
        (Document, "updated", 2),
    ]
    assert all(c["chunks"] >= 1 for c in indexed)
    assert deleted == [{"sender": Document, "knowledge_base": kb, "source_key": "a.md"}]


def test_knowledge_base_changes(django_capture_on_commit_callbacks):
    with (
        received(signals.knowledge_base_changed) as changed,
        django_capture_on_commit_callbacks(execute=True),
    ):
        kb = services.create_knowledge_base("faq")
        services.set_knowledge_base_enabled(kb, False)
        services.set_knowledge_base_enabled(kb, False)  # no change, no signal
        services.set_knowledge_base_enabled(kb, True)
        services.set_knowledge_base_language(kb, "german")
    assert [(c["sender"], c["knowledge_base"].slug, c["change"]) for c in changed] == [
        (KnowledgeBase, "faq", "created"),
        (KnowledgeBase, "faq", "disabled"),
        (KnowledgeBase, "faq", "enabled"),
        (KnowledgeBase, "faq", "language"),
    ]


def test_nothing_is_sent_for_a_change_rolled_back(kb, django_capture_on_commit_callbacks):
    with (
        received(signals.document_indexed) as indexed,
        django_capture_on_commit_callbacks(execute=True),
        contextlib.suppress(RuntimeError),
        transaction.atomic(),
    ):
        upsert_document(kb, "b.md", "B", "# B\n\nText.")
        raise RuntimeError("the host's own step failed")
    assert indexed == []
    assert not Document.objects.filter(source_key="b.md").exists()
