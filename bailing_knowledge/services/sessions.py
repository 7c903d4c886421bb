"""Agent sessions: issue a bearer token for one principal, list sessions, revoke them.

A host's own authorization page calls `issue_session(...)` after its user consents, hands
`access_token` to the agent once, and never sees it again: only its SHA-256 is stored.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from .. import constants, signals
from ..conf import knowledge_settings
from ..lookups import get_client, get_route, get_session, resolve_all
from ..models import AgentSession, Client, Route, hash_token
from ..signals import send_on_commit


@dataclass(frozen=True)
class IssuedSession:
    """A new session and its raw bearer token, which exists only in this object."""

    session: AgentSession
    access_token: str
    # Keys of the session's routes that do not admit its audience today: every call the
    # session makes on them is 403 until the route's audiences change.
    refused_routes: tuple[str, ...] = ()

    @property
    def session_id(self) -> str:
        return self.session.session_id

    @property
    def expires_at(self) -> datetime:
        return self.session.expires_at

    def __repr__(self) -> str:  # keep the token out of logs and tracebacks
        return f"IssuedSession(session_id={self.session_id!r}, access_token='***')"

    def refused_routes_warning(self) -> str | None:
        """A sentence for whoever issued the session when some of its routes refuse it."""
        if not self.refused_routes:
            return None
        audience = self.session.principal_audience
        named = f"audience {audience!r}" if audience else "no audience"
        keys = ", ".join(repr(key) for key in self.refused_routes)
        return (
            f"The session has {named}, which route(s) {keys} do not admit: its calls there "
            f"will answer 403 route_not_allowed until those routes admit it."
        )


def new_access_token() -> str:
    """A high-entropy bearer token with a recognisable prefix."""
    return constants.ACCESS_TOKEN_PREFIX + secrets.token_urlsafe(constants.ACCESS_TOKEN_BYTES)


def _lifetime(lifetime: timedelta | int | None) -> timedelta:
    if lifetime is None:
        lifetime = knowledge_settings.SESSION_DEFAULT_LIFETIME
    if isinstance(lifetime, bool) or not isinstance(lifetime, timedelta | int):
        raise ValidationError({"lifetime": "The lifetime must be whole seconds or a timedelta."})
    maximum = timedelta(seconds=knowledge_settings.SESSION_MAX_LIFETIME)
    if isinstance(lifetime, int):
        # Clamp first: timedelta overflows on huge integers; the bound check below reports it.
        lifetime = timedelta(seconds=min(lifetime, int(maximum.total_seconds()) + 1))
    if lifetime <= timedelta(0):
        raise ValidationError({"lifetime": "The lifetime must be positive."})
    if lifetime > maximum:
        raise ValidationError(
            {"lifetime": f"The lifetime may not exceed {int(maximum.total_seconds())} seconds."}
        )
    return lifetime


def _clean_roles(roles: Iterable[str]) -> list[str]:
    cleaned = list(dict.fromkeys(r.strip() for r in roles))
    if any(not r for r in cleaned):
        raise ValidationError({"principal_roles": "Roles must be non-empty strings."})
    return cleaned


@transaction.atomic
def issue_session(
    client: Client | str,
    *,
    principal_id: str,
    routes: Iterable[Route | str],
    tenant: str = "",
    roles: Iterable[str] = (),
    audience: str = "",
    on_behalf_of: str = "",
    lifetime: timedelta | int | None = None,
    device_label: str = "",
) -> IssuedSession:
    """Authorize `client` to act for one principal on `routes`; return the one-time token.

    The routes must be among the client's allowed routes: a session can narrow what its
    client may do, never widen it.
    """
    client = get_client(client)
    if not client.enabled:
        raise ValidationError({"client": f"Client {client.app_id!r} is disabled."})
    if not principal_id or not principal_id.strip():
        raise ValidationError({"principal_id": "A principal id is required."})
    resolved = resolve_all(Route, "route_key", routes)
    if not resolved:
        raise ValidationError({"routes": "A session needs at least one route."})
    allowed = set(client.allowed_routes.values_list("pk", flat=True))
    outside = sorted(r.route_key for r in resolved if r.pk not in allowed)
    if outside:
        raise ValidationError(
            {"routes": f"Not among client {client.app_id!r}'s routes: {', '.join(outside)}."}
        )
    now = timezone.now()
    token = new_access_token()
    session = AgentSession(
        client=client,
        principal_id=principal_id.strip(),
        principal_tenant=tenant,
        principal_roles=_clean_roles(roles),
        principal_audience=audience,
        on_behalf_of=on_behalf_of,
        token_hash=hash_token(token),
        token_hint=token[: len(constants.ACCESS_TOKEN_PREFIX) + 4],
        device_label=device_label,
        created_at=now,
        expires_at=now + _lifetime(lifetime),
    )
    session.full_clean()
    session.save()
    session.allowed_routes.set(resolved)
    send_on_commit(signals.session_issued, AgentSession, session=session)
    refused = tuple(r.route_key for r in resolved if not r.admits_audience(audience))
    return IssuedSession(session=session, access_token=token, refused_routes=refused)


def list_sessions(
    *,
    client: Client | str | None = None,
    principal_id: str | None = None,
    route: Route | str | None = None,
    active: bool | None = None,
) -> QuerySet[AgentSession]:
    """Sessions, newest first; `active=True` keeps unrevoked, unexpired ones."""
    sessions = AgentSession.objects.select_related("client").prefetch_related("allowed_routes")
    if client is not None:
        sessions = sessions.filter(client=get_client(client))
    if principal_id is not None:
        sessions = sessions.filter(principal_id=principal_id)
    if route is not None:
        sessions = sessions.filter(allowed_routes=get_route(route))
    if active is True:
        sessions = sessions.active()
    elif active is False:
        sessions = sessions.inactive()
    return sessions


@transaction.atomic
def revoke_session(session: AgentSession | str) -> AgentSession:
    """Revoke a session (idempotent); its token fails from the next request on."""
    session = AgentSession.objects.select_for_update().get(pk=get_session(session).pk)
    if session.revoked_at is None:
        session.revoked_at = timezone.now()
        session.save(update_fields=["revoked_at"])
        send_on_commit(signals.session_revoked, AgentSession, session=session)
    return session
