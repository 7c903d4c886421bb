"""The capabilities document: what this server supports on a route, and its limits."""

from __future__ import annotations

from typing import Any

from .. import constants
from ..models import Route


def knowledge_available(route: Route) -> bool:
    """Knowledge is on for the route and at least one of its KBs is enabled."""
    return route.knowledge_enabled and any(kb.enabled for kb in route.bound_knowledge_bases())


def capabilities(route: Route) -> dict[str, Any]:
    return {
        "schema_version": constants.SCHEMA_CAPABILITIES,
        "protocol": constants.PROTOCOL,
        "supported": True,
        "route": route.route_key,
        "enabled": knowledge_available(route),
        "knowledge_scope_revision": route.knowledge_scope_revision,
        "delivery_modes": list(constants.DELIVERY_MODES),
        "limits": dict(constants.LIMITS),
    }
