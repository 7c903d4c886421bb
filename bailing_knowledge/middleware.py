"""`no-store` and JSON errors for everything under the agent API prefix.

The app's views already set `Cache-Control: no-store`; this middleware also covers answers
produced outside them (a host middleware's redirect or failure, Django's own 500 page), so
no agent response can ever be cached. Install it near the top of `MIDDLEWARE`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse

from .conf import knowledge_settings
from .exceptions import (
    AgentAPIError,
    InternalError,
    InvalidRequest,
    KnowledgeUnavailable,
    MethodNotAllowed,
    NotFound,
    error_body,
    log_database_error,
)

logger = logging.getLogger("bailing_knowledge")

# The statuses whose non-JSON answers under the prefix get the envelope, and its code.
_ENVELOPES: dict[int, type[AgentAPIError]] = {
    400: InvalidRequest,
    404: NotFound,
    405: MethodNotAllowed,
    500: InternalError,
    503: KnowledgeUnavailable,
}


class NoStoreMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def _ours(self, request: HttpRequest) -> bool:
        return request.path.startswith(knowledge_settings.URL_PREFIX)

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if self._ours(request):
            error = _ENVELOPES.get(response.status_code)
            if error is not None and not _is_json(response):
                # Django's own page, made outside the app's views: a path under the prefix
                # that no pattern matched (`/agent-api/v2/...`, 404), a Host header not in
                # ALLOWED_HOSTS (400), a host middleware's failure. The agent API's envelope.
                replaced = _envelope(error, response.status_code)
                for header in ("Allow", "Retry-After"):
                    if header in response:
                        replaced[header] = response[header]
                for header, value in error.headers.items():
                    replaced.setdefault(header, value)
                response = replaced
            response["Cache-Control"] = "no-store"
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        """Replace Django's HTML error page with the JSON error envelope under the prefix."""
        if not self._ours(request):
            return None
        if isinstance(exception, DatabaseError):
            error: type[KnowledgeUnavailable | InternalError] = KnowledgeUnavailable
            log_database_error(logger, "Knowledge store error under the agent API", exception)
        else:
            error = InternalError
            logger.error("Unhandled error under the agent API", exc_info=exception)
        response = _envelope(error, error.status_code)
        for header, value in error.headers.items():
            response[header] = value
        response["Cache-Control"] = "no-store"
        return response


def _envelope(error: type[AgentAPIError], status: int) -> JsonResponse:
    """The error envelope as the app's renderer writes it: compact UTF-8 JSON."""
    return JsonResponse(
        error_body(error),
        status=status,
        json_dumps_params={"separators": (",", ":"), "ensure_ascii": False},
    )


def _is_json(response: HttpResponse) -> bool:
    return response.get("Content-Type", "").startswith("application/json")
