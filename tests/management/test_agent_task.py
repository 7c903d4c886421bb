"""`agent_task`: create, list, pause, resume, cancel and membership."""

from __future__ import annotations

import pytest
from django.core.management.base import CommandError

from bailing_knowledge.models import Task

from . import run, run_json

pytestmark = pytest.mark.django_db


def test_task_lifecycle(issued):
    session_id = issued.session.session_id
    created = run_json("agent_task", "create", "Quarter close", "--member", session_id)
    task_id = created["task_id"]
    assert (created["state"], created["members"]) == ("active", [session_id])
    assert created["scope_hash"].startswith("tsh_")
    assert run_json("agent_task", "pause", task_id)["state"] == "paused"
    assert run_json("agent_task", "resume", task_id)["state"] == "active"
    removed = run_json("agent_task", "remove-member", task_id, session_id)
    assert removed["members"] == []
    assert removed["scope_hash"] != created["scope_hash"]
    assert run_json("agent_task", "add-member", task_id, session_id)["members"] == [session_id]
    assert run_json("agent_task", "cancel", task_id)["state"] == "cancelled"
    assert [t["task_id"] for t in run_json("agent_task", "list", "--state", "cancelled")] == [
        task_id
    ]
    assert "Quarter close" in run("agent_task", "list")


def test_bad_input(issued):
    with pytest.raises(CommandError):
        run("agent_task", "create", "T", "--member", "ses_missing")
    with pytest.raises(CommandError):
        run("agent_task", "pause", "task_missing")
    with pytest.raises(CommandError):
        run("agent_task", "create", "   ")
    task_id = run_json("agent_task", "create", "T")["task_id"]
    run("agent_task", "cancel", task_id)
    with pytest.raises(CommandError, match="cancelled task cannot become active"):
        run("agent_task", "resume", task_id)
    assert Task.objects.get(task_id=task_id).state == "cancelled"
    assert not Task.objects.filter(title="").exists()
