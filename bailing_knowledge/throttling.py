"""Per-session and per-client request rates for the agent API.

Rates come from `BAILING_KNOWLEDGE["THROTTLE_RATES"]` (DRF's "N/period" format) and are
read when a request is throttled, so changing the setting needs no restart.
"""

from __future__ import annotations

from typing import Any

from django.core.cache import caches
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from .conf import DEFAULTS, knowledge_settings
from .models import AgentSession


class _AgentRateThrottle(SimpleRateThrottle):
    scope = ""

    def __init__(self) -> None:
        self.cache = caches[knowledge_settings.THROTTLE_CACHE]
        super().__init__()

    def get_rate(self) -> str | None:
        # A scope the setting leaves out keeps its default: setting one rate must not turn
        # the other throttle off (None does, for a scope or the whole key).
        rates = knowledge_settings.THROTTLE_RATES
        if rates is None:
            return None
        return rates.get(self.scope, DEFAULTS["THROTTLE_RATES"][self.scope])

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        session = request.auth
        if not isinstance(session, AgentSession):
            return None
        return f"bailing_knowledge:throttle:{self.scope}:{self.ident_for(session)}"

    def ident_for(self, session: AgentSession) -> str:
        raise NotImplementedError


class SessionRateThrottle(_AgentRateThrottle):
    """Bounds what one agent session (one token) may send."""

    scope = "session"

    def ident_for(self, session: AgentSession) -> str:
        return str(session.pk)


class ClientRateThrottle(_AgentRateThrottle):
    """Bounds what all sessions of one client together may send."""

    scope = "client"

    def ident_for(self, session: AgentSession) -> str:
        return str(session.client_id)
