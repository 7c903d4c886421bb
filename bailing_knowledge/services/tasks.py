"""Managed tasks: created and steered by admins (never by agent tokens).

A run bound to a task stays subject to it: every search and read made within the run checks
that the task is active and that the session is still one of its members.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

from django.core.exceptions import ValidationError
from django.db import transaction

from ..lookups import get_task, resolve_all
from ..models import AgentSession, Task

# Allowed state changes: a cancelled task stays cancelled.
TRANSITIONS = {
    Task.State.ACTIVE: {Task.State.PAUSED, Task.State.CANCELLED},
    Task.State.PAUSED: {Task.State.ACTIVE, Task.State.CANCELLED},
    Task.State.CANCELLED: set(),
}


def task_scope_hash(task: Task) -> str:
    """What a host's `task_binding.scope_hash` must match: the task and its members.

    It changes when the membership changes, so a host bound to an outdated scope is refused.
    """
    members = sorted(task.members.values_list("session_id", flat=True))
    canonical = json.dumps({"task": task.task_id, "members": members}, separators=(",", ":"))
    return "tsh_" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:32]


@transaction.atomic
def create_task(title: str, *, members: Iterable[AgentSession | str] = ()) -> Task:
    task = Task(title=title.strip())
    task.full_clean()
    task.save()
    task.members.set(resolve_all(AgentSession, "session_id", members))
    return task


@transaction.atomic
def set_task_state(task: Task | str, state: str) -> Task:
    """Pause, resume or cancel; the runs bound to the task follow on their next call."""
    task = Task.objects.select_for_update().get(pk=get_task(task).pk)
    if state not in Task.State.values:
        raise ValidationError({"state": f"Unknown task state {state!r}."})
    if state == task.state:
        return task
    if state not in TRANSITIONS[Task.State(task.state)]:
        raise ValidationError({"state": f"A {task.state} task cannot become {state}."})
    task.state = state
    task.save(update_fields=["state", "updated_at"])
    return task


def pause_task(task: Task | str) -> Task:
    return set_task_state(task, Task.State.PAUSED)


def resume_task(task: Task | str) -> Task:
    return set_task_state(task, Task.State.ACTIVE)


def cancel_task(task: Task | str) -> Task:
    return set_task_state(task, Task.State.CANCELLED)


@transaction.atomic
def add_task_members(task: Task | str, sessions: Iterable[AgentSession | str]) -> Task:
    task = get_task(task)
    task.members.add(*resolve_all(AgentSession, "session_id", sessions))
    return task


@transaction.atomic
def remove_task_members(task: Task | str, sessions: Iterable[AgentSession | str]) -> Task:
    task = get_task(task)
    task.members.remove(*resolve_all(AgentSession, "session_id", sessions))
    return task
