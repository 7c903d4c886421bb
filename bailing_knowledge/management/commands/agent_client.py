"""`manage.py agent_client`: register agent applications and the routes they may use.

A client's allowed routes bound every session issued to it, and disabling a client locks out
all of its sessions at once; both are operator decisions that belong in scripts as much as in
the admin, so this command exposes them through `bailing_knowledge.services`.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import CommandError

from bailing_knowledge import services
from bailing_knowledge.management.base import ServiceCommand, client_data
from bailing_knowledge.models import Client

COLUMNS = {
    "app_id": "APP_ID",
    "name": "NAME",
    "enabled": "ENABLED",
    "allowed_routes": "ROUTES",
}


class Command(ServiceCommand):
    help = "Create, list, update, enable and disable agent clients."

    field_options = {"app_id": "APP_ID", "name": "--name"}

    def add_subcommands(self, subparsers: argparse._SubParsersAction) -> None:
        create = self.add_subcommand(subparsers, "create", "Register an agent client.")
        create.add_argument(
            "app_id",
            metavar="APP_ID",
            help="Unique public id of the agent application.",
        )
        create.add_argument("--name", default="", help="Display name (default: the app id).")
        create.add_argument(
            "--route",
            action="append",
            metavar="KEY",
            default=[],
            help="A route the client may use; repeat for several.",
        )
        create.add_argument("--disabled", action="store_true", help="Create it disabled.")

        self.add_subcommand(subparsers, "list", "List agent clients.")

        update = self.add_subcommand(
            subparsers, "update", "Change a client; options left out keep their value."
        )
        update.add_argument("app_id", metavar="APP_ID")
        update.add_argument("--name", help="Display name (default: unchanged).")
        update.add_argument(
            "--route",
            action="append",
            metavar="KEY",
            help="A route the client may use; repeat for several. Replaces the allowed routes.",
        )
        update.add_argument("--no-routes", action="store_true", help="Remove every allowed route.")

        for name, verb in (("enable", "Enable"), ("disable", "Disable")):
            toggle = self.add_subcommand(subparsers, name, f"{verb} an agent client.")
            toggle.add_argument("app_id", metavar="APP_ID")

    def handle_create(self, **options: Any) -> None:
        client = services.create_client(
            options["app_id"],
            name=options["name"],
            routes=options["route"],
            enabled=not options["disabled"],
        )
        self.write_record(options, client_data(client), f"Created agent client {client.app_id}.")

    def handle_list(self, **options: Any) -> None:
        clients = Client.objects.prefetch_related("allowed_routes")
        items = [client_data(client) for client in clients]
        self.write_list(options, items, COLUMNS, "No agent clients.")

    def handle_update(self, **options: Any) -> None:
        if options["route"] is not None and options["no_routes"]:
            raise CommandError("--route and --no-routes cannot be combined.")
        routes = [] if options["no_routes"] else options["route"]
        if options["name"] is None and routes is None:
            raise CommandError("Nothing to update: give --name, --route or --no-routes.")
        client = services.update_client(options["app_id"], name=options["name"], routes=routes)
        self.write_record(options, client_data(client), f"Updated agent client {client.app_id}.")

    def handle_enable(self, **options: Any) -> None:
        self._set_enabled(options, True)

    def handle_disable(self, **options: Any) -> None:
        self._set_enabled(options, False)

    def _set_enabled(self, options: dict[str, Any], enabled: bool) -> None:
        client = services.set_client_enabled(options["app_id"], enabled)
        state = "enabled" if enabled else "disabled"
        self.write_record(options, client_data(client), f"Agent client {client.app_id} {state}.")
