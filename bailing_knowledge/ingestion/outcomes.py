"""What ingesting one document came to: its `DocumentOutcome`, in an `UpsertResult`."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ..models import Document


class DocumentOutcome(StrEnum):
    """A document's fate; the values are the words the CLI's JSON and the signals carry."""

    CREATED = "created"
    UPDATED = "updated"
    UNCHANGED = "unchanged"
    QUEUED = "queued"
    FAILED = "failed"


#: The error of a document deleted while it was being indexed again.
GONE = "The document no longer exists."

# The outcomes that wrote a new revision with its chunks.
INDEXED = frozenset({DocumentOutcome.CREATED, DocumentOutcome.UPDATED})


@dataclass(frozen=True)
class UpsertResult:
    """What happened to one document: created, updated, unchanged, queued or failed."""

    outcome: DocumentOutcome
    document: Document | None = None
    chunks: int = 0
    error: str = ""
    source_key: str = ""
