"""Agent clients and the sessions issued to them.

A session is issued by the add page through `services.issue_session`; its raw token is
shown once, on the page that answers the form, and never stored.
"""

from __future__ import annotations

from collections.abc import Iterable

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import model_ngettext
from django.core.exceptions import ObjectDoesNotExist, ValidationError
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.cache import add_never_cache_headers
from django.utils.html import format_html

from .. import services
from ..models import AgentSession, Client
from .actions import error_text, toggle_action
from .display import ListMedia, OwnerAdmin, changelist_link, count_of, short_time
from .forms import IssueSessionForm


class ClientAdmin(OwnerAdmin):
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
                route_count=count_of(Client.allowed_routes.through.objects.all(), "client"),
                active_session_count=count_of(AgentSession.objects.active(Now()), "client"),
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
            changelist_link(
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


class AgentSessionAdmin(OwnerAdmin):
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
        warning = form.issued.refused_routes_warning()
        if warning is not None:
            self.message_user(request, warning, messages.WARNING)

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
        return short_time(obj.expires_at)

    @admin.display(description="last used", ordering="last_seen_at")
    def last_seen(self, obj: AgentSession) -> str:
        return short_time(obj.last_seen_at)

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
                failures.append(f"{session.session_id}: {error_text(exc)}")
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
