"""The request body parser of the agent API: JSON that PostgreSQL and the hashes can take.

A body is refused here, before any row is written, when it is too large, nested too deeply,
not UTF-8, not JSON, or carries what cannot be stored or hashed: a NUL character, a lone
surrogate (a `\\ud800` escape without its pair) or a number too large for a float. Left
for later, those failed deep inside a turn (a 500, or a 503 that no retry could cure).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from django.core.exceptions import RequestDataTooBig
from rest_framework.parsers import BaseParser

from .conf import knowledge_settings
from .exceptions import InvalidRequest

# NUL cannot be stored in a PostgreSQL text or jsonb value; a lone surrogate cannot be
# encoded as UTF-8 at all.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


class _NotJSON(ValueError):
    """What Python's `json` accepts and JSON does not: `NaN`, `Infinity`, `-Infinity`."""


def _reject_constant(name: str) -> None:
    raise _NotJSON(f"{name} is not a JSON number")


def check_json_value(data: Any, max_depth: int) -> str | None:
    """Why `data` cannot be accepted, or None; iterative, so any depth is safe to check."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if _UNSTORABLE.search(value):
                return "The request body contains a NUL character or invalid Unicode."
        elif isinstance(value, float):
            if not math.isfinite(value):
                return "The request body contains a number out of range."
        elif isinstance(value, dict | list):
            if depth > max_depth:
                return f"The request body is nested more than {max_depth} levels deep."
            if isinstance(value, dict):
                stack.extend((key, depth) for key in value)
                stack.extend((item, depth + 1) for item in value.values())
            else:
                stack.extend((item, depth + 1) for item in value)
    return None


class AgentJSONParser(BaseParser):
    """Strict JSON with bounded size and depth; every refusal is a 400 `invalid_request`.

    Not a `JSONParser` subclass on purpose: DRF reads `request.body` whole for those, before
    the parser could look at the size, and Django then fails the request with a 500.
    """

    media_type = "application/json"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        limit = int(knowledge_settings.MAX_BODY_BYTES)
        too_large = InvalidRequest(f"The request body is larger than {limit} bytes.")
        request = (parser_context or {}).get("request")
        meta = getattr(request, "META", {})
        try:
            declared = int(meta.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > limit:
            raise too_large
        try:
            raw = stream.read(limit + 1) if stream is not None else b""
        except RequestDataTooBig:
            raise too_large from None
        if len(raw) > limit:
            raise too_large
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequest("The request body is not valid UTF-8.") from None
        try:
            data = json.loads(text, parse_constant=_reject_constant)
        except RecursionError:
            raise InvalidRequest("The request body is nested too deeply.") from None
        except _NotJSON as exc:
            raise InvalidRequest(f"The request body is not valid JSON: {exc}.") from None
        except ValueError:
            raise InvalidRequest("The request body is not valid JSON.") from None
        problem = check_json_value(data, int(knowledge_settings.MAX_JSON_DEPTH))
        if problem:
            raise InvalidRequest(problem)
        return data
