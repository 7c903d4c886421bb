"""Database constraints and derived model state."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.models import Count
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from bailing_knowledge import locks, services
from bailing_knowledge.ingestion.documents import upsert_document
from bailing_knowledge.models import (
    AgentSession,
    Chunk,
    Document,
    KnowledgeBase,
    Route,
    Run,
    Task,
    content_hash,
)

pytestmark = pytest.mark.django_db


def _violates(callable_):
    with pytest.raises(IntegrityError), transaction.atomic():
        callable_()


def _document(kb, key="a.md", **kwargs):
    return Document.objects.create(
        knowledge_base=kb,
        source_key=key,
        title="A",
        body="Body",
        content_hash=content_hash("A", "Body"),
        **kwargs,
    )


def test_vector_extension_is_installed():
    with connection.cursor() as cursor:
        cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        version = cursor.fetchone()[0]
    assert tuple(int(p) for p in version.split(".")[:2]) >= (0, 7)


def test_slugs_and_keys_are_unique(kb, route, agent_client):
    _violates(lambda: KnowledgeBase.objects.create(slug=kb.slug, title="dup"))
    _violates(lambda: Route.objects.create(route_key=route.route_key))
    _violates(lambda: type(agent_client).objects.create(app_id=agent_client.app_id))


def test_token_hash_is_unique_and_must_be_sha256(issued, agent_client):
    now = timezone.now()
    base = dict(client=agent_client, principal_id="p", expires_at=now + timedelta(hours=1))
    _violates(lambda: AgentSession.objects.create(token_hash=issued.session.token_hash, **base))
    _violates(lambda: AgentSession.objects.create(token_hash="not-a-hash", **base))


def test_session_must_expire_after_creation(agent_client):
    now = timezone.now()
    _violates(
        lambda: AgentSession.objects.create(
            client=agent_client,
            principal_id="p",
            token_hash="0" * 64,
            created_at=now,
            expires_at=now - timedelta(seconds=1),
        )
    )


def test_document_source_key_is_unique_per_kb(kb):
    _document(kb)
    _violates(lambda: _document(kb))
    other = services.create_knowledge_base("other")
    assert _document(other).source_key == "a.md"


@pytest.mark.parametrize(
    ("model", "field"),
    [(Document, "status"), (Task, "state")],
)
def test_state_columns_reject_unknown_values(model, field, kb):
    table = model._meta.db_table
    column = model._meta.get_field(field).column
    row = _document(kb) if model is Document else Task.objects.create(title="t")
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f'UPDATE "{table}" SET "{column}" = %s WHERE id = %s', ["bogus", row.pk])


def test_run_constraints(issued, route, agent_client):
    fields = dict(
        session=issued.session,
        client=agent_client,
        route=route,
        client_conversation_id="c",
        client_turn_id="t",
        user_message_id="m",
        request_hash="0" * 64,
    )
    Run.objects.create(**fields)
    _violates(lambda: Run.objects.create(**fields))
    _violates(lambda: Run.objects.create(**{**fields, "client_turn_id": "t2", "state": "bogus"}))
    _violates(
        lambda: Run.objects.create(**{**fields, "client_turn_id": "t3", "delivery_mode": "x"})
    )


@pytest.mark.parametrize(
    "values",
    [{"top_k": 0}, {"top_k": 51}, {"max_docs": 0}, {"min_score": -0.1}, {"knowledge_mode": "x"}],
)
def test_route_settings_are_range_checked_in_the_database(route, values):
    _violates(lambda: Route.objects.filter(pk=route.pk).update(**values))


def test_chunk_span_and_embedding_dimensions(kb):
    doc = _document(kb)
    base = dict(document=doc, knowledge_base=kb, revision=1, text="B", text_hash="0" * 64)
    _violates(lambda: Chunk.objects.create(ordinal=0, start=3, end=2, **base))
    _violates(lambda: Chunk.objects.create(ordinal=1, start=0, end=1, embedding=[1, 0, 0], **base))
    chunk = Chunk.objects.create(
        ordinal=2, start=0, end=1, embedding=[1, 0, 0], embedding_dimensions=3, **base
    )
    assert list(Chunk.objects.get(pk=chunk.pk).embedding) == [1.0, 0.0, 0.0]
    _violates(lambda: Chunk.objects.create(ordinal=2, start=0, end=1, **base))


def test_the_embedding_index_is_half_precision_and_partial():
    """The shipped HNSW index: halfvec copies of the 384-dimension embeddings (cheaper to
    maintain on insert than full-precision ones), m 8, ef_construction 32."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'bk_chunk_embedding_hnsw_384'"
        )
        (definition,) = cursor.fetchone()
    assert "USING hnsw (((embedding)::halfvec(384)) halfvec_cosine_ops)" in definition
    assert "WITH (m='8', ef_construction='32')" in definition
    assert definition.endswith("WHERE (embedding_dimensions = 384)")


def test_content_hash_is_length_prefixed():
    assert content_hash("ab", "c") != content_hash("a", "bc")
    assert content_hash("a", "b") == content_hash("a", "b")


def test_scope_revision_tracks_configuration_not_documents(route, kb):
    first = route.knowledge_scope_revision
    assert first == Route.objects.get(pk=route.pk).knowledge_scope_revision
    _document(kb)
    assert Route.objects.get(pk=route.pk).knowledge_scope_revision == first

    services.set_knowledge_base_enabled(kb, False)
    disabled = Route.objects.get(pk=route.pk).knowledge_scope_revision
    assert disabled != first
    services.set_knowledge_base_enabled(kb, True)
    assert Route.objects.get(pk=route.pk).knowledge_scope_revision == first

    services.update_route(route, top_k=7)
    assert Route.objects.get(pk=route.pk).knowledge_scope_revision != first
    services.update_route(route, top_k=5)
    assert Route.objects.get(pk=route.pk).knowledge_scope_revision == first

    extra = services.create_knowledge_base("extra")
    services.bind_knowledge_bases(route, [extra])
    assert Route.objects.get(pk=route.pk).knowledge_scope_revision != first
    services.unbind_knowledge_bases(route, [extra])
    assert Route.objects.get(pk=route.pk).knowledge_scope_revision == first


def test_str_of_every_model(issued, kb, route, agent_client):
    doc = _document(kb)
    assert str(kb) == "handbook"
    assert str(route) == "orders"
    assert str(agent_client) == "acme-agent"
    assert issued.session.session_id in str(issued.session)
    assert "a.md" in str(doc)
    assert "t" in str(Task.objects.create(title="t"))


def test_session_status_is_one_rule_for_rows_and_queries(agent_client, route):
    """`AgentSession.objects.active()/expired()/revoked()` select exactly the rows whose
    `status_at` says so, at any instant: before, at and after a session's expiry."""
    issue = services.issue_session
    live = issue(agent_client, principal_id="a", routes=[route], lifetime=3600).session
    short = issue(agent_client, principal_id="b", routes=[route], lifetime=60).session
    revoked = services.revoke_session(issue(agent_client, principal_id="c", routes=[route]).session)
    sessions = AgentSession.objects.all()
    for now in (timezone.now(), short.expires_at, short.expires_at + timedelta(seconds=1)):
        by_status = {
            "active": set(sessions.active(now)),
            "expired": set(sessions.expired(now)),
            "revoked": set(sessions.revoked()),
        }
        for session in (live, short, revoked):
            session.refresh_from_db()
            holding = {status for status, rows in by_status.items() if session in rows}
            assert holding == {session.status_at(now)}
            assert (session in set(sessions.inactive(now))) is not session.is_active(now)
    assert short.status_at(short.expires_at) == "expired"
    assert (live.status, revoked.status) == ("active", "revoked")


def test_deletes_share_the_write_lock_once_per_knowledge_base(kb):
    """Every way of deleting documents or knowledge bases takes the write lock of `locks`
    first, once per knowledge base (not once per document), and never loads bodies."""
    for number in range(3):
        upsert_document(kb, f"d{number}.md", "Doc", "Some text. " * 10)
    with CaptureQueriesContext(connection) as queries:
        Document.objects.filter(source_key__in=["d0.md", "d1.md"]).delete()
    locks = [q["sql"] for q in queries.captured_queries if "pg_advisory_xact_lock" in q["sql"]]
    assert len(locks) == 1
    with CaptureQueriesContext(connection) as queries:
        Document.objects.get(source_key="d2.md").delete()
    assert any("pg_advisory_xact_lock" in q["sql"] for q in queries.captured_queries)
    upsert_document(kb, "d3.md", "Doc", "Some text. " * 10)
    with CaptureQueriesContext(connection) as queries:
        KnowledgeBase.objects.filter(pk=kb.pk).delete()
    sql = [q["sql"] for q in queries.captured_queries]
    assert any("FOR UPDATE" in s and "knowledgebase" in s for s in sql)
    assert sum("pg_advisory_xact_lock" in s for s in sql) == 1
    assert not any('"body"' in s for s in sql)  # the cascade reads keys, not bodies
    assert not Document.objects.exists()


def test_querysets_that_django_deletes_still_delete(kb):
    """The locks taken first do not narrow what a queryset may be: distinct, annotated."""
    upsert_document(kb, "a.md", "Doc", "Some text. " * 10)
    Document.objects.filter(knowledge_base=kb).distinct().delete()
    other = services.create_knowledge_base("other")
    KnowledgeBase.objects.filter(pk__in=[kb.pk, other.pk]).annotate(
        document_count=Count("documents")
    ).distinct().delete()
    assert not KnowledgeBase.objects.exists()


def test_managers_offer_no_delete_of_everything():
    """`delete` is overridden on the querysets; the managers must still not offer it."""
    assert not hasattr(Document.objects, "delete")
    assert not hasattr(KnowledgeBase.objects, "delete")


def test_the_lock_module_names_the_knowledge_base_table():
    assert KnowledgeBase._meta.db_table == locks.KNOWLEDGE_BASE_TABLE
