"""The access rules of agent calls: a token's live session, its route, a task's members.

The per-request checks are one SQL statement each; the DRF permission classes, the
authentication and the services all ask here, never decide for themselves.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from functools import cache
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections, models, router
from django.db.models import Field, Model
from django.utils import timezone

from .models import AgentSession, Client, KnowledgeBase, Route, Task
from .prefetch import PrefetchedLists
from .statements import Follow, first_row

# Every rule is in SQL, in the PL/pgSQL functions of migration 0006: PostgreSQL keeps the
# plan of a function's query for the life of the connection, where a statement sent with its
# values inline, as Django sends them, is planned anew on every call. A function answers one
# JSON object, or NULL when access is refused (the route alone is NULL when the session is
# live but the route refused), whose rows, keyed by column, become complete model instances
# without further queries: the session with its client cached, the route with its knowledge
# bases prefetched (`prefetch.PrefetchedLists`). Nothing is cached between requests.
_LIVE_SESSION = "SELECT bailing_knowledge_live_session(%s, %s)"
_ADMITTED_ROUTE = "SELECT bailing_knowledge_admitted_route(%s, %s, %s, %s)"
_LIVE_SESSION_AND_ROUTE = "SELECT bailing_knowledge_live_session_and_route(%s, %s, %s)"

# Where `live_session_and_route` leaves its answer on the session instance it builds.
_CHECKED_ROUTE = "_bailing_knowledge_checked_route"

# Fields whose JSON value is already what the ORM loads (text, integers, booleans, NULL):
# these classes' `to_python` returns such values unchanged.
_AS_IS = frozenset(
    {
        models.AutoField,
        models.BigAutoField,
        models.BigIntegerField,
        models.BooleanField,
        models.CharField,
        models.IntegerField,
        models.PositiveBigIntegerField,
        models.PositiveIntegerField,
        models.PositiveSmallIntegerField,
        models.SlugField,
        models.SmallAutoField,
        models.SmallIntegerField,
        models.TextField,
    }
)


def session_database() -> str:
    """The database alias authentication's statement reads from: a request's first."""
    return router.db_for_read(AgentSession)


def _fetch(
    model: type[Model],
    sql: str,
    params: list[Any],
    meanwhile: Callable[[], None] | None = None,
    follow: Follow | None = None,
) -> tuple[str, dict[str, Any]] | None:
    """The function's answer, with the database alias it was read from; `meanwhile` is
    called while the server works on it, and `follow`'s statements are sent behind it on
    the default database (`statements.first_row`)."""
    alias = router.db_for_read(model)
    if alias != DEFAULT_DB_ALIAS:
        follow = None  # they are for the default database's connection
    with connections[alias].cursor() as cursor:
        (answer,) = first_row(cursor, sql, params, meanwhile=meanwhile, follow=follow)
    if isinstance(answer, str | bytes):  # a host may have changed psycopg's json loader
        answer = json.loads(answer)
    return None if answer is None else (alias, answer)


@cache
def _columns(model: type[Model]) -> tuple[list[tuple[str, Field | None]], list[str]]:
    """Per concrete field, its column and the field if its JSON value needs converting."""
    columns = []
    for field in model._meta.concrete_fields:
        stored = field.target_field if field.is_relation else field
        columns.append((field.column, None if type(stored) in _AS_IS else field))
    return columns, [field.attname for field in model._meta.concrete_fields]


def _from_json(field: Field, value: Any) -> Any:
    """The value the ORM would have loaded: JSON carries timestamps and the like as text."""
    value = field.to_python(value)
    if isinstance(value, datetime) and not settings.USE_TZ:
        # Local time, naive, as Django loads timestamps without time zone support.
        value = timezone.make_naive(value, timezone.get_default_timezone())
    return value


def _instance(model: type[Model], alias: str, row: dict[str, Any] | None) -> Any:
    """The `model` whose columns `row` holds, or None for a NULL row."""
    if row is None:
        return None
    columns, names = _columns(model)
    try:
        values = [
            row[column] if field is None or row[column] is None else _from_json(field, row[column])
            for column, field in columns
        ]
    except KeyError as missing:
        raise ImproperlyConfigured(
            f"The access functions of bailing_knowledge return no {model.__name__} column "
            f"{missing}: apply the app's migrations, and let a migration that changes the "
            f"model replace the functions (see migration 0006)."
        ) from None
    return model.from_db(alias, names, values)


def _session(alias: str, answer: dict[str, Any]) -> AgentSession:
    session = _instance(AgentSession, alias, answer["session"])
    client = _instance(Client, alias, answer["client"])
    AgentSession._meta.get_field("client").set_cached_value(session, client)
    return session


def _route(alias: str, answer: dict[str, Any]) -> Route | None:
    route = _instance(Route, alias, answer["route"])
    if route is None:
        return None
    knowledge_bases = [
        _instance(KnowledgeBase, alias, row) for row in answer["knowledge_bases"] or ()
    ]
    # As `prefetch_related("knowledge_bases")` would leave them, filled from the answer.
    route._prefetched_objects_cache = PrefetchedLists(route, knowledge_bases=knowledge_bases)
    return route


def live_session(
    token_hash: str, now: datetime, *, meanwhile: Callable[[], None] | None = None
) -> AgentSession | None:
    """The session stored under `token_hash` if it is live at `now`, its client cached;
    `meanwhile` as for `live_session_and_route`."""
    fetched = _fetch(AgentSession, _LIVE_SESSION, [token_hash, now], meanwhile)
    return None if fetched is None else _session(*fetched)


def admitted_route(session: AgentSession, route_key: str) -> Route | None:
    """The route `route_key` if `session` may use it now, its knowledge bases prefetched.

    The route must be enabled, have its Agent Client runtime switched on, be among both the
    client's and the session's routes, and admit the principal's audience. One statement,
    which also brings the route's knowledge bases (`route.knowledge_bases.all()` is cached).
    """
    params = [route_key, session.principal_audience, session.client_id, session.pk]
    fetched = _fetch(Route, _ADMITTED_ROUTE, params)
    return None if fetched is None else _route(*fetched)


# The name the permission module has always exported.
allowed_route = admitted_route


def task_admits(task: Task | None, session: AgentSession) -> bool:
    """Whether work bound to `task` may go on for `session`: the task is active and the
    session still one of its members. Checked when a turn binds a task and on every search
    and read made within a run bound to one."""
    return (
        task is not None
        and task.state == Task.State.ACTIVE
        and task.members.filter(pk=session.pk).exists()
    )


def live_session_and_route(
    token_hash: str,
    now: datetime,
    route_key: str,
    *,
    meanwhile: Callable[[], None] | None = None,
    follow: Follow | None = None,
) -> AgentSession | None:
    """`live_session`, answering `admitted_route(session, route_key)` in the same statement.

    The answer stays on this session instance, which lives for one request, for
    `checked_route` to hand to the route permission. `meanwhile` is called while the
    statement runs; it must not use the database connection (`statements.run_each`).
    `follow`'s statements are sent right behind it (`statements.first_row`).
    """
    fetched = _fetch(
        AgentSession, _LIVE_SESSION_AND_ROUTE, [token_hash, now, route_key], meanwhile, follow
    )
    if fetched is None:
        return None
    session = _session(*fetched)
    setattr(session, _CHECKED_ROUTE, (route_key, _route(*fetched)))
    return session


def checked_route(session: AgentSession, route_key: str) -> tuple[bool, Route | None]:
    """`(True, route or None)` if `live_session_and_route` already answered for `route_key`."""
    checked = getattr(session, _CHECKED_ROUTE, None)
    if checked is None or checked[0] != route_key:
        return False, None
    return True, checked[1]
