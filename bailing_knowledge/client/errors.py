"""Exceptions of the host-side client, one per family of protocol error codes.

Hosts branch on the class (or on `code`, the wire code the server sent) rather than on HTTP
statuses: the same status carries different meanings (409 is a stale run, a changed scope or
a changed document), and the protocol promises the codes, not the statuses. Everything here is
plain Python so that the client imports without Django.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "Conflict",
    "IdempotencyConflict",
    "InvalidRequest",
    "KnowledgeChanged",
    "KnowledgeError",
    "MethodNotAllowed",
    "NotFound",
    "ProtocolError",
    "RateLimited",
    "ReferenceExpired",
    "ReferenceInvalid",
    "ReferenceRejected",
    "RouteNotAllowed",
    "RunNotCurrent",
    "ScopeChanged",
    "ServerError",
    "StaleTurn",
    "Unauthorized",
    "Unavailable",
    "Unreachable",
    "error_from_response",
    "parse_retry_after",
]


class KnowledgeError(Exception):
    """An answer of the knowledge API that is not the success the caller asked for.

    `code` is the protocol's error code (`unauthorized`, `knowledge_changed`, ...), or
    `http_<status>` when an error status came without the protocol's JSON envelope (a proxy
    page, an old server), or `protocol_error` for answers the client cannot trust.
    `status` is the HTTP status (0 when there was no HTTP answer to speak of). `reason` is
    the server's human sentence: safe to log and to show, never parsed.
    """

    default_code = "knowledge_error"
    default_status = 0

    def __init__(
        self,
        code: str | None = None,
        status: int | None = None,
        reason: str = "",
        *,
        retry_after: float | None = None,
    ) -> None:
        self.code = code or self.default_code
        self.status = self.default_status if status is None else status
        self.reason = reason
        self.retry_after = retry_after
        super().__init__(f"{self.code} (HTTP {self.status}): {reason}" if reason else self.code)

    def to_dict(self) -> dict[str, Any]:
        """The error as a tool result: what a model needs to decide its next step."""
        result: dict[str, Any] = {"error": self.code, "reason": self.reason}
        if self.retry_after is not None:
            result["retry_after"] = self.retry_after
        return result


class InvalidRequest(KnowledgeError):
    """400 `invalid_request`: the request itself is wrong (a bug in the caller, or a bad
    model-chosen argument); `fields` names the offending fields when the server said so."""

    default_code = "invalid_request"
    default_status = 400

    def __init__(
        self,
        code: str | None = None,
        status: int | None = None,
        reason: str = "",
        *,
        retry_after: float | None = None,
        fields: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(code, status, reason, retry_after=retry_after)
        self.fields = dict(fields or {})

    def to_dict(self) -> dict[str, Any]:
        result = super().to_dict()
        if self.fields:
            result["fields"] = self.fields
        return result


class Unauthorized(KnowledgeError):
    """401 `unauthorized`: the token is missing, unknown, expired or revoked, or the agent
    client is disabled. Retrying with the same token will not help."""

    default_code = "unauthorized"


class RouteNotAllowed(KnowledgeError):
    """403 `route_not_allowed`: the route does not exist or is out of this session's reach
    (the server does not say which, on purpose)."""

    default_code = "route_not_allowed"


class NotFound(KnowledgeError):
    """404: no such endpoint. From capabilities, this means a server without the protocol."""

    default_code = "not_found"


class MethodNotAllowed(KnowledgeError):
    """405: the endpoint does not accept this method."""

    default_code = "method_not_allowed"


class Conflict(KnowledgeError):
    """409 with a code this client does not know; the known 409 codes have their own class."""

    default_code = "conflict"


class RunNotCurrent(Conflict):
    """409 `run_not_current`: the run given is unknown, someone else's, not ready or over.
    Knowledge for that turn is no longer obtainable under its run."""

    default_code = "run_not_current"


class IdempotencyConflict(Conflict):
    """409 `idempotency_conflict`: a replayed turn or completion differs from the original."""

    default_code = "idempotency_conflict"


class ReferenceRejected(KnowledgeError):
    """A ref or cursor can no longer be used: the remedy is always to search again."""

    default_code = "knowledge_reference_rejected"


class ReferenceInvalid(ReferenceRejected):
    """400 `knowledge_reference_invalid`: malformed, forged, or issued to someone else."""

    default_code = "knowledge_reference_invalid"


class ReferenceExpired(ReferenceRejected):
    """410 `knowledge_reference_expired`: an authentic ref or cursor older than its TTL."""

    default_code = "knowledge_reference_expired"


class ScopeChanged(ReferenceRejected, Conflict):
    """409 `knowledge_scope_changed`: the route's knowledge configuration changed."""

    default_code = "knowledge_scope_changed"


class KnowledgeChanged(ReferenceRejected, Conflict):
    """409 `knowledge_changed`: the document changed, left the scope or was deleted."""

    default_code = "knowledge_changed"


class RateLimited(KnowledgeError):
    """429 `rate_limited`; `retry_after` is the server's `Retry-After` in seconds, if any."""

    default_code = "rate_limited"
    default_status = 429


class ServerError(KnowledgeError):
    """5xx: the server failed (`internal_error`) or answered an error status this client
    cannot read. Never treated as success."""

    default_code = "internal_error"


class Unavailable(ServerError):
    """503 `knowledge_unavailable`: the knowledge store cannot be reached; retry later
    (`retry_after` seconds when the server said)."""

    default_code = "knowledge_unavailable"
    default_status = 503


class Unreachable(Unavailable):
    """The hub could not be reached at all (connection refused, DNS, TLS, timeout): no HTTP
    answer, so `status` is 0."""

    default_code = "hub_unreachable"
    default_status = 0


class ProtocolError(KnowledgeError):
    """The answer is not the protocol this client speaks: not JSON, an unknown
    `schema_version`, a missing field, or a broken promise (a chain over its byte budget).
    Hosts must treat it as a failure, never as an empty success."""

    default_code = "protocol_error"


class StaleTurn(Exception):
    """The response belongs to a turn that a newer turn has superseded; it was dropped.

    Not a `KnowledgeError`: the server did nothing wrong. The host's code for the old turn
    should stop, and its result must not reach the model or any cache.
    """

    def __init__(self, turn_id: str, current_turn_id: str | None) -> None:
        self.turn_id = turn_id
        self.current_turn_id = current_turn_id
        super().__init__(f"turn {turn_id!r} was superseded by {current_turn_id!r}")


# Wire code → class. Codes win over statuses: they are what the protocol promises.
_BY_CODE: dict[str, type[KnowledgeError]] = {
    "invalid_request": InvalidRequest,
    "unauthorized": Unauthorized,
    "route_not_allowed": RouteNotAllowed,
    "not_found": NotFound,
    "method_not_allowed": MethodNotAllowed,
    "run_not_current": RunNotCurrent,
    "idempotency_conflict": IdempotencyConflict,
    "knowledge_reference_invalid": ReferenceInvalid,
    "knowledge_reference_expired": ReferenceExpired,
    "knowledge_scope_changed": ScopeChanged,
    "knowledge_changed": KnowledgeChanged,
    "rate_limited": RateLimited,
    "knowledge_unavailable": Unavailable,
    "internal_error": ServerError,
}

# Status → class, for error statuses whose body is not the protocol's envelope or whose code
# this client does not know.
_BY_STATUS: dict[int, type[KnowledgeError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: RouteNotAllowed,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    410: ReferenceExpired,
    429: RateLimited,
    503: Unavailable,
}


_MAX_CODE = 64
_MAX_REASON = 300
# `fields` of an invalid_request: the protocol's server sends `{field: [message, ...]}`,
# nested for nested fields; at most this many keys and messages in all, this deep.
_MAX_FIELD_ENTRIES = 20
_MAX_FIELD_DEPTH = 3
_MAX_FIELD_TEXT = 200


# Longer than any wait worth keeping a host around for: a larger `Retry-After` says "not today".
MAX_RETRY_AFTER = 86400.0
_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def parse_retry_after(value: str | None) -> float | None:
    """`Retry-After` in seconds, at most `MAX_RETRY_AFTER`; None when absent, given as an
    HTTP date (not worth a date parser here: the protocol's server always sends seconds) or
    not a plain number. `float` alone would take `inf`, `nan` and `1e400`, which end up in
    tool results as `Infinity` and `NaN`: not JSON."""
    if value is None or not _SECONDS.fullmatch(value.strip()):
        return None
    return min(float(value.strip()), MAX_RETRY_AFTER)  # 400 digits are infinity, too


def _bounded_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The server's `fields`, cut to a few short entries: like `reason`, they end up in tool
    results a model reads, and a foreign server could send megabytes of them."""
    left = _MAX_FIELD_ENTRIES

    def bound(value: Any, depth: int) -> Any:
        nonlocal left
        if isinstance(value, Mapping):
            result: dict[str, Any] = {}
            for key, item in value.items():
                if left <= 0 or depth >= _MAX_FIELD_DEPTH:
                    break
                left -= 1
                result[str(key)[:_MAX_CODE]] = bound(item, depth + 1)
            return result
        if isinstance(value, list):
            messages: list[str] = []
            for item in value:
                if left <= 0:
                    break
                if isinstance(item, str | int | float | bool):
                    left -= 1
                    messages.append(str(item)[:_MAX_FIELD_TEXT])
            return messages
        return str(value)[:_MAX_FIELD_TEXT]

    return bound(fields, 0)


def decode_json(content: bytes) -> Any:
    """The JSON value of a body, or raise `ValueError` for anything that is not strict JSON.

    Python's parser also takes `NaN`, `Infinity`, numbers beyond a float (1e400 becomes
    infinity) and lone surrogates (`"\\ud800"`), and raises `RecursionError` on deep nesting;
    a hub's answer with any of them would break later, as tool results that are not JSON or
    as text with no UTF-8 form, so it is refused here.
    """
    text = content.decode("utf-8")
    try:
        value = json.loads(text, parse_constant=_not_a_number, parse_float=_finite)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if "\\ud" in text or "\\uD" in text:  # a surrogate can only come from an escape
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("JSON text with a lone surrogate") from None
    return value


def _not_a_number(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of a float's range")
    return value


def error_from_response(
    status: int, content: bytes, headers: Mapping[str, str] | None = None
) -> KnowledgeError:
    """The exception for a non-success answer (the caller raises it).

    The protocol's `{"error": code, "reason": text}` envelope decides the class; an error
    status without that envelope keeps a class derived from its status, with code
    `http_<status>`; anything else (a redirect, an informational status) is a
    `ProtocolError`.
    """
    headers = {k.lower(): v for k, v in (headers or {}).items()}
    code: str | None = None
    reason = ""
    fields: Mapping[str, Any] | None = None
    try:
        body = decode_json(content)
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"]:
        # Bounded: a foreign server's text ends up in tool results a model reads.
        code = body["error"][:_MAX_CODE]
        reason = body["reason"][:_MAX_REASON] if isinstance(body.get("reason"), str) else ""
        if isinstance(body.get("fields"), dict):
            fields = _bounded_fields(body["fields"])

    cls = _BY_CODE.get(code) if code else None
    if cls is None:
        cls = _BY_STATUS.get(status)
        if cls is None and 500 <= status <= 599:
            cls = ServerError
        if cls is None:
            cls = KnowledgeError if code and 400 <= status <= 499 else ProtocolError
        if code is None:
            code = "protocol_error" if cls is ProtocolError else f"http_{status}"
            reason = reason or f"HTTP {status} without a protocol error body."

    retry_after = parse_retry_after(headers.get("retry-after"))
    if issubclass(cls, InvalidRequest):
        return cls(code, status, reason, retry_after=retry_after, fields=fields)
    return cls(code, status, reason, retry_after=retry_after)
