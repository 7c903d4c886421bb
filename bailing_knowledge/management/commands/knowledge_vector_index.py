"""`manage.py knowledge_vector_index`: an HNSW index for the vector size of every embedder.

The vector leg finds the nearest chunks through a partial HNSW index per vector size; without
one, the knowledge bases of that size are searched by a full scan. The migrations index the
shipped sizes (256 and 384); this command indexes the sizes of the configured embedders, or
the ones given, and does nothing for a size that already has a usable index. Run it after
adding an embedder of another size, from a deploy script: it is idempotent.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections

from bailing_knowledge.conf import knowledge_settings
from bailing_knowledge.database import (
    HNSW_MAX_DIMENSIONS,
    ensure_vector_index,
    vector_index_name,
    vector_index_state,
)
from bailing_knowledge.management.base import KnowledgeCommand
from bailing_knowledge.retrieval.embedders import EmbedderError, get_embedder

ACTIONS = {
    "ok": "already indexed",
    "missing": "created",
    "invalid": "rebuilt (an earlier build had failed)",
    "other": "rebuilt (the index of that name did not match the search)",
}


class Command(KnowledgeCommand):
    help = "Create the HNSW index for each configured embedder's vector size (idempotent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dimensions",
            type=int,
            action="append",
            metavar="N",
            help="A vector size to index (repeatable); default: the configured embedders' sizes.",
        )
        parser.add_argument(
            "--check",
            action="store_true",
            help="Change nothing; exit with an error if a size has no usable index.",
        )
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS, choices=tuple(connections))
        parser.add_argument("--json", action="store_true", help="Print a JSON summary.")

    def handle(self, *args: Any, **options: Any) -> None:
        connection = connections[options["database"]]
        if connection.in_atomic_block:
            raise CommandError("Indexes are built concurrently: run outside a transaction.")
        wide: list[int] = []
        if options["dimensions"]:
            sizes = options["dimensions"]
            for size in sizes:
                if not 1 <= size <= HNSW_MAX_DIMENSIONS:
                    raise CommandError(
                        f"--dimensions: HNSW indexes take 1 to {HNSW_MAX_DIMENSIONS} "
                        f"dimensions, not {size}."
                    )
        else:
            # An embedder wider than HNSW allows is searched by a full scan, as documented:
            # nothing to build for it, and nothing this command could fix.
            configured = self.configured_sizes()
            sizes = [size for size in configured if size <= HNSW_MAX_DIMENSIONS]
            wide = sorted({size for size in configured if size > HNSW_MAX_DIMENSIONS})
        report: list[dict[str, Any]] = []
        for size in wide:
            report.append({"dimensions": size, "index": None, "found": "too_wide"})
            if options["verbosity"] and not options["json"]:
                self.stdout.write(
                    f"{size} dimensions: no index (HNSW takes at most {HNSW_MAX_DIMENSIONS}); "
                    "searched by a full scan"
                )
        for size in sorted(set(sizes)):
            if options["check"]:
                state = vector_index_state(connection, size)
            else:
                if options["verbosity"] and not options["json"]:
                    self.stdout.write(f"{vector_index_name(size)}: ", ending="")
                    self.stdout.flush()
                state = ensure_vector_index(connection, size)
            report.append({"dimensions": size, "index": vector_index_name(size), "found": state})
            if options["verbosity"] and not options["json"]:
                if options["check"]:
                    self.stdout.write(f"{vector_index_name(size)}: {state}")
                else:
                    self.stdout.write(ACTIONS[state])
        if options["json"]:
            self.stdout.write(json.dumps(report))
        unusable = [item["index"] for item in report if item["found"] not in ("ok", "too_wide")]
        if options["check"] and unusable:
            raise CommandError(
                f"No usable HNSW index: {', '.join(unusable)}. Run `manage.py "
                "knowledge_vector_index` to create it."
            )

    def configured_sizes(self) -> list[int]:
        """The vector size of each configured embedder (built, so a model may load)."""
        sizes = []
        for alias in sorted(knowledge_settings.EMBEDDERS):
            try:
                sizes.append(int(get_embedder(alias).dimensions))
            except (ImproperlyConfigured, EmbedderError) as exc:
                raise CommandError(str(exc)) from exc
        return sizes
