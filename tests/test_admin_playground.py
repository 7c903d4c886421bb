"""The retrieval playground and the document's chunks: permissions, content, no leaks."""

from __future__ import annotations

import json
import re
from urllib.parse import parse_qs, urlparse

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from bailing_knowledge import services
from bailing_knowledge.models import Document

from .api.conftest import AgentCaller
from .services.test_explain import MARKER, corpus  # noqa: F401  (a fixture)

pytestmark = pytest.mark.django_db

PLAYGROUND = "admin:bailing_knowledge_route_playground"
READ = "admin:bailing_knowledge_route_playground_read"
QUERY = "how long do refunds take"


def playground(client, route, query=QUERY, **principal):
    return client.get(reverse(PLAYGROUND), {"route": route.pk, "query": query, **principal})


def comparable(hints):
    """What a hint says, without its ref and expiry (signed at a different second)."""
    return [{k: v for k, v in hint.items() if k not in ("ref", "expires_at")} for hint in hints]


@pytest.fixture
def staff(django_user_model, client):
    user = django_user_model.objects.create_user("staffer", password="x", is_staff=True)
    client.force_login(user)
    return user


def grant(user, *codenames):
    user.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="bailing_knowledge", codename__in=codenames
        )
    )


def test_staff_without_the_apps_permissions_gets_403(client, staff, route):
    assert playground(client, route).status_code == 403
    assert client.get(reverse(READ), {"route": route.pk, "ref": "x"}).status_code == 403
    grant(staff, "view_route")
    assert playground(client, route).status_code == 403


def test_viewing_routes_and_documents_is_enough_but_sessions_need_their_permission(
    client,
    staff,
    route,
    issued,
    corpus,  # noqa: F811
):
    grant(staff, "view_route", "view_document")
    response = playground(client, route, tenant="acme", roles="support", audience="staff")
    assert response.status_code == 200
    assert response.context["hints"]
    response = playground(client, route, session=issued.session.session_id)
    assert response.status_code == 200
    assert "session" in response.context["form"].errors
    grant(staff, "view_agentsession")
    response = playground(client, route, session=issued.session.session_id)
    assert response.context["hints"]


def test_the_playground_answers_what_the_api_answers(admin_client, issued, route, corpus):  # noqa: F811
    api = AgentCaller(issued.access_token).post(
        "/workspaces/orders/knowledge/search", {"query": QUERY}
    )
    assert api.status_code == 200
    expected = json.loads(api.content)
    assert expected["hints"]

    by_session = playground(admin_client, route, session=issued.session.session_id)
    assert by_session.status_code == 200
    body = by_session.context["response"]
    assert comparable(body["hints"]) == comparable(expected["hints"])
    assert {k: v for k, v in body.items() if k != "hints"} == {
        k: v for k, v in expected.items() if k != "hints"
    }
    assert by_session.context["refusals"] == []
    assert by_session.context["response_bytes"] == len(api.content)
    page = by_session.content.decode()
    assert f"{len(api.content)} of 4096 bytes" in page
    for hint in expected["hints"]:
        assert hint["title"] in page

    described = playground(admin_client, route, tenant="acme", roles="support", audience="staff")
    assert comparable(described.context["response"]["hints"]) == comparable(expected["hints"])


def test_a_hidden_document_appears_nowhere(admin_client, issued, route, corpus):  # noqa: F811
    """Not in the hints, the candidates, the hidden list or a read, as session or principal."""
    for principal in (
        {"session": issued.session.session_id},
        {"tenant": "acme", "audience": "staff", "roles": "support"},
    ):
        for query in (QUERY, f"{MARKER} refund policy", MARKER):
            response = playground(admin_client, route, query=query, **principal)
            assert response.status_code == 200
            page = response.content.decode()
            # The query itself is echoed in the form's text area: look everywhere else.
            page = re.sub(r"<textarea.*?</textarea>", "", page, flags=re.DOTALL)
            assert MARKER.lower() not in page.lower()
            assert len(response.context["explanation"].hidden) >= 3
            for hint in response.context["hints"]:
                read = admin_client.get(hint["read_url"])
                assert read.status_code == 200
                assert MARKER.lower() not in read.content.decode().lower()
    # The check can fail: a principal who may see the documents sees the marker.
    response = playground(
        admin_client, route, query=QUERY, tenant="acme", roles="finance", audience="partners"
    )
    page = re.sub(r"<textarea.*?</textarea>", "", response.content.decode(), flags=re.DOTALL)
    assert MARKER in page


def test_a_hint_reads_as_the_read_endpoint_would(admin_client, issued, route, corpus):  # noqa: F811
    response = playground(admin_client, route, session=issued.session.session_id)
    hint = response.context["hints"][0]
    page = admin_client.get(hint["read_url"])
    assert page.status_code == 200
    api = AgentCaller(issued.access_token).post(
        "/workspaces/orders/knowledge/read", {"ref": hint["ref"]}
    )
    assert api.status_code == 200, api.content
    expected = json.loads(api.content)
    assert page.context["page"]["content"] == expected["content"]
    assert page.context["page_bytes"] == len(api.content)
    assert expected["content"] in page.content.decode()


def test_read_reports_the_endpoints_error(admin_client, route, corpus):  # noqa: F811
    params = {"route": route.pk, "tenant": "acme", "audience": "staff", "ref": "not-a-ref"}
    page = admin_client.get(reverse(READ), params)
    assert page.status_code == 200
    assert "knowledge_reference_invalid" in page.content.decode()


def test_a_hand_built_principals_refs_are_useless_to_an_agent(admin_client, issued, route, corpus):  # noqa: F811
    response = playground(admin_client, route, tenant="acme", roles="support", audience="staff")
    ref = response.context["hints"][0]["ref"]
    api = AgentCaller(issued.access_token).post("/workspaces/orders/knowledge/read", {"ref": ref})
    assert api.status_code == 400
    assert json.loads(api.content)["error"] == "knowledge_reference_invalid"


def test_refusals_are_shown(admin_client, issued, route, corpus):  # noqa: F811
    services.revoke_session(issued.session)
    response = playground(admin_client, route, session=issued.session.session_id)
    assert any("revoked" in reason for reason in response.context["refusals"])
    services.update_route(route, audiences=["customers"])
    response = playground(admin_client, route, tenant="acme", audience="staff")
    assert any("audience" in reason for reason in response.context["refusals"])


def test_unbound_form_prefills_from_the_url(admin_client, route):
    response = admin_client.get(reverse(PLAYGROUND), {"route": route.pk})
    assert response.status_code == 200
    assert response.context["form"]["route"].value() == str(route.pk)
    assert "response" not in response.context


def test_a_documents_page_lists_its_chunks_with_a_search_shortcut(admin_client, route, corpus):  # noqa: F811
    document = Document.objects.get(source_key="refunds.md")
    url = reverse("admin:bailing_knowledge_document_change", args=(document.pk,))
    page = admin_client.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert "Search with this text" in html
    link = next(
        part.split('"')[0]
        for part in html.split('href="')
        if part.startswith(reverse(PLAYGROUND) + "?")
    )
    params = parse_qs(urlparse(link.replace("&amp;", "&")).query)
    assert params["route"] == [str(route.pk)]
    assert params["query"][0] in document.body
    found = admin_client.get(link.replace("&amp;", "&") + "&tenant=acme&audience=staff")
    assert found.context["hints"][0]["title"] == "Refund policy"


def test_routes_and_sessions_link_to_the_playground(admin_client, route, issued):
    playground_url = reverse(PLAYGROUND)
    page = admin_client.get(reverse("admin:bailing_knowledge_route_changelist")).content.decode()
    assert f'href="{playground_url}"' in page
    page = admin_client.get(
        reverse("admin:bailing_knowledge_route_change", args=(route.pk,))
    ).content.decode()
    assert f'href="{playground_url}?route={route.pk}"' in page
    session = issued.session
    page = admin_client.get(
        reverse("admin:bailing_knowledge_agentsession_change", args=(session.pk,))
    ).content.decode()
    assert f"{playground_url}?session={session.session_id}&amp;route={route.pk}" in page
    prefilled = admin_client.get(playground_url, {"session": session.session_id, "route": route.pk})
    assert prefilled.context["form"]["session"].value() == session.session_id


def test_the_knowledge_base_page_links_uploads_and_lists_its_routes(admin_client, kb, route):
    page = admin_client.get(
        reverse("admin:bailing_knowledge_knowledgebase_change", args=(kb.pk,))
    ).content.decode()
    upload = reverse("admin:bailing_knowledge_document_upload")
    assert f'href="{upload}?knowledge_base={kb.pk}"' in page
    route_url = reverse("admin:bailing_knowledge_route_change", args=(route.pk,))
    assert f'<a href="{route_url}">orders</a>' in page
    form = admin_client.get(upload, {"knowledge_base": kb.pk}).context["form"]
    assert str(form["knowledge_base"].value()) == str(kb.pk)


def test_the_route_form_explains_agent_access_in_plain_words(admin_client, route):
    page = admin_client.get(
        reverse("admin:bailing_knowledge_route_change", args=(route.pk,))
    ).content.decode()
    assert "agent_client.enabled" not in page
    assert "Whether agents may call this route at all" in page


def test_documents_are_named_by_their_source_key(admin_client, kb):
    from bailing_knowledge.ingestion.documents import upsert_document

    upsert_document(kb, "refunds.md", "Refund policy", "Refunds take five days.")
    document = Document.objects.get()
    assert str(document) == "refunds.md"
    page = admin_client.get(
        reverse("admin:bailing_knowledge_document_change", args=(document.pk,))
    ).content.decode()
    assert f"{kb.pk}:refunds.md" not in page
