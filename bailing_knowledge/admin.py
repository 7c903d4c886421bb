"""The Django admin for every model of the app.

Every action and the session "add" form call the services in `bailing_knowledge.services`,
so the admin applies exactly the rules the CLI and the Python API apply. Changelists annotate
their counts with one subquery each, so a page costs the same number of queries for 1 row
as for 100.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import model_ngettext
from django.contrib.admin.widgets import FilteredSelectMultiple
from django.core.exceptions import (
    NON_FIELD_ERRORS,
    ObjectDoesNotExist,
    PermissionDenied,
    ValidationError,
)
from django.db.models import Count, IntegerField, Model, OuterRef, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce, Now
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.cache import add_never_cache_headers
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.timezone import localtime

from . import services
from .admin_playground import document_chunks, playground_urls
from .conf import knowledge_settings
from .ingestion.documents import (
    reindex_document,
    set_knowledge_base_embedder,
    set_knowledge_base_language,
    upsert_document,
)
from .ingestion.loaders import LoaderError, load_file, supported_suffixes
from .models import (
    AgentSession,
    Chunk,
    Client,
    Document,
    KnowledgeBase,
    Route,
    Run,
    Task,
)
from .retrieval.analysis import DEFAULT_LANGUAGE, LANGUAGES
from .services.tasks import set_task_state

# --------------------------------------------------------------------------- helpers


def _count(queryset: QuerySet, field: str, **filters: Any) -> Coalesce:
    """A correlated `COUNT(*)` of `queryset` rows whose `field` points at the outer row.

    A subquery per count (rather than `Count()` over joins) keeps several counts on one
    changelist from multiplying each other's rows.
    """
    counted = (
        queryset.filter(**{field: OuterRef("pk")}, **filters)
        .order_by()
        .values(field)
        .annotate(n=Count("*"))
        .values("n")
    )
    return Coalesce(Subquery(counted, output_field=IntegerField()), Value(0))


def _when(value: Any) -> str:
    """A timestamp short enough for a list column: changelists must fit a laptop screen."""
    return "-" if value is None else date_format(localtime(value), "Y-m-d H:i")


class ListMedia:
    """Long values (source keys, principal ids) wrap inside their column."""

    css = {"all": ("bailing_knowledge/admin.css",)}


def _error_text(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(exc.messages)
    return str(exc)


def _changelist_link(admin_site: admin.AdminSite, model: type[Model], query: str, text: str) -> str:
    opts = model._meta
    url = reverse(f"{admin_site.name}:{opts.app_label}_{opts.model_name}_changelist")
    return format_html('<a href="{}?{}">{}</a>', url, query, text)


def _apply_toggle(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet,
    *,
    service: Callable[[Any, bool], Any],
    attr: str,
    value: bool,
    label: str,
    switch: str = "",
) -> None:
    """Call `service(obj, value)` on every selected object and summarise the outcome.

    `label` is the past participle shown to the user ("enabled"); `switch` names the
    setting when it is not the object itself ("the agent client runtime"). Objects that
    already had the value still go through the service, which is idempotent.
    """
    changed = unchanged = 0
    failures: list[str] = []
    for obj in queryset:
        before = getattr(obj, attr)
        try:
            service(obj, value)
        except (ValidationError, ObjectDoesNotExist) as exc:
            failures.append(f"{obj}: {_error_text(exc)}")
            continue
        if before == value:
            unchanged += 1
        else:
            changed += 1
            what = f"{switch[0].upper()}{switch[1:]} {label}" if switch else label.capitalize()
            modeladmin.log_change(request, obj, f"{what} by an admin action.")
    noun = model_ngettext(modeladmin.opts, changed)
    summary = f"{changed} {noun} with {switch} {label}" if switch else f"{changed} {noun} {label}"
    if unchanged:
        summary += f"; {unchanged} already {label}"
    level = messages.SUCCESS if changed or not failures else messages.WARNING
    modeladmin.message_user(request, summary + ".", level)
    if failures:
        modeladmin.message_user(
            request,
            f"{len(failures)} could not be {label}: " + " | ".join(failures),
            messages.ERROR,
        )


def toggle_action(
    name: str,
    description: str,
    *,
    service: Callable[[Any, Any], Any],
    attr: str,
    value: Any,
    label: str,
    switch: str = "",
) -> Callable[..., None]:
    """An admin action that calls `service(obj, value)` on each selected object."""

    def action(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
        _apply_toggle(
            modeladmin,
            request,
            queryset,
            service=service,
            attr=attr,
            value=value,
            label=label,
            switch=switch,
        )

    action.__name__ = name
    return admin.action(description=description, permissions=["change"])(action)


# --------------------------------------------------------------------------- knowledge bases


class KnowledgeBaseForm(forms.ModelForm):
    """Offers the configured embedders and the supported languages as choices."""

    embedder = forms.ChoiceField(
        choices=(),
        help_text="Alias of an embedder in BAILING_KNOWLEDGE['EMBEDDERS'].",
    )
    language = forms.ChoiceField(
        choices=list(LANGUAGES.items()),
        initial=DEFAULT_LANGUAGE,
        help_text=(
            f"{KnowledgeBase._meta.get_field('language').help_text} "
            "Changing it re-indexes the documents."
        ),
    )

    class Meta:
        model = KnowledgeBase
        fields = ("slug", "title", "description", "enabled", "embedder", "language", "tenant")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        embedders = knowledge_settings.EMBEDDERS
        aliases = sorted(embedders) if isinstance(embedders, dict) else []
        self.fields["embedder"].choices = [(alias, alias) for alias in aliases]


@admin.register(KnowledgeBase)
class KnowledgeBaseAdmin(admin.ModelAdmin):
    form = KnowledgeBaseForm
    list_display = (
        "slug",
        "title",
        "enabled",
        "tenant",
        "embedder",
        "language",
        "document_count",
        "route_count",
        "updated",
    )
    list_display_links = ("slug", "title")
    list_filter = ("enabled", "embedder", "language", "tenant")
    search_fields = ("slug", "title", "description", "tenant")
    readonly_fields = ("documents_link", "routes_list", "created_at", "updated_at")
    prepopulated_fields = {"slug": ("title",)}
    Media = ListMedia
    actions = ("enable_knowledge_bases", "disable_knowledge_bases")
    fieldsets = (
        (None, {"fields": ("slug", "title", "description", "enabled")}),
        ("Retrieval", {"fields": ("embedder", "language", "tenant")}),
        ("Contents", {"fields": ("documents_link", "routes_list", "created_at", "updated_at")}),
    )

    def save_model(self, request: HttpRequest, obj: KnowledgeBase, form: Any, change: bool) -> None:
        """A new language or embedder means a new index: switch through the services.

        The other fields are saved first, with the old values of these two; the services
        then change them and re-index. The language goes first: its re-index only recomputes
        lexical terms, while re-embedding recomputes everything, in the new language.
        """
        switches = [field for field in ("embedder", "language") if field in form.changed_data]
        if not change or not switches:
            super().save_model(request, obj, form, change)
            return
        new = {field: getattr(obj, field) for field in switches}
        for field in switches:
            setattr(obj, field, form.initial[field])
        super().save_model(request, obj, form, change)
        if "language" in new:
            set_knowledge_base_language(obj, new["language"])
            self.message_user(
                request,
                f"Documents of {obj.slug} were re-indexed for the language {new['language']!r}.",
            )
        if "embedder" in new:
            set_knowledge_base_embedder(obj, new["embedder"])
            self.message_user(
                request, f"Documents of {obj.slug} were re-embedded with {new['embedder']!r}."
            )

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return (
            super()
            .get_queryset(request)
            .annotate(
                document_count=_count(Document.objects.all(), "knowledge_base"),
                route_count=_count(Route.knowledge_bases.through.objects.all(), "knowledgebase"),
            )
        )

    @admin.display(description="documents", ordering="document_count")
    def document_count(self, obj: KnowledgeBase) -> int:
        return obj.document_count

    @admin.display(description="routes", ordering="route_count")
    def route_count(self, obj: KnowledgeBase) -> int:
        return obj.route_count

    @admin.display(description="updated", ordering="updated_at")
    def updated(self, obj: KnowledgeBase) -> str:
        return _when(obj.updated_at)

    @admin.display(description="documents")
    def documents_link(self, obj: KnowledgeBase) -> str:
        if obj.pk is None:
            return "-"
        documents = _changelist_link(
            self.admin_site,
            Document,
            f"knowledge_base__id__exact={obj.pk}",
            f"{obj.document_count} document(s)",
        )
        upload = reverse(f"{self.admin_site.name}:bailing_knowledge_document_upload")
        return format_html(
            '{} &middot; <a href="{}?knowledge_base={}">Upload documents</a>',
            documents,
            upload,
            obj.pk,
        )

    @admin.display(description="used by routes")
    def routes_list(self, obj: KnowledgeBase) -> str:
        if obj.pk is None:
            return "-"
        routes = obj.routes.order_by("route_key")
        if not routes:
            return "No route uses this knowledge base."
        return format_html_join(
            ", ",
            '<a href="{}">{}</a>',
            (
                (reverse(f"{self.admin_site.name}:bailing_knowledge_route_change", args=(r.pk,)), r)
                for r in routes
            ),
        )

    enable_knowledge_bases = toggle_action(
        "enable_knowledge_bases",
        "Enable selected knowledge bases",
        service=services.set_knowledge_base_enabled,
        attr="enabled",
        value=True,
        label="enabled",
    )

    disable_knowledge_bases = toggle_action(
        "disable_knowledge_bases",
        "Disable selected knowledge bases",
        service=services.set_knowledge_base_enabled,
        attr="enabled",
        value=False,
        label="disabled",
    )


# --------------------------------------------------------------------------- routes


@admin.register(Route)
class RouteAdmin(admin.ModelAdmin):
    list_display = (
        "route_key",
        "name",
        "enabled",
        "agent_access",
        "knowledge",
        "search_settings",
        "knowledge_base_count",
        "client_count",
    )
    list_display_links = ("route_key", "name")
    Media = ListMedia
    list_filter = ("enabled", "agent_client_enabled", "knowledge_enabled", "knowledge_mode")
    search_fields = ("route_key", "name", "knowledge_bases__slug")
    filter_horizontal = ("knowledge_bases",)
    readonly_fields = ("created_at", "updated_at")
    actions = (
        "enable_routes",
        "disable_routes",
        "enable_agent_client",
        "disable_agent_client",
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return (
            super()
            .get_queryset(request)
            .annotate(
                knowledge_base_count=_count(Route.knowledge_bases.through.objects.all(), "route"),
                client_count=_count(Client.allowed_routes.through.objects.all(), "route"),
            )
        )

    def get_urls(self) -> list:
        return [*playground_urls(self.admin_site), *super().get_urls()]

    def get_readonly_fields(self, request: HttpRequest, obj: Route | None = None) -> tuple:
        # The revision hashes the bound KBs (one query): change page only, never per row.
        if obj is None:
            return self.readonly_fields
        return (*self.readonly_fields, "knowledge_scope_revision")

    def get_fieldsets(self, request: HttpRequest, obj: Route | None = None) -> tuple:
        knowledge: tuple[str, ...] = (
            "knowledge_enabled",
            "knowledge_bases",
            "knowledge_mode",
            "top_k",
            "min_score",
            "max_docs",
        )
        fieldsets: list[tuple[str | None, dict[str, Any]]] = [
            (None, {"fields": ("route_key", "name", "enabled")}),
            ("Agent access", {"fields": ("allowed_audiences", "agent_client_enabled")}),
        ]
        if obj is None:
            fieldsets.append(("Knowledge", {"fields": knowledge}))
        else:
            fieldsets.append(("Knowledge", {"fields": (*knowledge, "knowledge_scope_revision")}))
            fieldsets.append(("History", {"fields": ("created_at", "updated_at")}))
        return tuple(fieldsets)

    def get_form(self, request: HttpRequest, obj: Route | None = None, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, **kwargs)
        switch = form.base_fields.get("agent_client_enabled")
        if switch is not None:
            switch.help_text = (
                "Whether agents may call this route at all. Switching it off refuses every "
                "agent request on the route, while the route's other settings are kept."
            )
        return form

    @admin.display(description="agent access", boolean=True, ordering="agent_client_enabled")
    def agent_access(self, obj: Route) -> bool:
        return obj.agent_client_enabled

    @admin.display(description="knowledge", boolean=True, ordering="knowledge_enabled")
    def knowledge(self, obj: Route) -> bool:
        return obj.knowledge_enabled

    @admin.display(description="search")
    def search_settings(self, obj: Route) -> str:
        """Mode, top_k, max_docs and min_score in one column."""
        return format_html(
            "{}<br><small>top {} · {} docs · score ≥ {}</small>",
            obj.get_knowledge_mode_display(),
            obj.top_k,
            obj.max_docs,
            f"{obj.min_score:g}",
        )

    @admin.display(description="KBs", ordering="knowledge_base_count")
    def knowledge_base_count(self, obj: Route) -> int:
        return obj.knowledge_base_count

    @admin.display(description="clients", ordering="client_count")
    def client_count(self, obj: Route) -> int:
        return obj.client_count

    enable_routes = toggle_action(
        "enable_routes",
        "Enable selected routes",
        service=services.set_route_enabled,
        attr="enabled",
        value=True,
        label="enabled",
    )

    disable_routes = toggle_action(
        "disable_routes",
        "Disable selected routes",
        service=services.set_route_enabled,
        attr="enabled",
        value=False,
        label="disabled",
    )

    enable_agent_client = toggle_action(
        "enable_agent_client",
        "Enable the agent client runtime of selected routes",
        service=services.set_agent_client_enabled,
        attr="agent_client_enabled",
        value=True,
        label="enabled",
        switch="the agent client runtime",
    )

    disable_agent_client = toggle_action(
        "disable_agent_client",
        "Disable the agent client runtime of selected routes",
        service=services.set_agent_client_enabled,
        attr="agent_client_enabled",
        value=False,
        label="disabled",
        switch="the agent client runtime",
    )


# --------------------------------------------------------------------------- clients


@admin.register(Client)
class ClientAdmin(admin.ModelAdmin):
    list_display = (
        "app_id",
        "name",
        "enabled",
        "route_count",
        "active_session_count",
        "updated_at",
    )
    list_display_links = ("app_id", "name")
    list_filter = ("enabled",)
    search_fields = ("app_id", "name", "allowed_routes__route_key")
    filter_horizontal = ("allowed_routes",)
    readonly_fields = ("sessions_link", "created_at", "updated_at")
    actions = ("enable_clients", "disable_clients")

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return (
            super()
            .get_queryset(request)
            .annotate(
                route_count=_count(Client.allowed_routes.through.objects.all(), "client"),
                active_session_count=_count(AgentSession.objects.active(Now()), "client"),
            )
        )

    def get_fieldsets(self, request: HttpRequest, obj: Client | None = None) -> tuple:
        main = (None, {"fields": ("app_id", "name", "enabled", "allowed_routes")})
        if obj is None:
            return (main,)
        return (main, ("Sessions", {"fields": ("sessions_link", "created_at", "updated_at")}))

    @admin.display(description="routes", ordering="route_count")
    def route_count(self, obj: Client) -> int:
        return obj.route_count

    @admin.display(description="active sessions", ordering="active_session_count")
    def active_session_count(self, obj: Client) -> int:
        return obj.active_session_count

    @admin.display(description="sessions")
    def sessions_link(self, obj: Client) -> str:
        if obj.pk is None:
            return "-"
        opts = AgentSession._meta
        add_url = reverse(f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_add")
        return format_html(
            '{} &middot; <a href="{}?client={}">Issue a session</a>',
            _changelist_link(
                self.admin_site,
                AgentSession,
                f"client__id__exact={obj.pk}",
                f"{obj.active_session_count} active session(s)",
            ),
            add_url,
            obj.pk,
        )

    enable_clients = toggle_action(
        "enable_clients",
        "Enable selected agent clients",
        service=services.set_client_enabled,
        attr="enabled",
        value=True,
        label="enabled",
    )

    disable_clients = toggle_action(
        "disable_clients",
        "Disable selected agent clients",
        service=services.set_client_enabled,
        attr="enabled",
        value=False,
        label="disabled",
    )


# --------------------------------------------------------------------------- sessions


def _seconds(value: timedelta | int) -> int:
    return int(value.total_seconds()) if isinstance(value, timedelta) else int(value)


def _split_list(value: str) -> list[str]:
    """'a, b' -> ['a', ' b']; blank -> []. The service strips and validates the items."""
    return value.split(",") if value.strip() else []


class WrappedSelectMultiple(FilteredSelectMultiple):
    """The two-pane selector in a box of its own, as the admin wraps its own selectors.

    The selector's script moves its panes to the front of the widget's parent element; on
    a plain form that parent also holds the label, which would end up right of the panes.
    """

    def render(self, *args: Any, **kwargs: Any) -> str:
        return format_html(
            '<div class="related-widget-wrapper">{}</div>', super().render(*args, **kwargs)
        )


class IssueSessionForm(forms.ModelForm):
    """Issues a session through `services.issue_session` when it validates.

    The session is created during validation (inside the admin's transaction), so that
    every rule of the service reports its error on the matching field. The raw token is
    kept on `self.issued` only; no field of the form ever holds it.
    """

    # Service error keys -> form fields.
    ERROR_FIELDS = {
        "client": "client",
        "principal_id": "principal_id",
        "principal_tenant": "tenant",
        "principal_roles": "roles",
        "principal_audience": "audience",
        "on_behalf_of": "on_behalf_of",
        "routes": "routes",
        "allowed_routes": "routes",
        "lifetime": "lifetime",
        "expires_at": "lifetime",
        "device_label": "device_label",
    }

    client = forms.ModelChoiceField(queryset=Client.objects.order_by("app_id"))
    principal_id = forms.CharField(
        max_length=200, help_text="The business user (or service) the agent acts for."
    )
    tenant = forms.CharField(max_length=128, required=False)
    roles = forms.CharField(required=False, help_text="Comma-separated, e.g. support, billing.")
    audience = forms.CharField(max_length=64, required=False)
    on_behalf_of = forms.CharField(max_length=200, required=False)
    routes = forms.ModelMultipleChoiceField(
        queryset=Route.objects.order_by("route_key"),
        widget=WrappedSelectMultiple("routes", is_stacked=False),
        help_text="Must be among the client's allowed routes.",
    )
    lifetime = forms.IntegerField(required=False, label="Lifetime (seconds)")
    device_label = forms.CharField(max_length=200, required=False)

    class Meta:
        model = AgentSession
        fields = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.issued: services.IssuedSession | None = None
        default = _seconds(knowledge_settings.SESSION_DEFAULT_LIFETIME)
        maximum = _seconds(knowledge_settings.SESSION_MAX_LIFETIME)
        help_text = f"Empty for the default ({default} s); at most {maximum} s."
        self.fields["lifetime"].help_text = help_text

    def _post_clean(self) -> None:
        if self._errors:
            return
        data = self.cleaned_data
        try:
            self.issued = services.issue_session(
                data["client"],
                principal_id=data["principal_id"],
                routes=list(data["routes"]),
                tenant=data["tenant"],
                roles=_split_list(data["roles"]),
                audience=data["audience"],
                on_behalf_of=data["on_behalf_of"],
                lifetime=data["lifetime"],
                device_label=data["device_label"],
            )
        except (ValidationError, ObjectDoesNotExist) as exc:
            self._add_service_errors(exc)
            return
        except OverflowError:
            # A lifetime beyond what `timedelta` can hold fails before the service's check.
            self.add_error("lifetime", "The lifetime is out of range.")
            return
        self.instance = self.issued.session

    def _add_service_errors(self, exc: Exception) -> None:
        if not isinstance(exc, ValidationError) or not hasattr(exc, "error_dict"):
            self.add_error(None, _error_text(exc))
            return
        for key, errors in exc.error_dict.items():
            field = self.ERROR_FIELDS.get(key)
            for error in errors:
                text = "; ".join(error.messages)
                if field is None and key != NON_FIELD_ERRORS:
                    text = f"{key}: {text}"
                self.add_error(field, text)

    def _save_m2m(self) -> None:
        """The service already stored the routes."""


class SessionStatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> Iterable:
        return (("active", "Active"), ("expired", "Expired"), ("revoked", "Revoked"))

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet | None:
        value = self.value()
        if value == "active":
            return queryset.active()
        if value == "expired":
            return queryset.expired()
        if value == "revoked":
            return queryset.revoked()
        return None


@admin.register(AgentSession)
class AgentSessionAdmin(admin.ModelAdmin):
    list_display = (
        "session_id",
        "client",
        "principal",
        "route_keys",
        "status",
        "expires",
        "last_seen",
    )
    list_filter = (
        SessionStatusFilter,
        "client",
        "principal_audience",
        "principal_tenant",
        "allowed_routes",
    )
    list_select_related = ("client",)
    Media = ListMedia
    search_fields = (
        "=session_id",
        "principal_id",
        "on_behalf_of",
        "device_label",
        "=token_hint",
        "client__app_id",
    )
    readonly_fields = (
        "session_id",
        "client",
        "principal_id",
        "principal_tenant",
        "principal_roles",
        "principal_audience",
        "on_behalf_of",
        "allowed_routes",
        "token_hint",
        "token_hash",
        "status",
        "created_at",
        "expires_at",
        "revoked_at",
        "last_seen_at",
    )
    fieldsets = (
        (None, {"fields": ("session_id", "client", "status", "device_label")}),
        (
            "Principal",
            {
                "fields": (
                    "principal_id",
                    "principal_tenant",
                    "principal_roles",
                    "principal_audience",
                    "on_behalf_of",
                )
            },
        ),
        ("Access", {"fields": ("allowed_routes", "created_at", "expires_at", "revoked_at")}),
        ("Token", {"fields": ("token_hint", "token_hash", "last_seen_at")}),
    )
    add_fieldsets = (
        (None, {"fields": ("client", "principal_id", "routes")}),
        (
            "Principal",
            {"fields": ("tenant", "roles", "audience", "on_behalf_of")},
        ),
        ("Session", {"fields": ("lifetime", "device_label")}),
    )
    actions = ("revoke_sessions",)
    issued_template = "admin/bailing_knowledge/agentsession/issued.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).prefetch_related("allowed_routes")

    # The add page issues a session; the change page shows it and edits only its label.

    def get_form(
        self, request: HttpRequest, obj: AgentSession | None = None, change: bool = False, **kwargs
    ) -> type[forms.ModelForm]:
        if obj is None:
            return IssueSessionForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fieldsets(self, request: HttpRequest, obj: AgentSession | None = None) -> tuple:
        return self.add_fieldsets if obj is None else self.fieldsets

    def get_readonly_fields(self, request: HttpRequest, obj: AgentSession | None = None) -> tuple:
        return () if obj is None else self.readonly_fields

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict | None = None
    ) -> HttpResponse:
        context = {
            "title": "Issue agent session",
            "show_save_and_add_another": False,
            "show_save_and_continue": False,
            **(extra_context or {}),
        }
        return super().add_view(request, form_url, context)

    def save_model(
        self, request: HttpRequest, obj: AgentSession, form: forms.ModelForm, change: bool
    ) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        # The form's validation already issued (and saved) the session through the service.
        # Keep the raw token on this in-memory instance until `response_add` shows it.
        if form.issued is None or form.issued.session is not obj:
            raise RuntimeError("The issue form did not issue this session.")
        obj._issued_access_token = form.issued.access_token

    def response_add(
        self, request: HttpRequest, obj: AgentSession, post_url_continue: str | None = None
    ) -> HttpResponse:
        """Render the outcome directly, never through a redirect.

        The token is on this page only: it never reaches a redirect, the message cookie or
        the session store.
        """
        token = obj.__dict__.pop("_issued_access_token", None)
        if token is None:
            raise RuntimeError("No access token to show for this session.")
        self.message_user(
            request,
            f"Issued agent session {obj.session_id} for principal {obj.principal_id!r}.",
            messages.SUCCESS,
        )
        self.message_user(
            request,
            "Copy the access token below now: it is not stored and will not be shown again.",
            messages.WARNING,
        )
        opts = self.opts
        context = {
            **self.admin_site.each_context(request),
            "opts": opts,
            "title": "Agent session issued",
            "session": obj,
            "access_token": token,
            "routes": [route.route_key for route in obj.allowed_routes.all()],
            "change_url": reverse(
                f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_change",
                args=(obj.pk,),
            ),
        }
        response = TemplateResponse(request, self.issued_template, context)
        add_never_cache_headers(response)
        return response

    @admin.display(description="principal", ordering="principal_id")
    def principal(self, obj: AgentSession) -> str:
        scope = " · ".join(part for part in (obj.principal_tenant, obj.principal_audience) if part)
        if not scope:
            return obj.principal_id
        return format_html("{}<br><small>{}</small>", obj.principal_id, scope)

    @admin.display(description="expires", ordering="expires_at")
    def expires(self, obj: AgentSession) -> str:
        return _when(obj.expires_at)

    @admin.display(description="last used", ordering="last_seen_at")
    def last_seen(self, obj: AgentSession) -> str:
        return _when(obj.last_seen_at)

    @admin.display(description="routes")
    def route_keys(self, obj: AgentSession) -> str:
        return ", ".join(route.route_key for route in obj.allowed_routes.all())

    @admin.display(description="status")
    def status(self, obj: AgentSession) -> str:
        return obj.status

    @admin.action(description="Revoke selected agent sessions", permissions=["change"])
    def revoke_sessions(self, request: HttpRequest, queryset: QuerySet) -> None:
        revoked = already = 0
        failures: list[str] = []
        for session in queryset:
            was_revoked = session.revoked_at is not None
            try:
                services.revoke_session(session)
            except (ValidationError, ObjectDoesNotExist) as exc:
                failures.append(f"{session.session_id}: {_error_text(exc)}")
                continue
            if was_revoked:
                already += 1
            else:
                revoked += 1
                self.log_change(request, session, "Revoked by an admin action.")
        summary = f"{revoked} {model_ngettext(self.opts, revoked)} revoked"
        if already:
            summary += f"; {already} already revoked"
        self.message_user(request, summary + ".", messages.SUCCESS)
        if failures:
            self.message_user(request, "Could not revoke: " + " | ".join(failures), messages.ERROR)


# --------------------------------------------------------------------------- documents, chunks


class MultipleFileInput(forms.ClearableFileInput):
    allow_multiple_selected = True


class MultipleFileField(forms.FileField):
    widget = MultipleFileInput

    def clean(self, data: Any, initial: Any = None) -> list:
        files = data if isinstance(data, list | tuple) else [data]
        cleaned = [super(MultipleFileField, self).clean(item, initial) for item in files if item]
        if not cleaned:
            raise ValidationError("Choose at least one file.")
        return cleaned


class DocumentUploadForm(forms.Form):
    knowledge_base = forms.ModelChoiceField(queryset=KnowledgeBase.objects.all())
    files = MultipleFileField(help_text="Files with the same name update the same document.")


def _ingest_uploads(kb: KnowledgeBase, files: list) -> list[tuple[str, str, str]]:
    """Load and upsert uploaded files; a file's name (without folders) is its source key."""
    outcomes = []
    with tempfile.TemporaryDirectory() as folder:
        for upload in files:
            name = Path(upload.name).name or "upload"
            target = Path(folder) / name
            with target.open("wb") as handle:
                for piece in upload.chunks():
                    handle.write(piece)
            try:
                loaded = load_file(target, source_key=name)
                result = upsert_document(kb, name, loaded.title, loaded.body, loaded.metadata)
            except (LoaderError, ValidationError) as exc:
                outcomes.append((name, "failed", _error_text(exc)))
                continue
            outcomes.append((name, result.outcome, result.error))
    return outcomes


@admin.register(Document)
class DocumentAdmin(admin.ModelAdmin):
    """Documents come from ingestion: the admin shows them and may delete them."""

    list_display = (
        "source_key",
        "title",
        "knowledge_base",
        "status",
        "revision",
        "chunk_count",
        "updated",
    )
    list_display_links = ("source_key", "title")
    Media = ListMedia
    list_filter = ("status", "knowledge_base")
    list_select_related = ("knowledge_base",)
    search_fields = ("source_key", "title", "=knowledge_base__slug")
    readonly_fields = (
        "knowledge_base",
        "source_key",
        "title",
        "status",
        "revision",
        "last_error",
        "content_hash",
        "chunk_count",
        "metadata_json",
        "body",
        "chunks",
        "created_at",
        "updated_at",
    )
    fieldsets = (
        (None, {"fields": ("knowledge_base", "source_key", "title")}),
        (
            "Indexing",
            {"fields": ("status", "revision", "last_error", "content_hash", "chunk_count")},
        ),
        ("Content", {"fields": ("metadata_json", "body")}),
        ("Chunks", {"fields": ("chunks",)}),
        ("History", {"fields": ("created_at", "updated_at")}),
    )
    show_full_result_count = False

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return (
            super()
            .get_queryset(request)
            .annotate(
                chunk_count=_count(Chunk.objects.all(), "document", revision=OuterRef("revision"))
            )
        )

    actions = ("reindex_documents",)
    change_list_template = "admin/bailing_knowledge/document/change_list.html"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_ingest_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("bailing_knowledge.add_document") and request.user.has_perm(
            "bailing_knowledge.change_document"
        )

    def get_urls(self) -> list:
        urls = super().get_urls()
        upload = path(
            "upload/",
            self.admin_site.admin_view(self.upload_view),
            name="bailing_knowledge_document_upload",
        )
        return [upload, *urls]

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> Any:
        extra_context = {**(extra_context or {}), "can_upload": self.has_ingest_permission(request)}
        return super().changelist_view(request, extra_context)

    def upload_view(self, request: HttpRequest) -> HttpResponse:
        """Upload files into a KB: each is loaded and upserted like `knowledge_ingest` does."""
        if not self.has_ingest_permission(request):
            raise PermissionDenied
        form = DocumentUploadForm(
            request.POST or None,
            request.FILES or None,
            initial={"knowledge_base": request.GET.get("knowledge_base")},
        )
        if request.method == "POST" and form.is_valid():
            kb = form.cleaned_data["knowledge_base"]
            outcomes = _ingest_uploads(kb, form.cleaned_data["files"])
            for name, _outcome, error in outcomes:
                if error:
                    self.message_user(request, f"{name}: {error}", messages.ERROR)
            counts = Counter(outcome for _, outcome, _ in outcomes)
            summary = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
            self.message_user(request, f"Uploaded into {kb.slug}: {summary}.", messages.INFO)
            return HttpResponseRedirect(reverse("admin:bailing_knowledge_document_changelist"))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Upload documents",
            "form": form,
            "supported": ", ".join(sorted(supported_suffixes())),
        }
        return TemplateResponse(request, "admin/bailing_knowledge/document/upload.html", context)

    @admin.action(description="Reindex selected documents", permissions=["ingest"])
    def reindex_documents(self, request: HttpRequest, queryset: QuerySet) -> None:
        counts: Counter[str] = Counter()
        for document in queryset.select_related("knowledge_base"):
            result = reindex_document(document)
            counts[result.outcome] += 1
            if result.error:
                self.message_user(request, f"{document.source_key}: {result.error}", messages.ERROR)
        summary = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
        self.message_user(request, f"Reindexed: {summary}.", messages.INFO)

    @admin.display(description="chunks", ordering="chunk_count")
    def chunk_count(self, obj: Document) -> int:
        return obj.chunk_count

    @admin.display(description="updated", ordering="updated_at")
    def updated(self, obj: Document) -> str:
        return _when(obj.updated_at)

    @admin.display(description="chunks of this revision")
    def chunks(self, obj: Document) -> str:
        return document_chunks(self.admin_site, obj)

    @admin.display(description="metadata")
    def metadata_json(self, obj: Document) -> str:
        return format_html("<pre>{}</pre>", json.dumps(obj.metadata, indent=2, sort_keys=True))


@admin.register(Chunk)
class ChunkAdmin(admin.ModelAdmin):
    """Chunks are cut and embedded by ingestion: read-only, embeddings never shown."""

    list_display = (
        "__str__",
        "document",
        "knowledge_base",
        "revision",
        "ordinal",
        "start",
        "end",
        "embedding_dimensions",
        "text_preview",
    )
    list_filter = ("knowledge_base", "embedding_dimensions")
    list_select_related = ("document", "knowledge_base")
    search_fields = ("document__source_key", "document__title", "=knowledge_base__slug")
    readonly_fields = (
        "document",
        "knowledge_base",
        "revision",
        "ordinal",
        "start",
        "end",
        "text_hash",
        "embedding_dimensions",
        "text",
    )
    fields = readonly_fields
    show_full_result_count = False

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).defer("embedding", "search_vector")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="text")
    def text_preview(self, obj: Chunk) -> str:
        return obj.text if len(obj.text) <= 80 else obj.text[:79] + "…"


# --------------------------------------------------------------------------- tasks, runs


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    list_display = ("task_id", "title", "state", "member_count", "run_count", "updated_at")
    list_display_links = ("task_id", "title")
    list_filter = ("state",)
    search_fields = ("=task_id", "title", "members__principal_id", "=members__session_id")
    filter_horizontal = ("members",)
    readonly_fields = ("task_id", "runs_link", "created_at", "updated_at")
    actions = ("pause_tasks", "resume_tasks", "cancel_tasks")

    def get_readonly_fields(self, request: HttpRequest, obj: Task | None = None) -> tuple:
        # State changes go through the actions, which enforce the allowed transitions.
        return (*self.readonly_fields, "state") if obj is not None else self.readonly_fields

    pause_tasks = toggle_action(
        "pause_tasks",
        "Pause selected tasks",
        service=set_task_state,
        attr="state",
        value=Task.State.PAUSED,
        label="paused",
    )
    resume_tasks = toggle_action(
        "resume_tasks",
        "Resume selected tasks",
        service=set_task_state,
        attr="state",
        value=Task.State.ACTIVE,
        label="active",
    )
    cancel_tasks = toggle_action(
        "cancel_tasks",
        "Cancel selected tasks",
        service=set_task_state,
        attr="state",
        value=Task.State.CANCELLED,
        label="cancelled",
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return (
            super()
            .get_queryset(request)
            .annotate(
                member_count=_count(Task.members.through.objects.all(), "task"),
                run_count=_count(Run.objects.all(), "task"),
            )
        )

    def get_fieldsets(self, request: HttpRequest, obj: Task | None = None) -> tuple:
        main = (None, {"fields": ("title", "state", "members")})
        if obj is None:
            return (main,)
        return (
            (None, {"fields": ("task_id", "title", "state", "members")}),
            ("Runs", {"fields": ("runs_link", "created_at", "updated_at")}),
        )

    def get_form(self, request: HttpRequest, obj: Task | None = None, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, **kwargs)
        members = form.base_fields.get("members")
        if members is not None:
            # Sessions are issued on their own page, never from a pop-up of this form.
            members.widget.can_add_related = False
        return form

    @admin.display(description="members", ordering="member_count")
    def member_count(self, obj: Task) -> int:
        return obj.member_count

    @admin.display(description="runs", ordering="run_count")
    def run_count(self, obj: Task) -> int:
        return obj.run_count

    @admin.display(description="runs")
    def runs_link(self, obj: Task) -> str:
        if obj.pk is None:
            return "-"
        return _changelist_link(
            self.admin_site, Run, f"task__id__exact={obj.pk}", f"{obj.run_count} run(s)"
        )


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    """Runs are written by the agent API: read-only here."""

    list_display = (
        "run_id",
        "state",
        "delivery_mode",
        "route",
        "client",
        "session",
        "task",
        "created_at",
        "completed_at",
    )
    list_filter = ("state", "delivery_mode", "route", "client")
    list_select_related = ("route", "client", "session", "task")
    search_fields = (
        "=run_id",
        "client_conversation_id",
        "client_turn_id",
        "user_message_id",
        "=session__session_id",
        "session__principal_id",
        "=task__task_id",
    )
    readonly_fields = (
        "run_id",
        "state",
        "delivery_mode",
        "session",
        "client",
        "route",
        "task",
        "client_conversation_id",
        "client_turn_id",
        "user_message_id",
        "request_hash",
        "completion_hash",
        "context_json",
        "completion_json",
        "created_at",
        "updated_at",
        "completed_at",
    )
    fieldsets = (
        (None, {"fields": ("run_id", "state", "delivery_mode")}),
        ("Owner", {"fields": ("session", "client", "route", "task")}),
        (
            "Turn",
            {
                "fields": (
                    "client_conversation_id",
                    "client_turn_id",
                    "user_message_id",
                    "request_hash",
                )
            },
        ),
        ("Context", {"fields": ("context_json",)}),
        ("Completion", {"fields": ("completion_hash", "completion_json", "completed_at")}),
        ("History", {"fields": ("created_at", "updated_at")}),
    )
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="context")
    def context_json(self, obj: Run) -> str:
        return format_html("<pre>{}</pre>", json.dumps(obj.context, indent=2, sort_keys=True))

    @admin.display(description="completion")
    def completion_json(self, obj: Run) -> str:
        if obj.completion is None:
            return "-"
        return format_html("<pre>{}</pre>", json.dumps(obj.completion, indent=2, sort_keys=True))
