"""`manage.py knowledge_base`: create, list, enable and disable knowledge bases.

Operators provision KBs from scripts and deploy pipelines, not only from the admin; this
command gives them the same validated path (`bailing_knowledge.services`) with `--json` output.
"""

from __future__ import annotations

import argparse
from typing import Any

from bailing_knowledge import services
from bailing_knowledge.management.base import ServiceCommand, knowledge_base_data
from bailing_knowledge.models import KnowledgeBase

COLUMNS = {
    "slug": "SLUG",
    "title": "TITLE",
    "enabled": "ENABLED",
    "embedder": "EMBEDDER",
    "tenant": "TENANT",
    "routes": "ROUTES",
}


class Command(ServiceCommand):
    help = "Create, list, enable and disable knowledge bases."

    field_options = {
        "title": "--title",
        "description": "--description",
        "embedder": "--embedder",
        "tenant": "--tenant",
    }

    def add_subcommands(self, subparsers: argparse._SubParsersAction) -> None:
        create = self.add_subcommand(subparsers, "create", "Create a knowledge base.")
        create.add_argument("slug", help="Unique slug (letters, digits, '-' and '_').")
        create.add_argument("--title", default="", help="Display title (default: the slug).")
        create.add_argument("--description", default="")
        create.add_argument(
            "--embedder",
            default="default",
            help="Alias of an embedder in BAILING_KNOWLEDGE['EMBEDDERS'] (default: 'default').",
        )
        create.add_argument(
            "--tenant", default="", help="Only principals of this tenant see the KB."
        )
        create.add_argument("--disabled", action="store_true", help="Create it disabled.")

        self.add_subcommand(subparsers, "list", "List knowledge bases.")

        for name, verb in (("enable", "Enable"), ("disable", "Disable")):
            toggle = self.add_subcommand(subparsers, name, f"{verb} a knowledge base.")
            toggle.add_argument("slug")

    def handle_create(self, **options: Any) -> None:
        kb = services.create_knowledge_base(
            options["slug"],
            title=options["title"],
            description=options["description"],
            embedder=options["embedder"],
            tenant=options["tenant"],
            enabled=not options["disabled"],
        )
        self.write_record(options, knowledge_base_data(kb), f"Created knowledge base {kb.slug}.")

    def handle_list(self, **options: Any) -> None:
        kbs = KnowledgeBase.objects.prefetch_related("routes")
        items = [knowledge_base_data(kb) for kb in kbs]
        self.write_list(options, items, COLUMNS, "No knowledge bases.")

    def handle_enable(self, **options: Any) -> None:
        self._set_enabled(options, True)

    def handle_disable(self, **options: Any) -> None:
        self._set_enabled(options, False)

    def _set_enabled(self, options: dict[str, Any], enabled: bool) -> None:
        kb = services.set_knowledge_base_enabled(options["slug"], enabled)
        state = "enabled" if enabled else "disabled"
        self.write_record(options, knowledge_base_data(kb), f"Knowledge base {kb.slug} {state}.")
