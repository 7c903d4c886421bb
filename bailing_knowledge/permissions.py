"""The route re-check that runs on every agent call."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from .models import AgentSession, Route


def allowed_route(session: AgentSession, route_key: str) -> Route | None:
    """Return the route if `session` may use it now, else None.

    The route must be enabled, have its Agent Client runtime switched on, be among both the
    client's and the session's routes, and admit the principal's audience. One query.
    """
    route = (
        Route.objects.filter(
            route_key=route_key,
            enabled=True,
            agent_client_enabled=True,
            clients=session.client_id,
            agent_sessions=session.pk,
        )
        .prefetch_related("knowledge_bases")
        .first()
    )
    if route is None:
        return None
    if route.allowed_audiences and session.principal_audience not in route.allowed_audiences:
        return None
    return route


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
        route = allowed_route(session, view.kwargs.get("route", ""))
        if route is None:
            return False
        request.agent_route = route
        return True


class IsAgentSession(BasePermission):
    """Any authenticated agent session; for endpoints whose route comes from a run."""

    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.auth, AgentSession)
