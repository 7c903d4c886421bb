"""`manage.py agent_task`: create managed tasks and steer them (pause, resume, cancel).

Tasks are controlled by operators only; agent tokens can bind a turn to a task but never
create or change one. A run bound to a task follows the task's state on its next call.
"""

from __future__ import annotations

import argparse
from typing import Any

from bailing_knowledge.management.base import ServiceCommand, task_data
from bailing_knowledge.models import Task
from bailing_knowledge.services import tasks

COLUMNS = {"task_id": "TASK_ID", "title": "TITLE", "state": "STATE", "members": "MEMBERS"}


class Command(ServiceCommand):
    help = "Create, list, pause, resume and cancel managed tasks, and manage their members."

    field_options = {"title": "TITLE", "state": "state"}

    def add_subcommands(self, subparsers: argparse._SubParsersAction) -> None:
        create = self.add_subcommand(subparsers, "create", "Create an active task.")
        create.add_argument("title", metavar="TITLE")
        create.add_argument(
            "--member", action="append", default=[], metavar="SESSION_ID", help="Repeatable."
        )
        listing = self.add_subcommand(subparsers, "list", "List tasks.")
        listing.add_argument("--state", choices=Task.State.values)
        for name, verb in (("pause", "Pause"), ("resume", "Resume"), ("cancel", "Cancel")):
            command = self.add_subcommand(subparsers, name, f"{verb} a task.")
            command.add_argument("task_id", metavar="TASK_ID")
        for name, verb in (("add-member", "Add"), ("remove-member", "Remove")):
            command = self.add_subcommand(subparsers, name, f"{verb} member sessions.")
            command.add_argument("task_id", metavar="TASK_ID")
            command.add_argument("session_ids", nargs="+", metavar="SESSION_ID")

    def handle_create(self, **options: Any) -> None:
        task = tasks.create_task(options["title"], members=options["member"])
        self.write_record(options, task_data(task), f"Created task {task.task_id}.")

    def handle_list(self, **options: Any) -> None:
        queryset = Task.objects.prefetch_related("members")
        if options["state"]:
            queryset = queryset.filter(state=options["state"])
        self.write_list(options, [task_data(t) for t in queryset], COLUMNS, "No tasks.")

    def _transition(self, options: dict[str, Any], state: str, done: str) -> None:
        task = tasks.set_task_state(options["task_id"], state)
        self.write_record(options, task_data(task), f"Task {task.task_id} {done}.")

    def handle_pause(self, **options: Any) -> None:
        self._transition(options, Task.State.PAUSED, "paused")

    def handle_resume(self, **options: Any) -> None:
        self._transition(options, Task.State.ACTIVE, "resumed")

    def handle_cancel(self, **options: Any) -> None:
        self._transition(options, Task.State.CANCELLED, "cancelled")

    def handle_add_member(self, **options: Any) -> None:
        task = tasks.add_task_members(options["task_id"], options["session_ids"])
        self.write_record(options, task_data(task), f"Task {task.task_id} updated.")

    def handle_remove_member(self, **options: Any) -> None:
        task = tasks.remove_task_members(options["task_id"], options["session_ids"])
        self.write_record(options, task_data(task), f"Task {task.task_id} updated.")
