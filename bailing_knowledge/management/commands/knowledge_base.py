"""`manage.py knowledge_base`: create, list, toggle knowledge bases; their language and index.

Operators provision KBs from scripts and deploy pipelines, not only from the admin; this
command gives them the same validated path (`bailing_knowledge.services`) with `--json` output.
"""

from __future__ import annotations

import argparse
from typing import Any

from bailing_knowledge import services
from bailing_knowledge.ingestion.lexicon import rebuild_lexical_index
from bailing_knowledge.management.base import ServiceCommand, knowledge_base_data
from bailing_knowledge.models import KnowledgeBase
from bailing_knowledge.retrieval.analysis import DEFAULT_LANGUAGE, LANGUAGES

COLUMNS = {
    "slug": "SLUG",
    "title": "TITLE",
    "enabled": "ENABLED",
    "embedder": "EMBEDDER",
    "language": "LANGUAGE",
    "tenant": "TENANT",
    "routes": "ROUTES",
}


class Command(ServiceCommand):
    help = "Create, list, enable and disable knowledge bases, and set their language."

    field_options = {
        "slug": "SLUG",
        "title": "--title",
        "description": "--description",
        "embedder": "--embedder",
        "language": "--language",
        "tenant": "--tenant",
    }
    subcommand_field_options = {"set-language": {"language": "CODE"}}

    def add_subcommands(self, subparsers: argparse._SubParsersAction) -> None:
        create = self.add_subcommand(subparsers, "create", "Create a knowledge base.")
        create.add_argument(
            "slug",
            metavar="SLUG",
            help="Unique slug (letters, digits, '-' and '_').",
        )
        create.add_argument("--title", default="", help="Display title (default: the slug).")
        create.add_argument("--description", default="")
        create.add_argument(
            "--embedder",
            default="default",
            help="Alias of an embedder in BAILING_KNOWLEDGE['EMBEDDERS'] (default: 'default').",
        )
        create.add_argument(
            "--language",
            default=DEFAULT_LANGUAGE,
            help=(
                "Language of the documents, for stemming and stopwords in lexical search "
                f"(default: {DEFAULT_LANGUAGE!r}; 'languages' lists the codes)."
            ),
        )
        create.add_argument(
            "--tenant", default="", help="Only principals of this tenant see the KB."
        )
        create.add_argument("--disabled", action="store_true", help="Create it disabled.")

        self.add_subcommand(subparsers, "list", "List knowledge bases.")

        for name, verb in (("enable", "Enable"), ("disable", "Disable")):
            toggle = self.add_subcommand(subparsers, name, f"{verb} a knowledge base.")
            toggle.add_argument("slug", metavar="SLUG")

        set_language = self.add_subcommand(
            subparsers,
            "set-language",
            "Change the language of a knowledge base and re-index its documents.",
        )
        set_language.add_argument("slug", metavar="SLUG")
        set_language.add_argument(
            "language",
            metavar="CODE",
            help="A language code ('languages' lists them).",
        )

        reindex = self.add_subcommand(
            subparsers,
            "reindex-lexical",
            "Re-analyse a knowledge base's chunks in its language and recount its statistics.",
        )
        reindex.add_argument("slug", metavar="SLUG")

        self.add_subcommand(subparsers, "languages", "List the language codes a KB may use.")

    def handle_create(self, **options: Any) -> None:
        kb = services.create_knowledge_base(
            options["slug"],
            title=options["title"],
            description=options["description"],
            embedder=options["embedder"],
            tenant=options["tenant"],
            enabled=not options["disabled"],
            language=options["language"],
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

    def handle_set_language(self, **options: Any) -> None:
        before = services.get_knowledge_base(options["slug"]).language
        kb = services.set_knowledge_base_language(options["slug"], options["language"])
        if kb.language == before:
            done = f"Knowledge base {kb.slug} already uses the language {kb.language!r}."
        else:
            done = (
                f"Knowledge base {kb.slug} now uses the language {kb.language!r}; "
                "its documents are re-indexed."
            )
        self.write_record(options, knowledge_base_data(kb), done)

    def handle_reindex_lexical(self, **options: Any) -> None:
        kb = services.get_knowledge_base(options["slug"])
        chunks = rebuild_lexical_index(kb)
        data = {**knowledge_base_data(kb), "chunks": chunks}
        self.write_record(
            options, data, f"Re-indexed the lexical terms of {chunks} chunks of {kb.slug}."
        )

    def handle_languages(self, **options: Any) -> None:
        items = [{"code": code, "label": label} for code, label in LANGUAGES.items()]
        self.write_list(options, items, {"code": "CODE", "label": "LANGUAGE"}, "No languages.")
