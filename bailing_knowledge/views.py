"""HTTP views of the agent knowledge API: parse, call a service, render."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiExample
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from . import constants, services
from .authentication import AgentBearerAuthentication
from .exceptions import NotFound, exception_handler
from .openapi import document, error_responses
from .permissions import AgentRoutePermission
from .renderers import AgentJSONRenderer, JSONOnlyNegotiation
from .serializers import CapabilitiesSerializer
from .throttling import ClientRateThrottle, SessionRateThrottle

NO_STORE = "no-store"


class AgentAPIView(APIView):
    """Base of every agent endpoint: bearer auth, route re-check, throttles, JSON, no-store.

    Policies are set here rather than through `REST_FRAMEWORK`, so the host project's own
    DRF settings neither affect nor are affected by this app.
    """

    authentication_classes = [AgentBearerAuthentication]
    permission_classes = [AgentRoutePermission]
    throttle_classes = [SessionRateThrottle, ClientRateThrottle]
    renderer_classes = [AgentJSONRenderer]
    parser_classes = [JSONParser]
    content_negotiation_class = JSONOnlyNegotiation
    schema = AutoSchema()

    def get_exception_handler(self) -> Any:
        return exception_handler

    def finalize_response(
        self, request: Request, response: HttpResponse, *args: Any, **kwargs: Any
    ) -> HttpResponse:
        response = super().finalize_response(request, response, *args, **kwargs)
        response["Cache-Control"] = NO_STORE
        return response


class CapabilitiesView(AgentAPIView):
    """What this server supports on a route: protocol, delivery modes and limits."""

    @document(
        operation_id="knowledge_capabilities",
        summary="Knowledge capabilities of a route",
        responses={200: CapabilitiesSerializer, **error_responses()},
        examples=[
            OpenApiExample(
                "capabilities",
                value={
                    "schema_version": constants.SCHEMA_CAPABILITIES,
                    "protocol": constants.PROTOCOL,
                    "supported": True,
                    "route": "order-assistant",
                    "enabled": True,
                    "knowledge_scope_revision": "ksr_3f9a1c0d5e7b2a4c6d8e0f1a2b3c4d5e",
                    "delivery_modes": list(constants.DELIVERY_MODES),
                    "limits": dict(constants.LIMITS),
                },
                response_only=True,
                status_codes=["200"],
            )
        ],
        tags=["knowledge"],
    )
    def get(self, request: Request, route: str) -> Response:
        return Response(services.capabilities(request.agent_route))


def not_found(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    """JSON 404 with `no-store` for any unknown path under the app's URLs."""
    response = exception_handler(NotFound(), {})
    response.accepted_renderer = AgentJSONRenderer()
    response.accepted_media_type = AgentJSONRenderer.media_type
    response.renderer_context = {}
    response["Cache-Control"] = NO_STORE
    return response.render()
