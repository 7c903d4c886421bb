"""One exception per wire error code, and the handler that renders them.

Each class is three attributes, as in DRF: `status_code`, `default_code` (the wire code) and
`default_detail` (a safe, fixed sentence). The handler turns every exception raised under the
app's views into `{"error": code, "reason": text}`, so nothing the client sent (a query, a
body, a token) and nothing internal (SQL, a stack trace) can reach the response.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response

logger = logging.getLogger("bailing_knowledge")

RETRY_AFTER_UNAVAILABLE_SECONDS = 5


class AgentAPIError(exceptions.APIException):
    """Base of the wire errors; `headers` adds response headers such as `Retry-After`."""

    headers: dict[str, str] = {}


class InvalidRequest(AgentAPIError):
    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "invalid_request"
    default_detail = "The request is not valid."


class Unauthorized(AgentAPIError):
    status_code = status.HTTP_401_UNAUTHORIZED
    default_code = "unauthorized"
    default_detail = "A valid agent access token is required."


class RouteNotAllowed(AgentAPIError):
    status_code = status.HTTP_403_FORBIDDEN
    default_code = "route_not_allowed"
    default_detail = "This route is not available to this agent session."


class NotFound(AgentAPIError):
    status_code = status.HTTP_404_NOT_FOUND
    default_code = "not_found"
    default_detail = "There is no such endpoint."


class MethodNotAllowed(AgentAPIError):
    status_code = status.HTTP_405_METHOD_NOT_ALLOWED
    default_code = "method_not_allowed"
    default_detail = "This method is not allowed on this endpoint."


class RunNotCurrent(AgentAPIError):
    status_code = status.HTTP_409_CONFLICT
    default_code = "run_not_current"
    default_detail = "The run is not current for this session and route."


class KnowledgeReferenceInvalid(AgentAPIError):
    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "knowledge_reference_invalid"
    default_detail = "The knowledge reference or cursor is not valid here."


class KnowledgeReferenceExpired(AgentAPIError):
    status_code = status.HTTP_410_GONE
    default_code = "knowledge_reference_expired"
    default_detail = "The knowledge reference or cursor has expired; search again."


class KnowledgeScopeChanged(AgentAPIError):
    status_code = status.HTTP_409_CONFLICT
    default_code = "knowledge_scope_changed"
    default_detail = "The route's knowledge configuration changed; search again."


class KnowledgeChanged(AgentAPIError):
    status_code = status.HTTP_409_CONFLICT
    default_code = "knowledge_changed"
    default_detail = "The document changed or is no longer available; search again."


class KnowledgeUnavailable(AgentAPIError):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "knowledge_unavailable"
    default_detail = "The knowledge store is unavailable; try again later."
    headers = {"Retry-After": str(RETRY_AFTER_UNAVAILABLE_SECONDS)}


class IdempotencyConflict(AgentAPIError):
    status_code = status.HTTP_409_CONFLICT
    default_code = "idempotency_conflict"
    default_detail = "A different request was already made under the same idempotency key."


class RateLimited(AgentAPIError):
    status_code = status.HTTP_429_TOO_MANY_REQUESTS
    default_code = "rate_limited"
    default_detail = "Too many requests; retry later."


class InternalError(AgentAPIError):
    status_code = status.HTTP_500_INTERNAL_SERVER_ERROR
    default_code = "internal_error"
    default_detail = "The server failed to answer this request."


WIRE_ERRORS: tuple[type[AgentAPIError], ...] = (
    InvalidRequest,
    Unauthorized,
    RouteNotAllowed,
    NotFound,
    MethodNotAllowed,
    RunNotCurrent,
    KnowledgeReferenceInvalid,
    KnowledgeReferenceExpired,
    KnowledgeScopeChanged,
    KnowledgeChanged,
    KnowledgeUnavailable,
    IdempotencyConflict,
    RateLimited,
    InternalError,
)


def error_body(error: type[AgentAPIError] | AgentAPIError, reason: str | None = None) -> dict:
    """The wire body of an error: its code and a fixed, safe reason."""
    return {"error": error.default_code, "reason": reason or str(error.default_detail)}


def _field_errors(detail: Any) -> dict[str, Any]:
    """DRF's validation detail as plain JSON: `{field: [message, ...]}`, nested fields nested.

    A nested serializer's errors stay an object (`{"task_binding": {"task_id": [...]}}`); a
    list's item errors are keyed by the item's index.
    """
    if isinstance(detail, dict):
        return {str(field): _messages(value) for field, value in detail.items()}
    return {"non_field_errors": _messages(detail)}


def _messages(detail: Any) -> Any:
    if isinstance(detail, dict):
        return {str(key): _messages(value) for key, value in detail.items()}
    if isinstance(detail, list):
        if any(isinstance(item, dict | list) for item in detail):
            # A list of per-item errors: keep the positions of the items that failed.
            return {str(index): _messages(item) for index, item in enumerate(detail) if item}
        return [str(item) for item in detail]
    return [str(detail)]


def _translate(exc: Exception, context: dict[str, Any]) -> tuple[AgentAPIError, dict]:
    """Map any exception to one of our wire errors plus extra body keys."""
    extra: dict[str, Any] = {}
    if isinstance(exc, AgentAPIError):
        return exc, extra
    if isinstance(exc, exceptions.ValidationError):
        # Field messages come from our serializers: they name the field and the rule, and
        # never repeat the submitted value.
        extra["fields"] = _field_errors(exc.detail)
        return InvalidRequest(), extra
    if isinstance(exc, RequestDataTooBig):
        # Django's own upload limit, met when something read the body before the parser.
        return InvalidRequest("The request body is too large."), extra
    if isinstance(exc, exceptions.UnsupportedMediaType):
        return InvalidRequest(
            "The request body must be JSON, sent with Content-Type: application/json."
        ), extra
    if isinstance(exc, exceptions.ParseError):
        return InvalidRequest("The request body must be a JSON object."), extra
    if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        return Unauthorized(), extra
    if isinstance(exc, exceptions.PermissionDenied | DjangoPermissionDenied):
        return RouteNotAllowed(), extra
    if isinstance(exc, exceptions.Throttled):
        error = RateLimited()
        error.headers = {"Retry-After": str(max(1, int(exc.wait or 1)))}
        return error, extra
    if isinstance(exc, exceptions.MethodNotAllowed):
        return MethodNotAllowed(), extra
    if isinstance(exc, exceptions.NotFound | Http404):
        return NotFound(), extra
    if isinstance(exc, DatabaseError):
        log_database_error(logger, f"Knowledge store error in {_view_name(context)}", exc)
        return KnowledgeUnavailable(), extra
    logger.error("Unhandled error in %s", _view_name(context), exc_info=exc)
    return InternalError(), extra


def log_database_error(log: logging.Logger, what: str, exc: BaseException) -> None:
    """Log a database error by its class, SQLSTATE and place, never by its message.

    PostgreSQL's messages (and their DETAIL and CONTEXT parts) quote the values that failed,
    which may be what a client sent: a page context, a query, a reference.
    """
    cause = exc.__cause__ or exc
    sqlstate = getattr(cause, "sqlstate", None) or "-"
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "bailing_knowledge" in f.filename] or frames
    place = f"{ours[-1].filename}:{ours[-1].lineno}" if ours else "-"
    log.warning("%s: %s (SQLSTATE %s) at %s", what, type(cause).__name__, sqlstate, place)


def _view_name(context: dict[str, Any]) -> str:
    view = context.get("view")
    return type(view).__name__ if view is not None else "bailing_knowledge"


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    """Render every error as `{"error", "reason"}`; installed on the app's base view only."""
    error, extra = _translate(exc, context)
    headers = dict(error.headers)
    if isinstance(error, Unauthorized):
        headers["WWW-Authenticate"] = 'Bearer realm="agent-api"'
    if isinstance(exc, exceptions.MethodNotAllowed) and context.get("view") is not None:
        headers["Allow"] = ", ".join(context["view"].allowed_methods)
    body = {**error_body(error, str(error.detail)), **extra}
    return Response(body, status=error.status_code, headers=headers)
