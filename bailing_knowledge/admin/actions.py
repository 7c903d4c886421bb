"""Admin actions that switch a setting on many objects through a service.

The service applies its own rules to each object; the action only counts what changed,
records it in the object's history and tells the user what could not be done, and why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import model_ngettext
from django.core.exceptions import ObjectDoesNotExist, ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest


def error_text(exc: Exception) -> str:
    """A service's refusal as one line for a message: the messages, without field names."""
    if isinstance(exc, ValidationError):
        return "; ".join(exc.messages)
    return str(exc)


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
            failures.append(f"{obj}: {error_text(exc)}")
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
