"""Routes: the workspaces agents call, their knowledge bases and search settings.

The route's change list also serves the retrieval playground (`playground.py`).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from .. import services
from ..models import Client, Route
from .actions import toggle_action
from .display import ListMedia, OwnerAdmin, count_of
from .playground import playground_urls


class RouteAdmin(OwnerAdmin):
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
                knowledge_base_count=count_of(Route.knowledge_bases.through.objects.all(), "route"),
                client_count=count_of(Client.allowed_routes.through.objects.all(), "route"),
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
