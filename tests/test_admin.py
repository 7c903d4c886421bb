"""The Django admin: changelists, change pages, actions and the session "issue" form."""

from __future__ import annotations

import hashlib
import re

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from bailing_knowledge import services
from bailing_knowledge.models import (
    AgentSession,
    Chunk,
    Client,
    Document,
    KnowledgeBase,
    Route,
    Run,
    Task,
    content_hash,
    hash_token,
)

pytestmark = pytest.mark.django_db

TOKEN_RE = re.compile(r"bka_[A-Za-z0-9_-]{20,}")
EMBEDDING = [0.123456, 0.654321, 0.314159]


# --------------------------------------------------------------------------- builders


def admin_url(model, view="changelist", *args):
    return reverse(f"admin:bailing_knowledge_{model._meta.model_name}_{view}", args=args)


def make_document(kb, source_key, *, title="Refunds", body="Refunds take five days.", **kwargs):
    return Document.objects.create(
        knowledge_base=kb,
        source_key=source_key,
        title=title,
        body=body,
        content_hash=content_hash(title, body),
        **kwargs,
    )


def make_chunk(document, ordinal=0):
    text = document.body[:16]
    return Chunk.objects.create(
        document=document,
        knowledge_base=document.knowledge_base,
        revision=document.revision,
        ordinal=ordinal,
        start=0,
        end=len(text),
        text=text,
        text_hash=hashlib.sha256(text.encode()).hexdigest(),
        embedding=EMBEDDING,
        embedding_dimensions=len(EMBEDDING),
    )


def make_task(title, members=(), **kwargs):
    task = Task.objects.create(title=title, **kwargs)
    task.members.set(members)
    return task


def make_run(session, route, *, task=None, conversation="conv-1", turn="turn-1", **kwargs):
    return Run.objects.create(
        session=session,
        client=session.client,
        route=route,
        task=task,
        client_conversation_id=conversation,
        client_turn_id=turn,
        user_message_id=f"msg-{turn}",
        request_hash="0" * 64,
        state=Run.State.CONTEXT_READY,
        context={"knowledge": {"results": 1}},
        **kwargs,
    )


def knowledge_base_form(kb, **changes):
    """The knowledge base's change form as the page posts it, with `changes`."""
    data = {
        "slug": kb.slug,
        "title": kb.title,
        "description": kb.description,
        "enabled": "on",
        "embedder": kb.embedder,
        "language": kb.language,
        "tenant": kb.tenant,
    }
    return {**data, **changes}


def issue_form_data(agent_client, route, **overrides):
    data = {
        "client": agent_client.pk,
        "principal_id": "user-42",
        "tenant": "acme",
        "roles": "support, billing",
        "audience": "staff",
        "on_behalf_of": "manager-7",
        "routes": [route.pk],
        "lifetime": "3600",
        "device_label": "Support laptop",
    }
    data.update(overrides)
    return data


def message_texts(response):
    return [str(m) for m in get_messages(response.wsgi_request)]


def post_action(admin_client, model, action, objects):
    return admin_client.post(
        admin_url(model),
        {"action": action, "_selected_action": [obj.pk for obj in objects]},
        follow=True,
    )


def database_cells_containing(needle):
    """Every (table, column) of the current schema whose text form contains `needle`."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT c.table_name, c.column_name
            FROM information_schema.columns c
            JOIN information_schema.tables t
              ON t.table_schema = c.table_schema AND t.table_name = c.table_name
            WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'
            ORDER BY c.table_name, c.column_name
            """
        )
        columns = cursor.fetchall()
        assert any(table.startswith("bailing_knowledge_") for table, _ in columns)
        hits = []
        quote = connection.ops.quote_name
        for table, column in columns:
            cursor.execute(
                f"SELECT count(*) FROM {quote(table)} "  # names come from the catalog
                f"WHERE strpos(CAST({quote(column)} AS text), %s) > 0",
                [needle],
            )
            if cursor.fetchone()[0]:
                hits.append((table, column))
    return hits


# --------------------------------------------------------------------------- fixtures


class Rows(dict):
    """One row per model; the chunk is only written when a test asks for it.

    Chunk rows are kept few on purpose: every rolled-back insert leaves a dead tuple, and
    enough of them make autovacuum visit the chunk table (see `populate`).
    """

    def __missing__(self, model):
        if model is not Chunk:
            raise KeyError(model)
        self[Chunk] = make_chunk(self[Document])
        return self[Chunk]


@pytest.fixture
def rows(kb, route, agent_client, issued):
    """One row of every model, the catalogue rows built through the services."""
    document = make_document(kb, "policies/refunds.md", status=Document.Status.READY)
    task = make_task("Refund backlog", [issued.session])
    run = make_run(issued.session, route, task=task)
    return Rows(
        {
            KnowledgeBase: kb,
            Route: route,
            Client: agent_client,
            AgentSession: issued.session,
            Document: document,
            Task: task,
            Run: run,
        }
    )


@pytest.fixture
def populate(db):
    """Build `count` rows of every model (chunks only when asked), numbered from `start`.

    Chunks are opt-in to keep the suite's dead chunk tuples under the autovacuum threshold:
    with some builds of the embedded server, vacuuming the chunk table's HNSW index crashes
    the whole server.
    """

    def build(count, start=0, *, chunks=False):
        for i in range(start, start + count):
            kb = services.create_knowledge_base(f"kb-{i}", tenant="acme" if i % 2 else "")
            route = services.create_route(f"route-{i}", knowledge_bases=[kb], audiences=["staff"])
            client = services.create_client(f"app-{i}", routes=[route])
            session = services.issue_session(
                client, principal_id=f"user-{i}", routes=[route], roles=["support"]
            ).session
            document = make_document(kb, f"doc-{i}.md")
            if chunks:
                make_chunk(document)
            task = make_task(f"Task {i}", [session])
            make_run(session, route, task=task)

    return build


ALL_MODELS = [KnowledgeBase, Route, Client, AgentSession, Document, Chunk, Task, Run]

# model -> (a search term that matches the fixture row, a filter that keeps it)
SEARCH_AND_FILTER = {
    KnowledgeBase: ("handbook", {"enabled__exact": "1"}),
    Route: ("orders", {"agent_client_enabled__exact": "1", "knowledge_mode__exact": "chunk"}),
    Client: ("acme", {"enabled__exact": "1"}),
    AgentSession: ("user-1", {"status": "active", "principal_audience": "staff"}),
    Document: ("refunds", {"status__exact": "ready"}),
    Chunk: ("refunds", {"embedding_dimensions__exact": "3"}),
    Task: ("backlog", {"state__exact": "active"}),
    Run: ("conv-1", {"state__exact": "context_ready"}),
}


# --------------------------------------------------------------------------- changelists


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.__name__)
def test_changelist_lists_searches_and_filters(admin_client, rows, model):
    obj = rows[model]
    query, filters = SEARCH_AND_FILTER[model]
    for params in ({}, {"q": query}, filters, {"q": query, **filters}):
        response = admin_client.get(admin_url(model), params)
        assert response.status_code == 200, params
        assert obj in response.context["cl"].result_list, params

    response = admin_client.get(admin_url(model), {"q": "no-such-thing-anywhere"})
    assert response.status_code == 200
    assert list(response.context["cl"].result_list) == []


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.__name__)
def test_change_page_loads(admin_client, rows, model):
    response = admin_client.get(admin_url(model, "change", rows[model].pk))
    assert response.status_code == 200
    assert response.context["original"] == rows[model]


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.__name__)
def test_changelist_queries_do_not_grow_with_rows(
    admin_client, populate, django_assert_max_num_queries, model
):
    populate(1, chunks=model is Chunk)
    admin_client.get(admin_url(model))  # warm up per-process caches
    with CaptureQueriesContext(connection) as one_row:
        response = admin_client.get(admin_url(model))
    assert len(response.context["cl"].result_list) == 1
    assert len(one_row) <= 12

    populate(19, start=1, chunks=model is Chunk)
    with django_assert_max_num_queries(len(one_row)):
        response = admin_client.get(admin_url(model))
    assert len(response.context["cl"].result_list) == 20


def test_counts_are_annotated(admin_client, rows, kb, route, agent_client):
    make_document(kb, "second.md")
    response = admin_client.get(admin_url(KnowledgeBase))
    (listed,) = response.context["cl"].result_list
    assert (listed.document_count, listed.route_count) == (2, 1)

    response = admin_client.get(admin_url(Route))
    (listed,) = response.context["cl"].result_list
    assert (listed.knowledge_base_count, listed.client_count) == (1, 1)

    services.issue_session(agent_client, principal_id="user-2", routes=[route])
    services.revoke_session(rows[AgentSession])
    response = admin_client.get(admin_url(Client))
    (listed,) = response.context["cl"].result_list
    assert (listed.route_count, listed.active_session_count) == (1, 1)

    response = admin_client.get(admin_url(Task))
    (listed,) = response.context["cl"].result_list
    assert (listed.member_count, listed.run_count) == (1, 1)


def test_session_status_filter(admin_client, agent_client, route, issued):
    other = services.issue_session(agent_client, principal_id="user-2", routes=[route]).session
    services.revoke_session(other)
    expired = services.issue_session(agent_client, principal_id="user-3", routes=[route]).session
    AgentSession.objects.filter(pk=expired.pk).update(
        created_at=expired.created_at.replace(year=2000),
        expires_at=expired.expires_at.replace(year=2000),
    )
    expected = {"active": issued.session, "revoked": other, "expired": expired}
    for status, session in expected.items():
        response = admin_client.get(admin_url(AgentSession), {"status": status})
        assert list(response.context["cl"].result_list) == [session], status
        assert f">{status}<" in response.content.decode()


# --------------------------------------------------------------------------- actions


def test_knowledge_base_actions(admin_client, kb):
    other = services.create_knowledge_base("archive", enabled=False)

    response = post_action(admin_client, KnowledgeBase, "disable_knowledge_bases", [kb, other])
    assert response.status_code == 200
    kb.refresh_from_db()
    assert kb.enabled is False
    assert "1 knowledge base disabled; 1 already disabled." in message_texts(response)

    response = post_action(admin_client, KnowledgeBase, "enable_knowledge_bases", [kb, other])
    kb.refresh_from_db()
    other.refresh_from_db()
    assert kb.enabled is True and other.enabled is True
    assert "2 knowledge bases enabled." in message_texts(response)
    assert LogEntry.objects.filter(object_id=str(kb.pk)).count() == 2


def test_route_actions(admin_client, route):
    response = post_action(admin_client, Route, "disable_routes", [route])
    route.refresh_from_db()
    assert route.enabled is False
    assert "1 route disabled." in message_texts(response)

    response = post_action(admin_client, Route, "enable_routes", [route])
    route.refresh_from_db()
    assert route.enabled is True
    assert "1 route enabled." in message_texts(response)

    response = post_action(admin_client, Route, "disable_agent_client", [route])
    route.refresh_from_db()
    assert route.agent_client_enabled is False
    assert route.enabled is True
    assert "1 route with the agent client runtime disabled." in message_texts(response)

    response = post_action(admin_client, Route, "enable_agent_client", [route])
    route.refresh_from_db()
    assert route.agent_client_enabled is True
    assert "1 route with the agent client runtime enabled." in message_texts(response)


def test_client_actions(admin_client, agent_client):
    response = post_action(admin_client, Client, "disable_clients", [agent_client])
    agent_client.refresh_from_db()
    assert agent_client.enabled is False
    assert "1 agent client disabled." in message_texts(response)

    response = post_action(admin_client, Client, "enable_clients", [agent_client])
    agent_client.refresh_from_db()
    assert agent_client.enabled is True
    assert "1 agent client enabled." in message_texts(response)


def test_revoke_sessions_action(admin_client, issued, agent_client, route):
    other = services.issue_session(agent_client, principal_id="user-2", routes=[route]).session
    services.revoke_session(other)
    revoked_at = AgentSession.objects.get(pk=other.pk).revoked_at

    response = post_action(admin_client, AgentSession, "revoke_sessions", [issued.session, other])
    assert response.status_code == 200
    session = AgentSession.objects.get(pk=issued.session.pk)
    assert session.revoked_at is not None
    assert not session.is_active()
    assert AgentSession.objects.get(pk=other.pk).revoked_at == revoked_at
    assert "1 agent session revoked; 1 already revoked." in message_texts(response)


def test_action_reports_service_errors(admin_client, route):
    # A row made invalid behind the admin's back: the service's validation refuses to save it.
    Route.objects.filter(pk=route.pk).update(allowed_audiences=[""])
    response = post_action(admin_client, Route, "disable_routes", [route])
    route.refresh_from_db()
    assert route.enabled is True
    texts = message_texts(response)
    assert "0 routes disabled." in texts
    assert any(text.startswith("1 could not be disabled: orders:") for text in texts)


# --------------------------------------------------------------------------- issuing sessions


def test_add_session_page_offers_the_issue_form(admin_client, agent_client):
    response = admin_client.get(admin_url(AgentSession, "add"), {"client": agent_client.pk})
    assert response.status_code == 200
    form = response.context["adminform"].form
    assert set(form.fields) == {
        "client",
        "principal_id",
        "tenant",
        "roles",
        "audience",
        "on_behalf_of",
        "routes",
        "lifetime",
        "device_label",
    }
    assert form.initial["client"] == str(agent_client.pk)
    content = response.content.decode()
    assert "token_hash" not in content
    assert "Issue agent session" in content


def test_issuing_a_session_shows_the_token_once_and_stores_only_its_hash(
    admin_client, agent_client, route
):
    response = admin_client.post(
        admin_url(AgentSession, "add"), issue_form_data(agent_client, route)
    )
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]

    session = AgentSession.objects.get()
    assert session.client == agent_client
    assert session.principal == {
        "id": "user-42",
        "tenant": "acme",
        "roles": ["support", "billing"],
        "audience": "staff",
    }
    assert session.on_behalf_of == "manager-7"
    assert session.device_label == "Support laptop"
    assert list(session.allowed_routes.all()) == [route]
    assert 3590 <= (session.expires_at - session.created_at).total_seconds() <= 3600

    texts = message_texts(response)
    assert any("will not be shown again" in text for text in texts)
    assert not any(TOKEN_RE.search(text) for text in texts)
    # The token is in one read-only field, with a button that copies it.
    page = response.content.decode()
    field = re.search(r'<input id="bk-access-token"[^>]*value="([^"]+)"', page)
    assert field is not None
    token = field.group(1)
    assert TOKEN_RE.fullmatch(token)
    assert 'data-copy-target="bk-access-token"' in page
    assert "bailing_knowledge/copy.js" in page
    assert hash_token(token) == session.token_hash
    assert hashlib.sha256(token.encode()).hexdigest() == session.token_hash
    assert token.startswith(session.token_hint)
    assert response.content.decode().count(token) == 1

    # The message was consumed by this response: no cookie or session carries it onward.
    assert not response.cookies.get("messages") or not response.cookies["messages"].value
    later = admin_client.get(admin_url(AgentSession, "change", session.pk))
    assert token not in later.content.decode()
    assert not message_texts(later)

    assert database_cells_containing(token) == []
    assert database_cells_containing(token[len(session.token_hint) :]) == []
    assert LogEntry.objects.filter(object_id=str(session.pk)).exists()


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"routes": []}, "routes"),
        ({"principal_id": "   "}, "principal_id"),
        ({"lifetime": str(365 * 24 * 3600)}, "lifetime"),
        ({"lifetime": "0"}, "lifetime"),
        ({"lifetime": str(10**18)}, "lifetime"),
        ({"roles": "support,,billing"}, "roles"),
        ({"audience": "x" * 65}, "audience"),
    ],
)
def test_issue_form_reports_errors_on_fields(admin_client, agent_client, route, overrides, field):
    response = admin_client.post(
        admin_url(AgentSession, "add"), issue_form_data(agent_client, route, **overrides)
    )
    assert response.status_code == 200
    assert field in response.context["adminform"].form.errors
    assert not AgentSession.objects.exists()
    assert not TOKEN_RE.search(response.content.decode())


def test_issuing_a_session_a_route_refuses_warns_on_the_token_page(
    admin_client, agent_client, route
):
    services.update_route(route, audiences=["partners"])
    response = admin_client.post(
        admin_url(AgentSession, "add"), issue_form_data(agent_client, route)
    )
    assert response.status_code == 200
    assert AgentSession.objects.count() == 1
    assert (
        "The session has audience 'staff', which route(s) 'orders' do not admit: its calls "
        "there will answer 403 route_not_allowed until those routes admit it."
    ) in message_texts(response)


def test_issue_form_refuses_routes_outside_the_client(admin_client, agent_client):
    outside = services.create_route("billing")
    response = admin_client.post(
        admin_url(AgentSession, "add"), issue_form_data(agent_client, outside)
    )
    errors = response.context["adminform"].form.errors
    assert "billing" in errors["routes"][0]
    assert not AgentSession.objects.exists()


def test_issue_form_refuses_a_disabled_client(admin_client, agent_client, route):
    services.set_client_enabled(agent_client, False)
    response = admin_client.post(
        admin_url(AgentSession, "add"), issue_form_data(agent_client, route)
    )
    assert "disabled" in response.context["adminform"].form.errors["client"][0]
    assert not AgentSession.objects.exists()


def test_session_change_page_cannot_touch_the_token_or_principal(admin_client, issued):
    session = issued.session
    url = admin_url(AgentSession, "change", session.pk)
    response = admin_client.get(url)
    content = response.content.decode()
    assert issued.access_token not in content
    assert session.token_hint in content
    assert set(response.context["adminform"].form.fields) == {"device_label"}

    response = admin_client.post(
        url,
        {
            "device_label": "Renamed",
            "token_hash": "0" * 64,
            "principal_id": "someone-else",
            "revoked_at": "",
            "expires_at": "2999-01-01 00:00:00",
        },
    )
    assert response.status_code == 302
    fresh = AgentSession.objects.get(pk=session.pk)
    assert fresh.device_label == "Renamed"
    assert fresh.token_hash == hash_token(issued.access_token)
    assert fresh.principal_id == "user-1"
    assert fresh.expires_at == session.expires_at


# --------------------------------------------------------------------------- change pages


def test_route_change_page_shows_scope_revision_but_changelist_does_not(admin_client, route):
    response = admin_client.get(admin_url(Route, "change", route.pk))
    assert route.knowledge_scope_revision in response.content.decode()
    assert "knowledge_bases" in response.context["adminform"].form.fields
    response = admin_client.get(admin_url(Route))
    assert "ksr_" not in response.content.decode()


def test_route_form_saves_through_model_validation(admin_client, route, kb):
    other = services.create_knowledge_base("faq")
    data = {
        "route_key": "orders",
        "name": "Orders",
        "enabled": "on",
        "allowed_audiences": "staff,partners",
        "agent_client_enabled": "on",
        "knowledge_enabled": "on",
        "knowledge_bases": [kb.pk, other.pk],
        "knowledge_mode": "document",
        "top_k": "7",
        "min_score": "0.25",
        "max_docs": "2",
    }
    url = admin_url(Route, "change", route.pk)
    before = route.knowledge_scope_revision
    assert admin_client.post(url, data).status_code == 302
    route.refresh_from_db()
    assert route.allowed_audiences == ["staff", "partners"]
    assert route.top_k == 7 and route.knowledge_mode == "document"
    assert set(route.knowledge_bases.all()) == {kb, other}
    assert route.knowledge_scope_revision != before

    response = admin_client.post(url, {**data, "top_k": "0", "min_score": "1.5"})
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "top_k" in errors and "min_score" in errors
    route.refresh_from_db()
    assert route.top_k == 7


def test_client_form_edits_allowed_routes(admin_client, agent_client, route):
    other = services.create_route("billing")
    data = {"app_id": "acme-agent", "name": "Acme", "enabled": "on", "allowed_routes": [other.pk]}
    response = admin_client.post(admin_url(Client, "change", agent_client.pk), data)
    assert response.status_code == 302
    assert list(agent_client.allowed_routes.all()) == [other]
    response = admin_client.get(admin_url(Client, "change", agent_client.pk))
    assert f"?client={agent_client.pk}" in response.content.decode()


def test_knowledge_base_form_offers_configured_embedders(admin_client):
    data = {"slug": "faq", "title": "FAQ", "description": "", "enabled": "on", "tenant": ""}
    data["language"] = "english"
    response = admin_client.post(admin_url(KnowledgeBase, "add"), {**data, "embedder": "nope"})
    assert response.status_code == 200
    assert "embedder" in response.context["adminform"].form.errors
    response = admin_client.post(admin_url(KnowledgeBase, "add"), {**data, "embedder": "default"})
    assert response.status_code == 302
    assert KnowledgeBase.objects.get(slug="faq").embedder == "default"


def test_knowledge_base_form_offers_the_languages(admin_client):
    data = {"slug": "faq", "title": "FAQ", "description": "", "enabled": "on", "tenant": ""}
    data["embedder"] = "default"
    page = admin_client.get(admin_url(KnowledgeBase, "add"))
    field = page.context["adminform"].form.fields["language"]
    assert ("german", "German") in field.choices
    assert page.context["adminform"].form["language"].value() == "english"
    response = admin_client.post(admin_url(KnowledgeBase, "add"), {**data, "language": "klingon"})
    assert response.status_code == 200
    assert "language" in response.context["adminform"].form.errors
    response = admin_client.post(admin_url(KnowledgeBase, "add"), {**data, "language": "german"})
    assert response.status_code == 302
    assert KnowledgeBase.objects.get(slug="faq").language == "german"


def test_knowledge_base_changelist_shows_and_filters_the_language(admin_client, kb):
    german = services.create_knowledge_base("wiki", language="german")
    response = admin_client.get(admin_url(KnowledgeBase), {"language": "german"})
    assert list(response.context["cl"].result_list) == [german]
    assert "language" in response.context["cl"].list_display
    assert '<td class="field-language">german</td>' in response.content.decode()


def indexed_terms(kb):
    """The terms of the KB's lexical index (each lexeme is "<term>" or "<term>|<suffix>")."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT v.lexeme FROM bailing_knowledge_chunk c, unnest(c.search_vector) v"
            " WHERE c.knowledge_base_id = %s",
            [kb.pk],
        )
        return {lexeme.split("|")[0] for (lexeme,) in cursor.fetchall()}


def test_changing_a_kbs_language_in_the_admin_re_indexes(admin_client, kb):
    from bailing_knowledge.ingestion.documents import upsert_document

    upsert_document(kb, "a.md", "Notes", "Die Häuser stehen am Wasser.")
    assert "häuser" in indexed_terms(kb)
    data = knowledge_base_form(kb, title="Renamed", language="german")
    response = admin_client.post(admin_url(KnowledgeBase, "change", kb.pk), data, follow=True)
    assert response.status_code == 200
    text = " ".join(str(m) for m in response.context["messages"])
    assert "re-indexed for the language 'german'" in text
    kb.refresh_from_db()
    assert (kb.title, kb.language) == ("Renamed", "german")
    terms = indexed_terms(kb)
    assert "haus" in terms
    assert "häuser" not in terms


def test_document_page_is_read_only_and_shows_indexing_state(admin_client, kb):
    document = make_document(
        kb, "broken.md", status=Document.Status.FAILED, last_error="Embedder timed out"
    )
    url = admin_url(Document, "change", document.pk)
    response = admin_client.get(url)
    content = response.content.decode()
    assert response.status_code == 200
    for text in ("Failed", "Embedder timed out", document.content_hash, "Revision"):
        assert text in content
    assert not response.context["has_change_permission"]
    assert admin_client.post(url, {"title": "Changed"}).status_code == 403
    assert admin_client.get(admin_url(Document, "add")).status_code == 403
    document.refresh_from_db()
    assert document.title == "Refunds"


def test_chunk_page_is_read_only_and_hides_the_embedding(admin_client, rows):
    chunk = rows[Chunk]
    url = admin_url(Chunk, "change", chunk.pk)
    response = admin_client.get(url)
    content = response.content.decode()
    assert "Embedding dimensions" in content
    assert "0.123" not in content and "0.654" not in content
    assert admin_client.post(url, {"text": "x"}).status_code == 403
    assert admin_client.get(admin_url(Chunk, "add")).status_code == 403
    assert admin_client.get(admin_url(Chunk, "delete", chunk.pk)).status_code == 403


def test_run_page_is_read_only(admin_client, rows):
    run = rows[Run]
    url = admin_url(Run, "change", run.pk)
    response = admin_client.get(url)
    assert run.run_id in response.content.decode()
    assert admin_client.post(url, {"state": "failed"}).status_code == 403
    assert admin_client.get(admin_url(Run, "add")).status_code == 403
    run.refresh_from_db()
    assert run.state == Run.State.CONTEXT_READY


def test_task_form_edits_title_and_members_but_not_state(admin_client, rows, agent_client, route):
    task = rows[Task]
    other = services.issue_session(agent_client, principal_id="user-2", routes=[route]).session
    response = admin_client.get(admin_url(Task, "change", task.pk))
    assert "members" in response.context["adminform"].form.fields
    assert "state" not in response.context["adminform"].form.fields
    assert not response.context["adminform"].form.fields["members"].widget.can_add_related

    data = {"title": "Backlog", "state": "cancelled", "members": [other.pk]}
    assert admin_client.post(admin_url(Task, "change", task.pk), data).status_code == 302
    task.refresh_from_db()
    # State changes go through the actions only.
    assert (task.title, task.state) == ("Backlog", "active")
    assert list(task.members.all()) == [other]

    response = admin_client.post(admin_url(Task, "add"), {"title": "New", "state": "active"})
    assert response.status_code == 302
    assert Task.objects.get(title="New").task_id.startswith("task_")


# ----------------------------------------------------------------- uploads and reindexing


def test_upload_documents_through_the_admin(admin_client, kb):
    from django.core.files.uploadedfile import SimpleUploadedFile

    changelist = admin_client.get(reverse("admin:bailing_knowledge_document_changelist"))
    assert b"Upload documents" in changelist.content
    url = reverse("admin:bailing_knowledge_document_upload")
    assert admin_client.get(url).status_code == 200
    files = [
        SimpleUploadedFile("faq.md", b"# FAQ\n\nAnswers to questions.\n"),
        SimpleUploadedFile("bad.txt", b"\xff\xfe\xfa not utf-8 \xff"),
        SimpleUploadedFile("notes.docx", b"binary"),
    ]
    response = admin_client.post(url, {"knowledge_base": kb.pk, "files": files}, follow=True)
    assert response.status_code == 200
    text = " ".join(str(m) for m in response.context["messages"])
    assert "1 created" in text and "2 failed" in text
    # File names keep their case on the page (the admin capitalises a message's first letter).
    assert "Not loaded: bad.txt: " in response.content.decode()
    document = Document.objects.get(source_key="faq.md")
    assert (document.title, document.status) == ("FAQ", "ready")


def test_uploads_are_ingested_together_and_same_names_in_turn(admin_client, kb):
    """Both files named a.md are kept (the second updates the first), and many files are
    upserted in batches, not one statement round per file."""
    from django.core.files.uploadedfile import SimpleUploadedFile
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    url = reverse("admin:bailing_knowledge_document_upload")
    files = [
        SimpleUploadedFile("a.md", b"# A\n\nFirst version.\n"),
        SimpleUploadedFile("a.md", b"# A\n\nSecond version.\n"),
    ]
    response = admin_client.post(url, {"knowledge_base": kb.pk, "files": files}, follow=True)
    text = " ".join(str(m) for m in response.context["messages"])
    assert "1 created, 1 updated" in text
    assert Document.objects.get(source_key="a.md").body == "# A\n\nSecond version.\n"

    def upload(names):
        files = [SimpleUploadedFile(n, f"# {n}\n\nAbout {n}.\n".encode()) for n in names]
        with CaptureQueriesContext(connection) as queries:
            admin_client.post(url, {"knowledge_base": kb.pk, "files": files})
        return len(queries.captured_queries)

    one = upload(["one.md"])
    many = upload([f"doc{n}.md" for n in range(30)])
    assert Document.objects.filter(source_key__startswith="doc").count() == 30
    assert many < 10 * one


def test_reindex_action(admin_client, kb):
    from bailing_knowledge.ingestion.documents import upsert_document

    document = upsert_document(kb, "a.md", "A", "Some text to index.").document
    old = set(document.chunks.values_list("pk", flat=True))
    response = admin_client.post(
        reverse("admin:bailing_knowledge_document_changelist"),
        {"action": "reindex_documents", "_selected_action": [document.pk]},
        follow=True,
    )
    assert response.status_code == 200
    assert message_texts(response) == ["Reindex: 1 document re-indexed."]
    assert not old & set(document.chunks.values_list("pk", flat=True))


def test_task_state_actions(admin_client, issued):
    from bailing_knowledge.services.tasks import create_task

    task = create_task("Close", members=[issued.session])
    url = reverse("admin:bailing_knowledge_task_changelist")
    for action, state in (
        ("pause_tasks", "paused"),
        ("resume_tasks", "active"),
        ("cancel_tasks", "cancelled"),
    ):
        response = admin_client.post(url, {"action": action, "_selected_action": [task.pk]})
        assert response.status_code == 302
        task.refresh_from_db()
        assert task.state == state
    # A cancelled task cannot be resumed.
    response = admin_client.post(
        url, {"action": "resume_tasks", "_selected_action": [task.pk]}, follow=True
    )
    assert "could not be active" in " ".join(str(m) for m in response.context["messages"])
    task.refresh_from_db()
    assert task.state == "cancelled"


def test_changing_a_kbs_embedder_in_the_admin_re_embeds(admin_client, kb, settings):
    """With the immediate task backend the documents are re-embedded before the page
    returns, and the message says so; none is left waiting."""
    from bailing_knowledge.ingestion.documents import upsert_document

    settings.BAILING_KNOWLEDGE = {
        "EMBEDDERS": {
            "default": {"BACKEND": "bailing_knowledge.retrieval.embedders.HashingEmbedder"},
            "small": {
                "BACKEND": "bailing_knowledge.retrieval.embedders.HashingEmbedder",
                "OPTIONS": {"DIMENSIONS": 64},
            },
        }
    }
    document = upsert_document(kb, "a.md", "A", "Some text to index.").document
    upsert_document(kb, "b.md", "B", "Other text to index.")
    data = knowledge_base_form(kb, embedder="small")
    response = admin_client.post(admin_url(KnowledgeBase, "change", kb.pk), data, follow=True)
    assert response.redirect_chain[0][1] == 302, response.content
    assert message_texts(response)[0] == (
        "handbook now embeds with 'small': 2 documents re-embedded."
    )
    kb.refresh_from_db()
    assert kb.embedder == "small"
    assert set(document.chunks.values_list("embedding_dimensions", flat=True)) == {64}
    page = admin_client.get(admin_url(KnowledgeBase, "change", kb.pk)).content.decode()
    assert "2 document(s)" in page and "waiting for re-index" not in page


def test_a_failed_re_embedding_is_reported_with_its_reason(admin_client, kb, settings):
    from bailing_knowledge.ingestion.documents import upsert_document

    upsert_document(kb, "a.md", "A", "Some text to index.")
    upsert_document(kb, "bad.md", "B", "POISON text.")
    settings.BAILING_KNOWLEDGE = {
        "EMBEDDERS": {
            "default": {"BACKEND": "tests.ingestion.test_documents.PoisonEmbedder"},
        }
    }
    response = post_action(admin_client, Document, "reindex_documents", Document.objects.all())
    assert message_texts(response) == [
        "Reindex: 1 document re-indexed; 1 document failed.",
        "Failed: bad.md: Embedding failed: poisoned",
    ]


def test_a_queued_reindex_says_so_and_shows_in_the_lists(admin_client, kb, settings):
    """With a queueing task backend the action only queues: the message says a worker will
    index, and the document, still `ready`, shows its waiting re-index until then."""
    from bailing_knowledge.ingestion.documents import upsert_document
    from tests.settings_worker import TASKS

    document = upsert_document(kb, "a.md", "A", "Some text to index.").document
    upsert_document(kb, "b.md", "B", "Other text to index.")
    settings.TASKS = TASKS
    response = post_action(admin_client, Document, "reindex_documents", [document])
    assert message_texts(response) == [
        "Reindex: 1 document queued for re-indexing; a worker will index it."
    ]
    document.refresh_from_db()
    assert document.status == "ready" and document.reindex_queued_at is not None
    response = admin_client.get(admin_url(Document), {"reindex": "queued"})
    assert [d.source_key for d in response.context["cl"].result_list] == ["a.md"]
    assert "re-index queued" in response.content.decode()
    (listed,) = admin_client.get(admin_url(KnowledgeBase)).context["cl"].result_list
    assert (listed.document_count, listed.reindex_waiting) == (2, 1)
    page = admin_client.get(admin_url(KnowledgeBase, "change", kb.pk)).content.decode()
    assert "1 of 2 documents waiting for re-index" in page
    page = admin_client.get(admin_url(Document, "change", document.pk)).content.decode()
    assert "Re-index queued at" in page


@pytest.mark.parametrize("model", [Document, KnowledgeBase, Route, Client, AgentSession])
@pytest.mark.parametrize("how", ["delete-view", "delete-action"])
def test_objects_that_own_chunks_or_runs_can_be_deleted(admin_client, rows, model, how):
    """Chunks and runs have no delete permission of their own (the services write them):
    deleting the document, knowledge base, route, client or session that owns them deletes
    them with it, as the models cascade. (A task's runs protect it: it is not deleted.)"""
    from bailing_knowledge.ingestion.documents import upsert_document

    upsert_document(rows[KnowledgeBase], "chunked.md", "Chunked", "Text with chunks. " * 20)
    target = rows[model] if model is not Document else Document.objects.get(source_key="chunked.md")
    if how == "delete-view":
        page = admin_client.get(admin_url(model, "delete", target.pk))
        assert page.status_code == 200
        assert page.context["perms_lacking"] == set(), page.context["perms_lacking"]
        response = admin_client.post(admin_url(model, "delete", target.pk), {"post": "yes"})
    else:
        response = admin_client.post(
            admin_url(model),
            {"action": "delete_selected", "_selected_action": [target.pk], "post": "yes"},
        )
    assert response.status_code == 302, response.status_code
    assert not model.objects.filter(pk=target.pk).exists()
