"""OpenAPI helpers: documented error answers built from the same classes that raise them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from drf_spectacular.extensions import (
    OpenApiAuthenticationExtension,
    OpenApiSerializerExtension,
)
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema

from . import exceptions as errors
from .serializers import ErrorSerializer

F = TypeVar("F", bound=Callable[..., Any])


def document(**kwargs: Any) -> Callable[[F], F]:
    """`extend_schema` for a view method, based on drf-spectacular's `AutoSchema`.

    A method-level `extend_schema` otherwise builds on the host's `DEFAULT_SCHEMA_CLASS`,
    which we must neither require nor change.
    """

    def decorator(method: F) -> F:
        method.schema = AutoSchema  # type: ignore[attr-defined]
        return extend_schema(**kwargs)(method)

    return decorator


# Extra keys shown in an error's documented example.
EXAMPLE_EXTRAS: dict[type[errors.AgentAPIError], dict] = {
    errors.InvalidRequest: {"fields": {"unexpected": ["This field is not accepted."]}},
}

# The errors any authenticated endpoint can answer, by status.
COMMON_ERRORS: dict[int, tuple[type[errors.AgentAPIError], ...]] = {
    401: (errors.Unauthorized,),
    403: (errors.RouteNotAllowed,),
    # A route key that is not a slug, or an empty run id, matches no endpoint.
    404: (errors.NotFound,),
    429: (errors.RateLimited,),
    503: (errors.KnowledgeUnavailable,),
}


def error_responses(
    extra: dict[int, tuple[type[errors.AgentAPIError], ...]] | None = None,
) -> dict[int, OpenApiResponse]:
    """`responses=` entries for the common errors plus an endpoint's own ones."""
    by_status: dict[int, list[type[errors.AgentAPIError]]] = {}
    for table in (COMMON_ERRORS, extra or {}):
        for status, classes in table.items():
            by_status.setdefault(status, []).extend(classes)
    return {
        status: OpenApiResponse(
            response=ErrorSerializer,
            description=" or ".join(f"`{cls.default_code}`" for cls in classes),
            examples=[
                OpenApiExample(
                    cls.default_code,
                    value={**errors.error_body(cls), **EXAMPLE_EXTRAS.get(cls, {})},
                    response_only=True,
                    status_codes=[str(status)],
                )
                for cls in classes
            ],
        )
        for status, classes in sorted(by_status.items())
    }


class AgentBearerScheme(OpenApiAuthenticationExtension):
    """Publishes `AgentBearerAuthentication` as an HTTP bearer security scheme."""

    target_class = "bailing_knowledge.authentication.AgentBearerAuthentication"
    name = "agentBearer"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "The agent session's access token (prefix `bka_`).",
        }


class StrictRequestScheme(OpenApiSerializerExtension):
    """Request bodies refuse undeclared fields, so their schema says `additionalProperties:
    false`: a body the schema accepts is one the server accepts."""

    target_class = "bailing_knowledge.serializers.StrictSerializer"
    match_subclasses = True

    def map_serializer(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        schema = auto_schema._map_basic_serializer(self.target, direction)
        return {**schema, "additionalProperties": False}
