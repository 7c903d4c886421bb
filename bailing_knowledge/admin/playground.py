"""The retrieval playground: what an agent on a route, acting for a principal, gets for a query.

Admin views that call the services the agent API calls (`search`, `read`) with the chosen
principal, and `services.explain` for what the agent does not see. A hand-built principal
searches through an unsaved session whose refs no agent could use.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from rest_framework.exceptions import APIException

from .. import constants
from ..models import AgentSession, Chunk, Document, Route
from ..permissions import allowed_route
from ..renderers import AgentJSONRenderer
from ..services.explain import explain_search, principal_session
from ..services.read import read
from ..services.search import search

# Chunks listed on a document's page; the chunk list has them all.
DOCUMENT_CHUNKS = 50

PLAYGROUND_TEMPLATE = "admin/bailing_knowledge/playground/search.html"
READ_TEMPLATE = "admin/bailing_knowledge/playground/read.html"

# The parameters that say who searches where; carried from a search to its reads.
PRINCIPAL_FIELDS = ("route", "session", "tenant", "roles", "audience")


def has_playground_permission(request: HttpRequest) -> bool:
    """Viewing routes and documents: the playground shows both, and nothing else."""
    user = request.user
    return all(
        user.has_perm(f"bailing_knowledge.view_{model}")
        or user.has_perm(f"bailing_knowledge.change_{model}")
        for model in ("route", "document")
    )


def _can_view_sessions(request: HttpRequest) -> bool:
    return request.user.has_perm("bailing_knowledge.view_agentsession") or request.user.has_perm(
        "bailing_knowledge.change_agentsession"
    )


class PrincipalForm(forms.Form):
    """Who searches where: a route, and a session or a described principal."""

    route = forms.ModelChoiceField(queryset=Route.objects.order_by("route_key"))
    session = forms.CharField(
        required=False,
        label="Existing session",
        widget=forms.TextInput(attrs={"size": 40}),
        help_text="A session id (ses_…): search as its principal. Leave empty to describe one.",
    )
    tenant = forms.CharField(max_length=128, required=False)
    roles = forms.CharField(required=False, help_text="Comma-separated, e.g. support, billing.")
    audience = forms.CharField(max_length=64, required=False)

    def __init__(self, *args: Any, can_use_sessions: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.can_use_sessions = can_use_sessions

    def clean_session(self) -> AgentSession | None:
        session_id = self.cleaned_data["session"].strip()
        if not session_id:
            return None
        if not self.can_use_sessions:
            raise forms.ValidationError("You may not view agent sessions.")
        session = (
            AgentSession.objects.select_related("client").filter(session_id=session_id).first()
        )
        if session is None:
            raise forms.ValidationError("No session has this id.")
        return session

    def principal(self) -> AgentSession:
        data = self.cleaned_data
        if data["session"] is not None:
            return data["session"]
        return principal_session(
            tenant=data["tenant"].strip(),
            roles=[role.strip() for role in data["roles"].split(",")],
            audience=data["audience"].strip(),
        )


class PlaygroundForm(PrincipalForm):
    query = forms.CharField(
        max_length=constants.SEARCH_MAX_QUERY_CHARS,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
    )


def _route(form: PrincipalForm) -> Route:
    """The route with its knowledge bases loaded once, as the API's route check leaves it."""
    return Route.objects.prefetch_related("knowledge_bases").get(pk=form.cleaned_data["route"].pk)


def refusals(session: AgentSession, route: Route) -> list[str]:
    """Why the API would refuse this principal on this route; empty when it would answer.

    A saved session goes through the API's own checks; a hand-built principal has no client
    or route list, so only the route's switches and audiences apply.
    """
    reasons = []
    if session.pk is not None:
        if session.revoked_at is not None:
            reasons.append("401 unauthorized: the session is revoked.")
        elif not session.is_active():
            reasons.append("401 unauthorized: the session has expired.")
        if not session.client.enabled:
            reasons.append("401 unauthorized: the session's agent client is disabled.")
        if allowed_route(session, route.route_key) is None:
            reasons.append(
                "403 route_not_allowed: the route is disabled, its agent runtime is off, or it "
                "is not among the client's and the session's routes, or it does not admit the "
                "principal's audience."
            )
        return reasons
    if not route.enabled:
        reasons.append("403 route_not_allowed: the route is disabled.")
    if not route.agent_client_enabled:
        reasons.append("403 route_not_allowed: agent access to the route is switched off.")
    if not route.admits_audience(session.principal_audience):
        reasons.append("403 route_not_allowed: the route does not admit this audience.")
    return reasons


def _context(request: HttpRequest, admin_site: admin.AdminSite, title: str) -> dict[str, Any]:
    return {
        **admin_site.each_context(request),
        "opts": Route._meta,
        "title": title,
    }


def playground_view(request: HttpRequest, admin_site: admin.AdminSite) -> HttpResponse:
    if not has_playground_permission(request):
        raise PermissionDenied
    can_use_sessions = _can_view_sessions(request)
    bound = "query" in request.GET
    form = PlaygroundForm(
        request.GET if bound else None,
        initial=request.GET.dict(),
        can_use_sessions=can_use_sessions,
    )
    context = {
        **_context(request, admin_site, "Retrieval playground"),
        "form": form,
        "max_bytes": constants.SEARCH_MAX_BYTES,
    }
    if bound and form.is_valid():
        route = _route(form)
        session = form.principal()
        query = form.cleaned_data["query"]
        body = search(session, route, query)
        rendered = AgentJSONRenderer().render(body)
        principal = {
            name: request.GET.get(name, "") for name in PRINCIPAL_FIELDS if request.GET.get(name)
        }
        read_url = reverse(f"{admin_site.name}:bailing_knowledge_route_playground_read")
        context.update(
            {
                "route": route,
                "principal": session.principal,
                "saved_session": session if session.pk is not None else None,
                "refusals": refusals(session, route),
                "response": body,
                "response_json": json.dumps(body, indent=2, ensure_ascii=False),
                "response_bytes": len(rendered),
                "hints": [
                    {
                        **hint,
                        "read_url": f"{read_url}?{urlencode({**principal, 'ref': hint['ref']})}",
                    }
                    for hint in body.get("hints", [])
                ],
                "explanation": explain_search(session, route, query, body.get("hints", [])),
            }
        )
    return TemplateResponse(request, PLAYGROUND_TEMPLATE, context)


def read_view(request: HttpRequest, admin_site: admin.AdminSite) -> HttpResponse:
    """One page of a hint's document, as the read endpoint would answer it."""
    if not has_playground_permission(request):
        raise PermissionDenied
    form = PrincipalForm(request.GET, can_use_sessions=_can_view_sessions(request))
    context = _context(request, admin_site, "Read, as the agent would")
    ref = request.GET.get("ref", "")
    if not form.is_valid() or not ref:
        context["error"] = "invalid_request: choose a route and follow a hint's link."
        return TemplateResponse(request, READ_TEMPLATE, context, status=400)
    route = _route(form)
    session = form.principal()
    try:
        body = read(session, route, ref, cursor=request.GET.get("cursor") or None)
    except APIException as exc:
        context["error"] = f"{exc.status_code} {exc.default_code}: {exc.detail}"
        return TemplateResponse(request, READ_TEMPLATE, context)
    rendered = AgentJSONRenderer().render(body)
    next_url = None
    if body["next_cursor"]:
        principal = {name: request.GET.get(name, "") for name in PRINCIPAL_FIELDS}
        next_url = "?" + urlencode({**principal, "ref": ref, "cursor": body["next_cursor"]})
    context.update(
        {
            "route": route,
            "principal": session.principal,
            "page": body,
            "page_bytes": len(rendered),
            "next_url": next_url,
            "page_json": json.dumps(
                {key: value for key, value in body.items() if key != "content"}, indent=2
            ),
        }
    )
    return TemplateResponse(request, READ_TEMPLATE, context)


def playground_urls(admin_site: admin.AdminSite) -> list[URLPattern]:
    """The playground's URLs, mounted under the routes' admin."""
    return [
        path(
            "playground/",
            admin_site.admin_view(lambda request: playground_view(request, admin_site)),
            name="bailing_knowledge_route_playground",
        ),
        path(
            "playground/read/",
            admin_site.admin_view(lambda request: read_view(request, admin_site)),
            name="bailing_knowledge_route_playground_read",
        ),
    ]


def document_chunks(admin_site: admin.AdminSite, document: Document) -> str:
    """The document's current chunks with their offsets, each a shortcut into the playground.

    The shortcut searches with the chunk's text on the first route that uses the document's
    knowledge base: the questions that find a document start with its own words.
    """
    if document.pk is None:
        return "-"
    chunks = list(
        Chunk.objects.filter(document=document, revision=document.revision)
        .order_by("ordinal")
        .values_list("ordinal", "start", "end", "text")[: DOCUMENT_CHUNKS + 1]
    )
    if not chunks:
        return "No chunks at the current revision."
    route = document.knowledge_base.routes.order_by("route_key").first()
    playground = reverse(f"{admin_site.name}:bailing_knowledge_route_playground")
    rows = []
    for ordinal, start, end, text in chunks[:DOCUMENT_CHUNKS]:
        params = {"query": text[: constants.SEARCH_MAX_QUERY_CHARS]}
        if route is not None:
            params["route"] = str(route.pk)
        preview = text if len(text) <= 160 else text[:159] + "…"
        rows.append((ordinal, start, end, preview, f"{playground}?{urlencode(params)}"))
    table = format_html(
        '<table class="bk-chunks"><thead><tr><th>#</th><th>start</th><th>end</th>'
        "<th>text</th><th></th></tr></thead><tbody>{}</tbody></table>",
        format_html_join(
            "",
            '<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><a href="{}">'
            "Search with this text</a></td></tr>",
            rows,
        ),
    )
    if len(chunks) > DOCUMENT_CHUNKS:
        opts = Chunk._meta
        url = reverse(f"{admin_site.name}:{opts.app_label}_{opts.model_name}_changelist")
        more = format_html(
            '<p>The first {} chunks; <a href="{}?document__id__exact={}">all chunks</a>.</p>',
            DOCUMENT_CHUNKS,
            url,
            document.pk,
        )
        table = format_html("{}{}", table, more)
    return table
