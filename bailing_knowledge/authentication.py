"""Bearer-token authentication of agent sessions.

`Authorization: Bearer <token>` → SHA-256 → session → client, checked on every request with
one statement (`access.py`), which also answers the route re-check when the URL names a
route. Nothing is cached between requests, so revoking a session or disabling a client
takes effect on the very next call. Work that needs neither the database nor the caller's
identity (the view validating the request's body) can run while that statement does
(`work_while_authenticating`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from . import access, constants
from .conf import knowledge_settings
from .models import AgentSession, Client, hash_token

# The token alphabet and length issued by `services.sessions.new_access_token`: anything
# else is rejected before the database is asked.
_TOKEN_ALPHABET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
_MAX_TOKEN_LENGTH = 256

# Where `work_while_authenticating` leaves the work on the request, and
# `send_behind_authentication` the statements.
_MEANWHILE = "_bailing_knowledge_while_authenticating"
_BEHIND = "_bailing_knowledge_behind_authentication"


def work_while_authenticating(request: Request, work: Callable[[], None]) -> None:
    """Have `work` called while authentication's statement runs (`access`), or before it
    where the statement cannot be sent without waiting for it; not at all when no statement
    is sent (no bearer token, or a malformed one). `work` must not use the database and
    should not raise: a view keeps its outcome, errors included, for later."""
    setattr(request, _MEANWHILE, work)


def send_behind_authentication(
    request: Request, statements: Callable[[Any, str], Iterable[list[str]] | None]
) -> None:
    """Have `statements(cursor, token_hash)` called once authentication's statement on a
    route is sent, and the statements it returns sent right behind it, for the view to
    claim if the token and the route pass (`statements.first_row`'s `follow`). It must not
    use the database; it is not called where the statement goes alone."""
    setattr(request, _BEHIND, statements)


class AgentUser:
    """`request.user` for agent calls: the session's principal, never a Django user."""

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False
    is_superuser = False

    def __init__(self, session: AgentSession) -> None:
        self.session = session

    @property
    def client(self) -> Client:
        return self.session.client

    @property
    def pk(self) -> str:
        return self.session.session_id

    def __str__(self) -> str:
        return f"agent:{self.session.client.app_id}:{self.session.principal_id}"


class AgentBearerAuthentication(BaseAuthentication):
    """Authenticate `Authorization: Bearer <token>`; `request.auth` is the `AgentSession`."""

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[AgentUser, AgentSession] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword.lower().encode():
            return None  # not ours: another scheme, or no header at all
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed()
        try:
            token = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed() from None
        return self.authenticate_credentials(
            token,
            route_key=_route_key(request),
            meanwhile=getattr(request, _MEANWHILE, None),
            behind=getattr(request, _BEHIND, None),
        )

    def authenticate_credentials(
        self,
        token: str,
        route_key: str | None = None,
        meanwhile: Callable[[], None] | None = None,
        behind: Callable[[Any, str], Iterable[list[str]] | None] | None = None,
    ) -> tuple[AgentUser, AgentSession]:
        """Return the token's live session; with `route_key`, check that route in passing.

        The route's answer rides on the session for `AgentRoutePermission`, which turns a
        refusal into 403: a live session with a route it may not use is still authenticated.
        `meanwhile` is called while the statement runs (`work_while_authenticating`), and
        `behind`'s statements are sent behind it (`send_behind_authentication`).
        """
        if (
            not token.startswith(constants.ACCESS_TOKEN_PREFIX)
            or len(token) > _MAX_TOKEN_LENGTH
            or not _TOKEN_ALPHABET.issuperset(token[len(constants.ACCESS_TOKEN_PREFIX) :])
        ):
            raise exceptions.AuthenticationFailed()
        now = timezone.now()
        token_hash = hash_token(token)
        if route_key is None:
            session = access.live_session(token_hash, now, meanwhile=meanwhile)
        else:
            follow = None if behind is None else functools.partial(_behind, behind, token_hash)
            session = access.live_session_and_route(
                token_hash, now, route_key, meanwhile=meanwhile, follow=follow
            )
        if session is None:
            raise exceptions.AuthenticationFailed()
        self._touch(session, now)
        return AgentUser(session), session

    def _touch(self, session: AgentSession, now: Any) -> None:
        """Record `last_seen_at` at most once per interval, not on every request."""
        interval = timedelta(seconds=knowledge_settings.SESSION_LAST_SEEN_INTERVAL)
        if session.last_seen_at is not None and now - session.last_seen_at < interval:
            return
        AgentSession.objects.filter(pk=session.pk).update(last_seen_at=now)
        session.last_seen_at = now

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="agent-api"'


def _behind(
    statements: Callable[[Any, str], Iterable[list[str]] | None], token_hash: str, cursor: Any
) -> Iterable[list[str]] | None:
    return statements(cursor, token_hash)


def _route_key(request: Request) -> str | None:
    """The route named in the URL (the `route` the permission re-checks), if any."""
    context = getattr(request, "parser_context", None) or {}
    route_key = context.get("kwargs", {}).get("route")
    return route_key if isinstance(route_key, str) else None
