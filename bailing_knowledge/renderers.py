"""JSON rendering and content negotiation for the agent API.

Responses are byte-budgeted, so their size must not depend on what the client asks for:
the renderer ignores `indent` media-type parameters, and negotiation always picks JSON.
"""

from __future__ import annotations

from typing import Any

from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import BaseRenderer, JSONRenderer


class AgentJSONRenderer(JSONRenderer):
    """Compact UTF-8 JSON, whatever the `Accept` header or the host's DRF settings say."""

    ensure_ascii = False
    compact = True
    strict = True

    def get_indent(self, accepted_media_type: Any, renderer_context: Any) -> None:
        return None


class JSONOnlyNegotiation(BaseContentNegotiation):
    """Always answer JSON; never 406, never the browsable API."""

    def select_parser(self, request: Any, parsers: list[Any]) -> Any:
        for parser in parsers:
            # Media types compare without regard to case (RFC 9110, 8.3.1).
            if request.content_type.split(";")[0].strip().lower() == parser.media_type:
                return parser
        return None

    def select_renderer(
        self, request: Any, renderers: list[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        renderer = renderers[0]
        return renderer, renderer.media_type
