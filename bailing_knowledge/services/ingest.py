"""Files into a knowledge base: the one load-and-upsert loop of the admin's upload and the CLI.

Each file is read by its loader and the documents go through `upsert_documents` together,
so an upload of many files gets the same batching (and the same speed) as `knowledge_ingest`.
A file that cannot be read or indexed is reported and does not stop the others.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..ingestion.documents import (
    DocumentInput,
    DocumentOutcome,
    delete_document,
    upsert_documents,
)
from ..ingestion.loaders import Discovered, LoaderError, load_file
from ..models import Document, KnowledgeBase
from .catalog import get_knowledge_base


@dataclass(frozen=True)
class FileOutcome:
    """What happened to one file: its document's outcome, with the reason in `error` when it
    failed."""

    path: Path
    name: str  # the document's source key
    outcome: DocumentOutcome
    error: str = ""
    chunks: int = 0


def ingest_paths(
    kb: KnowledgeBase | str, files: Iterable[tuple[Path, str] | tuple[Path, str, Path | None]]
) -> Iterator[FileOutcome]:
    """Load and upsert `(path, source_key)` pairs; yields one outcome per file, in input order.

    A third item, the directory the file was found under, keeps a symbolic link from
    reaching outside it (see `load_file`). Files are read lazily, as `upsert_documents` asks
    for the next batch, so only the batches in flight are held in memory. A file its loader
    rejects is `failed` with the loader's reason; it is reported in its place among the
    others.
    """
    kb = get_knowledge_base(kb)
    # Files read but not yet reported, in order, with their outcome once it is known: a
    # loader's failure at once, a loaded file's when `upsert_documents` yields it.
    waiting: deque[tuple[Path, str, FileOutcome | None]] = deque()

    def documents() -> Iterator[DocumentInput]:
        for path, key, *root in files:
            try:
                loaded = load_file(path, source_key=key, root=root[0] if root else None)
            except LoaderError as exc:
                failed = FileOutcome(path, key, DocumentOutcome.FAILED, exc.reason)
                waiting.append((path, key, failed))
                continue
            waiting.append((path, key, None))
            yield DocumentInput(key, loaded.title, loaded.body, loaded.metadata)

    def known() -> Iterator[FileOutcome]:
        while waiting and waiting[0][2] is not None:
            yield waiting.popleft()[2]

    for result in upsert_documents(kb, documents()):
        yield from known()
        path, key, _ = waiting.popleft()
        yield FileOutcome(path, key, result.outcome, result.error, result.chunks)
    yield from known()


def prune_documents(kb: KnowledgeBase | str, found: Iterable[Discovered]) -> Iterator[str]:
    """Delete the documents of `kb` that none of `found` keys, yielding each key (in sorted
    order) once its deletion is committed.

    What `knowledge_ingest --prune` runs after a pass over a tree, so that a file deleted or
    renamed there stops being searchable. Every file found counts, one that failed to load
    or has no loader included: it still exists. Each document goes in a transaction of its
    own, with its `document_deleted` signal, as `delete_document` does: stopped midway, what
    was yielded is deleted and what was not reached is kept, for a later prune to finish
    (one stopped while its signal's listeners ran is deleted without being yielded). One
    transaction for all would hold the knowledge base's write lock throughout, and lose the
    signals still to be sent should a listener be interrupted. A generator: nothing is
    deleted until it is iterated.
    """
    kb = get_knowledge_base(kb)
    keep = {item.source_key for item in found}
    stored = Document.objects.filter(knowledge_base=kb).values_list("source_key", flat=True)
    for key in sorted(key for key in stored.iterator() if key not in keep):
        if delete_document(kb, key):
            yield key
