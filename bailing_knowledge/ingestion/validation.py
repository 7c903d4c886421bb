"""Input cleaning: a document as given becomes a `CleanDocument`, or a `ValidationError`.

Everything after this step (preparation, storage) may trust its input: strings that
PostgreSQL can store, sizes within the columns, metadata that is JSON with well-formed
visibility keys, and the content hash that decides whether anything needs indexing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError

from ..models import Document, content_hash
from ..retrieval.visibility import VISIBILITY_KEYS
from .loaders import storable_text

SOURCE_KEY_MAX = Document._meta.get_field("source_key").max_length
TITLE_MAX = Document._meta.get_field("title").max_length


@dataclass(frozen=True)
class DocumentInput:
    """One document for `upsert_documents`: the arguments of `upsert_document`."""

    source_key: str
    title: str
    body: str
    metadata: dict[str, Any] | None = None


@dataclass(frozen=True)
class CleanDocument:
    """A validated document, normalised for storage, with the hash of its content."""

    source_key: str
    title: str
    body: str
    metadata: dict[str, Any]
    digest: str


def clean_document(
    source_key: str, title: str, body: str, metadata: dict[str, Any] | None = None
) -> CleanDocument:
    """Normalise and validate one document; bad input raises `ValidationError`."""
    wrong = [
        name
        for name, value in (("source_key", source_key), ("title", title), ("body", body))
        if not isinstance(value, str)
    ]
    if wrong:
        raise ValidationError({name: "Must be a string." for name in wrong})
    if storable_text(source_key) != source_key:
        raise ValidationError({"source_key": "Must not contain NUL or unpaired surrogates."})
    title, body = storable_text(title).strip(), storable_text(body)
    metadata = {} if metadata is None else metadata
    _validate(source_key, title, body, metadata)
    return CleanDocument(source_key, title, body, metadata, content_hash(title, body))


def _validate(source_key: str, title: str, body: str, metadata: dict[str, Any]) -> None:
    errors: dict[str, str] = {}
    if not source_key or len(source_key) > SOURCE_KEY_MAX:
        errors["source_key"] = f"Must be 1 to {SOURCE_KEY_MAX} characters."
    if not title.strip() or len(title) > TITLE_MAX:
        errors["title"] = f"Must be 1 to {TITLE_MAX} characters."
    if not body.strip():
        errors["body"] = "The document has no text."
    if not isinstance(metadata, dict):
        errors["metadata"] = "Must be a JSON object."
    elif not _is_json(metadata):
        errors["metadata"] = (
            "Must be JSON: strings, finite numbers, booleans, null, lists, objects."
        )
    elif not _storable_strings(metadata):
        errors["metadata"] = "Must not contain NUL or unpaired surrogates in keys or strings."
    else:
        for key in VISIBILITY_KEYS:
            value = metadata.get(key)
            if value is not None and (
                not isinstance(value, list) or not all(isinstance(v, str) and v for v in value)
            ):
                errors["metadata"] = f"metadata[{key!r}] must be a list of non-empty strings."
    if errors:
        raise ValidationError(errors)


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def _storable_strings(value: Any) -> bool:
    """Whether every key and string in JSON `value` can go into a jsonb column (no NUL, no
    lone surrogate); iterative, so any depth is safe."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if storable_text(item) != item:
                return False
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return True


def validation_message(exc: ValidationError) -> str:
    """One line for a log, a summary or the admin: `field: message; ...`."""
    if hasattr(exc, "error_dict"):
        return "; ".join(
            f"{name}: {message}"
            for name, messages in exc.message_dict.items()
            for message in messages
        )
    return "; ".join(exc.messages)
