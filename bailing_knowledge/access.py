"""The per-request access checks, one SQL statement each: a token's live session, its route."""

from __future__ import annotations

import json
from datetime import datetime
from functools import cache
from typing import Any

from django.conf import settings
from django.db import connections, router
from django.db.models import Field, Model
from django.utils import timezone

from .models import AgentSession, Client, KnowledgeBase, Route

# Every rule is in SQL: a statement returns one row, or none when access is refused (when the
# session is live but the route refused, the route's columns are NULL). The row becomes
# complete model instances without further queries (the session with its client cached, the
# route with its knowledge bases in its prefetch cache), its columns following the models'
# concrete fields. Nothing is cached between requests.

# A session `s` of a client `c` is live: not revoked, not expired, its client enabled.
# (`AgentSession.is_active` is the same rule in Python, for rows already loaded.)
_SESSION_LIVE = "s.revoked_at IS NULL AND s.expires_at > %(now)s AND c.enabled"

# A route `r` admits the session `{session_pk}` of client `{client_pk}` whose principal's
# audience is `{audience}`: enabled, its Agent Client runtime on, among both the client's
# and the session's routes, and the audience admitted (an empty list admits every one).
_ROUTE_ADMITS = """
    r.route_key = %(route_key)s AND r.enabled AND r.agent_client_enabled
    AND (cardinality(r.allowed_audiences) = 0 OR {audience} = ANY(r.allowed_audiences))
    AND EXISTS (
        SELECT 1 FROM {client_routes} cr
        WHERE cr.{client_routes_route} = r.id AND cr.{client_routes_client} = {client_pk}
    )
    AND EXISTS (
        SELECT 1 FROM {session_routes} sr
        WHERE sr.{session_routes_route} = r.id AND sr.{session_routes_session} = {session_pk}
    )
"""

# The route `r`'s knowledge bases as one JSON array of value arrays (NULL for none), in the
# model's default order (slug), as `route.knowledge_bases.all()` would list them. One column
# rather than one row per KB: the route's and session's columns are then read only once.
_ROUTE_KNOWLEDGE_BASES = """(
    SELECT json_agg(json_build_array({kb_columns}) ORDER BY kb.slug)
    FROM {route_kbs} rk JOIN {kb} kb ON kb.id = rk.{route_kbs_kb}
    WHERE rk.{route_kbs_route} = r.id
)"""

# Where `live_session_and_route` leaves its answer on the session instance it builds.
_CHECKED_ROUTE = "_bailing_knowledge_checked_route"


def _columns(model: type[Model], alias: str) -> str:
    return ", ".join(f'{alias}."{field.column}"' for field in model._meta.concrete_fields)


def _m2m(model: type[Model], name: str) -> tuple[str, str, str]:
    """The through table of `model.name`, its column to `model`, its column to the target."""
    field = model._meta.get_field(name)
    through = field.remote_field.through._meta.db_table
    return through, field.m2m_column_name(), field.m2m_reverse_name()


def _names() -> dict[str, str]:
    """Table and column names for the templates above, from the models' metadata."""
    client_routes, client_routes_client, client_routes_route = _m2m(Client, "allowed_routes")
    session_routes, session_routes_session, session_routes_route = _m2m(
        AgentSession, "allowed_routes"
    )
    route_kbs, route_kbs_route, route_kbs_kb = _m2m(Route, "knowledge_bases")
    return {
        "session": AgentSession._meta.db_table,
        "client": Client._meta.db_table,
        "route": Route._meta.db_table,
        "kb": KnowledgeBase._meta.db_table,
        "kb_columns": _columns(KnowledgeBase, "kb"),
        "client_routes": client_routes,
        "client_routes_client": client_routes_client,
        "client_routes_route": client_routes_route,
        "session_routes": session_routes,
        "session_routes_session": session_routes_session,
        "session_routes_route": session_routes_route,
        "route_kbs": route_kbs,
        "route_kbs_route": route_kbs_route,
        "route_kbs_kb": route_kbs_kb,
    }


# The statements are assembled once from module constants and model metadata; every value
# is a bound parameter.
@cache
def _session_sql() -> str:
    n = _names()
    return (
        f"SELECT {_columns(AgentSession, 's')}, {_columns(Client, 'c')} "  # noqa: S608
        f"FROM {n['session']} s JOIN {n['client']} c ON c.id = s.client_id "
        f"WHERE s.token_hash = %(token_hash)s AND {_SESSION_LIVE}"
    )


@cache
def _route_sql() -> str:
    n = _names()
    admits = _ROUTE_ADMITS.format(
        audience="%(audience)s", client_pk="%(client)s", session_pk="%(session)s", **n
    )
    return (
        f"SELECT {_columns(Route, 'r')}, {_ROUTE_KNOWLEDGE_BASES.format(**n)} "  # noqa: S608
        f"FROM {n['route']} r WHERE {admits}"
    )


@cache
def _session_and_route_sql() -> str:
    n = _names()
    admits = _ROUTE_ADMITS.format(
        audience="s.principal_audience", client_pk="c.id", session_pk="s.id", **n
    )
    return (
        f"SELECT {_columns(AgentSession, 's')}, {_columns(Client, 'c')}, "  # noqa: S608
        f"{_columns(Route, 'r')}, {_ROUTE_KNOWLEDGE_BASES.format(**n)} "
        f"FROM {n['session']} s JOIN {n['client']} c ON c.id = s.client_id "
        f"LEFT JOIN {n['route']} r ON {admits} "
        f"WHERE s.token_hash = %(token_hash)s AND {_SESSION_LIVE}"
    )


def _fetch(model: type[Model], sql: str, params: dict[str, Any]) -> _Row | None:
    alias = router.db_for_read(model)
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return None if row is None else _Row(alias, row)


def _from_json(field: Field, value: Any) -> Any:
    """The value the ORM would have loaded: JSON carries timestamps and the like as text."""
    value = field.to_python(value)
    if isinstance(value, datetime) and not settings.USE_TZ:
        # Local time, naive, as Django loads timestamps without time zone support.
        value = timezone.make_naive(value, timezone.get_default_timezone())
    return value


class _Row:
    """Reads one result row into model instances, model by model, in SELECT order."""

    def __init__(self, alias: str, row: tuple) -> None:
        self.alias = alias
        self.row = row
        self.offset = 0

    def instance(self, model: type[Model]) -> Any:
        """The `model` in the next columns, or None when they are NULL (an outer join)."""
        fields = model._meta.concrete_fields
        values = self.row[self.offset : self.offset + len(fields)]
        self.offset += len(fields)
        if values[0] is None:
            return None
        return model.from_db(self.alias, [field.attname for field in fields], values)

    def json_instances(self, model: type[Model]) -> list[Any]:
        """The `model`s in the next column, a JSON array of value arrays (or NULL)."""
        rows = self.row[self.offset]
        self.offset += 1
        if isinstance(rows, str | bytes):  # a host may have changed psycopg's json loader
            rows = json.loads(rows)
        fields = model._meta.concrete_fields
        names = [field.attname for field in fields]
        return [
            model.from_db(
                self.alias,
                names,
                [_from_json(f, v) for f, v in zip(fields, values, strict=True)],
            )
            for values in rows or ()
        ]


def _session(row: _Row) -> AgentSession:
    session = row.instance(AgentSession)
    AgentSession._meta.get_field("client").set_cached_value(session, row.instance(Client))
    return session


def _route(row: _Row) -> Route | None:
    route = row.instance(Route)
    knowledge_bases = row.json_instances(KnowledgeBase)
    if route is None:
        return None
    # What `prefetch_related("knowledge_bases")` leaves behind, filled from our row: a
    # queryset still filtered on the route, should a caller refine it.
    queryset = route.knowledge_bases.get_queryset()
    queryset._result_cache = knowledge_bases
    queryset._prefetch_done = True
    route._prefetched_objects_cache = {"knowledge_bases": queryset}
    return route


def live_session(token_hash: str, now: datetime) -> AgentSession | None:
    """The session stored under `token_hash` if it is live at `now`, its client cached."""
    row = _fetch(AgentSession, _session_sql(), {"token_hash": token_hash, "now": now})
    return None if row is None else _session(row)


def admitted_route(session: AgentSession, route_key: str) -> Route | None:
    """The route `route_key` if `session` may use it now, its knowledge bases prefetched."""
    params = {
        "route_key": route_key,
        "audience": session.principal_audience,
        "client": session.client_id,
        "session": session.pk,
    }
    row = _fetch(Route, _route_sql(), params)
    return None if row is None else _route(row)


def live_session_and_route(token_hash: str, now: datetime, route_key: str) -> AgentSession | None:
    """`live_session`, answering `admitted_route(session, route_key)` in the same statement.

    The answer stays on this session instance, which lives for one request, for
    `checked_route` to hand to the route permission.
    """
    params = {"token_hash": token_hash, "now": now, "route_key": route_key}
    row = _fetch(AgentSession, _session_and_route_sql(), params)
    if row is None:
        return None
    session = _session(row)
    setattr(session, _CHECKED_ROUTE, (route_key, _route(row)))
    return session


def checked_route(session: AgentSession, route_key: str) -> tuple[bool, Route | None]:
    """`(True, route or None)` if `live_session_and_route` already answered for `route_key`."""
    checked = getattr(session, _CHECKED_ROUTE, None)
    if checked is None or checked[0] != route_key:
        return False, None
    return True, checked[1]
