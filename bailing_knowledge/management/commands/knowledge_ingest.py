"""`manage.py knowledge_ingest KB PATH...`: load files into a knowledge base.

A file's `source_key` is its path relative to the directory given (or its name when the file
itself is given), so ingesting a changed file again updates the same document and an
unchanged one is skipped. A file that fails does not stop the others; the command reports
each on one line and then exits with status 1, so a script or CI job notices. Unsupported
file types found in a directory are listed and skipped, which is not a failure; a file of
such a type named on the command line stops the command before anything is loaded.
Files go through the `ingest_paths` service, as the admin's uploads do: batched, with
embedding overlapping the writes.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured, ObjectDoesNotExist
from django.core.management.base import CommandError, CommandParser

from bailing_knowledge.ingestion.documents import DocumentOutcome
from bailing_knowledge.ingestion.loaders import (
    Discovered,
    discover,
    get_loader,
    supported_suffixes,
)
from bailing_knowledge.management.base import KnowledgeCommand
from bailing_knowledge.retrieval.embedders import get_embedder
from bailing_knowledge.services import get_knowledge_base
from bailing_knowledge.services.ingest import ingest_paths, prune_documents

OUTCOME_LABELS = {"created": "new", "updated": "updated", "unchanged": "unchanged"}
# The exit status when any file failed; an unknown knowledge base or path exits with 1 too,
# before anything is loaded.
FAILED_EXIT_STATUS = 1


class Command(KnowledgeCommand):
    help = "Load .txt, .md, .html and .pdf files (or directories of them) into a knowledge base."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("knowledge_base", metavar="KB", help="Slug of the knowledge base.")
        parser.add_argument(
            "paths",
            nargs="+",
            type=Path,
            metavar="PATH",
            help="Files or directories.",
        )
        parser.add_argument(
            "--prune",
            action="store_true",
            help="Afterwards, delete the knowledge base's documents that no file found here "
            "keys (deleted or renamed files). Directories only.",
        )
        parser.add_argument("--json", action="store_true", help="Print a JSON summary.")
        parser.add_argument(
            "--no-progress", action="store_true", help="Do not draw the progress line."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            kb = get_knowledge_base(options["knowledge_base"])
        except ObjectDoesNotExist as exc:
            raise CommandError(str(exc)) from exc
        try:  # an alias removed from the settings since the KB was made: before any work
            get_embedder(kb.embedder)
        except ImproperlyConfigured as exc:
            raise CommandError(f"Knowledge base {kb.slug}: {exc}") from exc
        missing = [in_line(p) for p in options["paths"] if not p.exists()]
        if missing:
            raise CommandError(f"No such file or directory: {', '.join(missing)}")
        special = [in_line(p) for p in options["paths"] if not (p.is_file() or p.is_dir())]
        if special:
            raise CommandError(f"Not a regular file or directory: {', '.join(special)}")
        # Named on purpose, unlike a directory's other files: skipping it would pass unseen.
        no_loader = [in_line(p) for p in options["paths"] if p.is_file() and get_loader(p) is None]
        if no_loader:
            suffixes = ", ".join(sorted(supported_suffixes()))
            raise CommandError(f"No loader for {', '.join(no_loader)} (supported: {suffixes}).")
        paths = _distinct(options["paths"])
        inside = _nested(paths)
        if inside:
            raise CommandError(
                f"{in_line(inside[0])} is inside {in_line(inside[1])}, also named: its files would "
                "be stored twice, under two source keys. Name only the outer directory."
            )
        if options["prune"] and not all(path.is_dir() for path in paths):
            named = ", ".join(in_line(path) for path in paths if not path.is_dir())
            raise CommandError(
                f"--prune takes directories only ({named} is a file): every document not "
                "found under the paths named is deleted."
            )
        started = time.monotonic()
        try:
            found = discover(paths)
        except OSError as exc:  # a directory that cannot be listed: its files would be missed
            where = in_line(exc.filename) if exc.filename is not None else "a directory"
            raise CommandError(
                f"Cannot list {where}: {exc.strerror or type(exc).__name__}."
            ) from exc
        clash = _shared_keys(found)
        if clash:
            raise CommandError(
                f"Two files would be the same document (source key {clash[0]!r}): "
                f"{in_line(clash[1])} and {in_line(clash[2])}. Keys are relative to the "
                "directory named; name a common parent directory instead."
            )
        if options["prune"] and not found:
            raise CommandError(
                f"No files under {', '.join(in_line(path) for path in paths)}: --prune would "
                "delete every document of the knowledge base (an empty or unmounted "
                "directory?). Nothing was changed."
            )
        counts: Counter[str] = Counter()
        failures: list[dict[str, str]] = []
        unsupported = [shown(item.path) for item in found if not item.supported]
        todo = [item for item in found if item.supported]
        progress = not options["no_progress"] and not options["json"] and sys.stderr.isatty()
        files = ((item.path, item.source_key, item.root) for item in todo)
        done = 0
        with _stopped_by_signal() as stopped:
            try:
                for done, result in enumerate(ingest_paths(kb, files), 1):
                    if result.outcome == DocumentOutcome.FAILED:
                        failures.append({"path": shown(result.path), "error": shown(result.error)})
                    counts[OUTCOME_LABELS.get(result.outcome, result.outcome)] += 1
                    counts["chunks"] += result.chunks
                    if progress:
                        self._progress(done, len(todo), in_line(result.name))
            except KeyboardInterrupt:
                if not stopped:  # Ctrl-C, not the SIGTERM handler
                    stopped.append(signal.SIGINT)
            if progress:
                sys.stderr.write("\n")
            # Pruning only after a whole pass: an interrupted one has not seen every file.
            pruned: list[str] = []
            pruning = options["prune"] and not stopped
            if pruning:
                try:
                    for key in prune_documents(kb, found):  # each deletion committed
                        pruned.append(key)
                except KeyboardInterrupt:
                    if not stopped:
                        stopped.append(signal.SIGINT)
        summary = {
            "knowledge_base": kb.slug,
            "new": counts["new"],
            "updated": counts["updated"],
            "unchanged": counts["unchanged"],
            "queued": counts["queued"],
            "failed": counts["failed"],
            "unsupported": len(unsupported),
            "chunks": counts["chunks"],
            "seconds": round(time.monotonic() - started, 3),
            "pruned": len(pruned),
            "interrupted": bool(stopped),
            "failures": failures,
            "unsupported_files": unsupported,
            "pruned_documents": [shown(key) for key in pruned],
        }
        if options["json"]:
            self.stdout.write(json.dumps(summary, indent=2, ensure_ascii=False))
        else:
            self._report(summary)
        if stopped:
            where = (
                f"while pruning, {len(pruned)} deleted so far"
                if pruning
                else f"after {done} of {len(todo)} files"
            )
            raise CommandError(
                f"Interrupted {where}; what was stored is kept. Run the command again to "
                "finish: unchanged files are skipped.",
                returncode=128 + stopped[-1],
            )
        if failures:
            raise CommandError(
                f"{len(failures)} of {len(todo)} files failed.", returncode=FAILED_EXIT_STATUS
            )

    def _progress(self, number: int, total: int, name: str) -> None:
        width = 30
        filled = width * number // max(total, 1)
        bar = "#" * filled + "-" * (width - filled)
        sys.stderr.write(f"\r[{bar}] {number}/{total} {name[:40]:<40}")
        sys.stderr.flush()

    def _report(self, summary: dict[str, Any]) -> None:
        self.stdout.write(
            "{new} new, {updated} updated, {unchanged} unchanged, {failed} failed, "
            "{unsupported} unsupported; {chunks} chunks in {seconds:.1f} s".format(**summary)
        )
        if summary["queued"]:
            self.stdout.write(f"{summary['queued']} queued for the task runner.")
        for key in summary["pruned_documents"]:
            self.stdout.write(f"pruned: {one_line(key)}")
        for failure in summary["failures"]:
            self.stderr.write(f"failed: {one_line(failure['path'])}: {one_line(failure['error'])}")
        for path in summary["unsupported_files"]:
            self.stderr.write(f"unsupported: {one_line(path)}")


@contextmanager
def _stopped_by_signal() -> Iterator[list[int]]:
    """Within: SIGTERM stops the pass as Ctrl-C does (KeyboardInterrupt, so the transaction
    under way rolls back and the summary is still printed). The list yielded gets the
    signal's number when one arrived."""
    stopped: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield stopped  # signal handlers can only be set from the main thread
        return

    def terminate(signum: int, frame: object) -> None:
        stopped.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield stopped
    finally:
        signal.signal(signal.SIGTERM, previous)


def _distinct(paths: list[Path]) -> list[Path]:
    """`paths` without repeats of one place (`docs` and `docs/../docs`): the first stays."""
    seen: set[Path] = set()
    distinct = []
    for path in paths:
        resolved = path.resolve()
        if resolved not in seen:
            seen.add(resolved)
            distinct.append(path)
    return distinct


def _nested(paths: list[Path]) -> tuple[Path, Path] | None:
    """The first path named that lies inside a directory also named, with that directory."""
    directories = [(path, path.resolve()) for path in paths if path.is_dir()]
    for path in paths:
        resolved = path.resolve()
        for directory, place in directories:
            if resolved != place and resolved.is_relative_to(place):
                return path, directory
    return None


def _shared_keys(found: list[Discovered]) -> tuple[str, Path, Path] | None:
    """The first source key two supported files share: the second would silently become a
    new revision of the first (`one/readme.md` and `two/readme.md` are both `readme.md`)."""
    first: dict[str, Path] = {}
    for item in found:
        if not item.supported:
            continue
        seen = first.setdefault(item.source_key, item.path)
        if seen != item.path:
            return item.source_key, seen, item.path
    return None


def shown(text: Path | str) -> str:
    """A path or message as text any output can carry. A file name that is not UTF-8
    (Latin-1 `café.md`, say) reaches Python with lone surrogates, which a UTF-8 stream
    refuses and JSON would pass on as invalid text: its bytes become `\\xe9` escapes."""
    text = str(text)
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no file name decodes to
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def in_line(text: Path | str) -> str:
    """A path or message for a line of text: `shown`, then `one_line`."""
    return one_line(shown(text))


def one_line(text: str) -> str:
    """`text` for a line of the report: a control character or line separator (a newline
    in a file name) as its escape (`\\n`), so that each line names one file. JSON output
    escapes them itself."""
    return _BREAKS.sub(lambda match: match.group().encode("unicode_escape").decode(), text)


_BREAKS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
