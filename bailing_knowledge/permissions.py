"""The route re-check that runs on every agent call."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from . import access
from .access import allowed_route
from .models import AgentSession

__all__ = ["AgentRoutePermission", "IsAgentSession", "allowed_route"]


class AgentRoutePermission(BasePermission):
    """Grant access when the authenticated session may use the route named in the URL.

    Every failure is the same 403 `route_not_allowed`, whether the route is unknown,
    disabled or out of scope: the answer reveals nothing about which routes exist.
    On success the route is available to the view as `request.agent_route`.
    """

    def has_permission(self, request: Request, view: Any) -> bool:
        session = request.auth
        if not isinstance(session, AgentSession):
            return False
        route_key = view.kwargs.get("route", "")
        # Usually already answered by the authentication's statement, for this request.
        checked, route = access.checked_route(session, route_key)
        if not checked:
            route = access.admitted_route(session, route_key)
        if route is None:
            return False
        request.agent_route = route
        return True


class IsAgentSession(BasePermission):
    """Any authenticated agent session; for endpoints whose route comes from a run."""

    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.auth, AgentSession)
