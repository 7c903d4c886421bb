"""Tasks, which group agent work an admin manages, and the runs agents record.

A task's state changes only through its actions (`services.tasks.set_task_state`), which
allow only the valid transitions; runs are read-only.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from ..models import Run, Task
from ..services.tasks import set_task_state
from .actions import toggle_action
from .display import OwnerAdmin, ReadOnlyAdmin, changelist_link, count_of


class TaskAdmin(OwnerAdmin):
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
                member_count=count_of(Task.members.through.objects.all(), "task"),
                run_count=count_of(Run.objects.all(), "task"),
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
        return changelist_link(
            self.admin_site, Run, f"task__id__exact={obj.pk}", f"{obj.run_count} run(s)"
        )


class RunAdmin(ReadOnlyAdmin):
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

    @admin.display(description="context")
    def context_json(self, obj: Run) -> str:
        return format_html("<pre>{}</pre>", json.dumps(obj.context, indent=2, sort_keys=True))

    @admin.display(description="completion")
    def completion_json(self, obj: Run) -> str:
        if obj.completion is None:
            return "-"
        return format_html("<pre>{}</pre>", json.dumps(obj.completion, indent=2, sort_keys=True))
