"""`manage.py knowledge_route`: create, list and update routes (agent workspaces).

A route decides which knowledge bases an agent may search and how; operators script those
settings, so every change goes through `bailing_knowledge.services` and the output reports the
route's `knowledge_scope_revision`, the hash that tells whether the knowledge scope changed.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import CommandError, CommandParser

from bailing_knowledge import services
from bailing_knowledge.management.base import ServiceCommand, finite_float, on_off, route_data
from bailing_knowledge.models import KnowledgeMode, Route

COLUMNS = {
    "route_key": "ROUTE_KEY",
    "name": "NAME",
    "enabled": "ENABLED",
    "agent_client_enabled": "AGENT_CLIENT",
    "knowledge_enabled": "KNOWLEDGE",
    "knowledge_bases": "KBS",
    "allowed_audiences": "AUDIENCES",
    "top_k": "TOP_K",
    "min_score": "MIN_SCORE",
    "max_docs": "MAX_DOCS",
    "knowledge_mode": "MODE",
}

# Option dest -> keyword argument of `create_route` and `update_route`.
SETTINGS = {
    "name": "name",
    "agent_client": "agent_client_enabled",
    "knowledge": "knowledge_enabled",
    "top_k": "top_k",
    "min_score": "min_score",
    "max_docs": "max_docs",
    "mode": "knowledge_mode",
}


def _given_settings(options: dict[str, Any]) -> dict[str, Any]:
    """The route settings given on the command line, as `create_route`/`update_route` kwargs."""
    return {
        field: options[option] for option, field in SETTINGS.items() if options[option] is not None
    }


def _add_settings(parser: CommandParser, *, update: bool) -> None:
    """The options `create` and `update` share; on `update` an option left out keeps its value."""

    def default(value: str) -> str:
        return " (default: unchanged)." if update else f" (default: {value})."

    parser.add_argument("--name", help="Display name" + default("the route key"))
    parser.add_argument(
        "--kb",
        action="append",
        metavar="SLUG",
        help="A knowledge base to bind; repeat for several"
        + ("; replaces the bound set." if update else "."),
    )
    parser.add_argument(
        "--audience",
        action="append",
        metavar="AUDIENCE",
        help="A principal audience admitted to the route; repeat for several"
        + ("; replaces the list." if update else ". Without any, every audience is admitted."),
    )
    parser.add_argument(
        "--agent-client",
        type=on_off,
        metavar="on|off",
        help="The route's Agent Client runtime switch" + default("on"),
    )
    parser.add_argument(
        "--knowledge",
        type=on_off,
        metavar="on|off",
        help="Whether agents get knowledge on this route" + default("on"),
    )
    parser.add_argument("--top-k", type=int, help="Chunks retrieved, 1-50" + default("5"))
    parser.add_argument(
        "--min-score", type=finite_float, help="Lowest score kept, 0.0-1.0" + default("0.0")
    )
    parser.add_argument("--max-docs", type=int, help="Documents used, 1-20" + default("3"))
    parser.add_argument(
        "--mode", choices=KnowledgeMode.values, help="Knowledge mode" + default("chunk")
    )


class Command(ServiceCommand):
    help = "Create, list and update routes and the knowledge bases bound to them."

    field_options = {
        "route_key": "ROUTE_KEY",
        "name": "--name",
        "allowed_audiences": "--audience",
        "top_k": "--top-k",
        "min_score": "--min-score",
        "max_docs": "--max-docs",
        "knowledge_mode": "--mode",
    }

    def add_subcommands(self, subparsers: argparse._SubParsersAction) -> None:
        create = self.add_subcommand(subparsers, "create", "Create a route.")
        create.add_argument(
            "route_key",
            metavar="ROUTE_KEY",
            help="Unique key agents address the route by.",
        )
        _add_settings(create, update=False)
        create.add_argument("--disabled", action="store_true", help="Create the route disabled.")

        self.add_subcommand(subparsers, "list", "List routes with their knowledge settings.")

        update = self.add_subcommand(
            subparsers, "update", "Change a route; options left out keep their value."
        )
        update.add_argument("route_key", metavar="ROUTE_KEY")
        _add_settings(update, update=True)
        update.add_argument(
            "--add-kb",
            action="append",
            metavar="SLUG",
            default=[],
            help="Bind one more knowledge base; repeat for several.",
        )
        update.add_argument(
            "--remove-kb",
            action="append",
            metavar="SLUG",
            default=[],
            help="Unbind a knowledge base; repeat for several.",
        )
        update.add_argument("--no-kbs", action="store_true", help="Unbind every knowledge base.")
        update.add_argument(
            "--no-audiences", action="store_true", help="Clear the list: admit every audience."
        )
        state = update.add_mutually_exclusive_group()
        state.add_argument(
            "--enable", dest="enabled", action="store_true", default=None, help="Enable the route."
        )
        state.add_argument(
            "--disable", dest="enabled", action="store_false", help="Disable the route."
        )

    def handle_create(self, **options: Any) -> None:
        settings = _given_settings(options)
        route = services.create_route(
            options["route_key"],
            knowledge_bases=options["kb"] or (),
            audiences=options["audience"] or (),
            enabled=not options["disabled"],
            **settings,
        )
        self.write_record(options, route_data(route), f"Created route {route.route_key}.")

    def handle_list(self, **options: Any) -> None:
        routes = Route.objects.prefetch_related("knowledge_bases")
        items = [route_data(route) for route in routes]
        self.write_list(options, items, COLUMNS, "No routes.")

    def handle_update(self, **options: Any) -> None:
        if options["kb"] is not None and options["no_kbs"]:
            raise CommandError("--kb and --no-kbs cannot be combined.")
        if options["audience"] is not None and options["no_audiences"]:
            raise CommandError("--audience and --no-audiences cannot be combined.")
        changes = _given_settings(options)
        if options["enabled"] is not None:
            changes["enabled"] = options["enabled"]
        if options["kb"] is not None or options["no_kbs"]:
            changes["knowledge_bases"] = options["kb"] or []
        if options["audience"] is not None or options["no_audiences"]:
            changes["audiences"] = options["audience"] or []
        if options["add_kb"]:
            changes["add_knowledge_bases"] = options["add_kb"]
        if options["remove_kb"]:
            changes["remove_knowledge_bases"] = options["remove_kb"]
        if not changes:
            raise CommandError("Nothing to update: give at least one option to change.")
        route = services.update_route(options["route_key"], **changes)
        self.write_record(options, route_data(route), f"Updated route {route.route_key}.")
