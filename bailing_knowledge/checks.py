"""System checks: misconfiguration is reported at start-up, not at the first agent call."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, router
from django.utils.module_loading import import_string

from .conf import DEFAULTS, SETTINGS_NAME, knowledge_settings, nearest_name
from .ingestion.chunker import MIN_TARGET_CHARS


@checks.register(checks.Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    user = getattr(settings, SETTINGS_NAME, {})
    if not isinstance(user, dict):
        return [checks.Error(f"{SETTINGS_NAME} must be a dict.", id="bailing_knowledge.E001")]
    if not apps.is_installed("django.contrib.postgres"):
        errors.append(
            checks.Error(
                "'django.contrib.postgres' must be in INSTALLED_APPS.",
                hint="bailing_knowledge's indexes and full-text lookups rely on it.",
                id="bailing_knowledge.E005",
            )
        )
    if "bailing_knowledge.middleware.NoStoreMiddleware" not in getattr(settings, "MIDDLEWARE", []):
        errors.append(
            checks.Warning(
                "bailing_knowledge.middleware.NoStoreMiddleware is not in MIDDLEWARE.",
                hint="Add it so that every answer under the agent API prefix, including "
                "errors raised outside the app's views, carries Cache-Control: no-store.",
                id="bailing_knowledge.W001",
            )
        )
    errors.extend(check_connect_timeout(getattr(settings, "DATABASES", {}).get("default", {})))
    errors.extend(_check_keys(user))
    errors.extend(_check_values())
    embedders = knowledge_settings.EMBEDDERS
    if not isinstance(embedders, dict) or "default" not in embedders:
        errors.append(
            checks.Error(
                f"{SETTINGS_NAME}['EMBEDDERS'] must be a dict with a 'default' alias.",
                id="bailing_knowledge.E003",
            )
        )
    else:
        errors.extend(_check_embedders(embedders))
    errors.extend(_check_bm25())
    return errors


# Keys the app read once, with what replaces them: a warning says what to do, not "unknown".
REMOVED_KEYS = {
    "TASK_RUNNER": (
        "Ingestion runs on Django's task framework now: remove TASK_RUNNER and choose a "
        "backend in the TASKS setting (the immediate backend, the default, indexes inline as "
        "the old default did; the database backend and `manage.py db_worker` queue it). "
        "Keep the worker of your old runner until its queue is empty (docs/ingestion.md)."
    ),
    "SEARCH_COMMON_TERM_CHUNKS": (
        "The lexical leg reads only the top of each term's list, so common terms need no cap "
        "any more: remove the key (SEARCH_LEXICAL_READ_BUDGET bounds the chunks a search "
        "reads)."
    ),
}


def _check_keys(user: dict[str, Any]) -> list[checks.CheckMessage]:
    """A key the app does not read is a typo or a leftover: either way, not what was meant."""
    errors: list[checks.CheckMessage] = [
        checks.Warning(
            f"{SETTINGS_NAME}[{key!r}] is no longer read.",
            hint=REMOVED_KEYS[key],
            id="bailing_knowledge.W003",
        )
        for key in sorted(set(user) & set(REMOVED_KEYS))
    ]
    for key in sorted(set(user) - set(DEFAULTS) - set(REMOVED_KEYS), key=str):
        hint = nearest_name(str(key), DEFAULTS)
        errors.append(
            checks.Error(
                f"{SETTINGS_NAME} has the unknown key {key!r}.",
                hint=f"Did you mean {hint!r}?"
                if hint
                else "docs/configuration.md lists the keys the app reads.",
                id="bailing_knowledge.E010",
            )
        )
    return errors


# Rates as DRF's SimpleRateThrottle parses them: requests / a period it reads by its first
# letter (s, m, h, d), e.g. "120/min" or "5000/day".
_RATE = re.compile(r"[1-9][0-9]*/(s|sec|second|m|min|minute|h|hour|d|day)s?")
_THROTTLE_SCOPES = ("session", "client")


def _integer(low: int, high: int | None = None) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            return f"an integer ≥ {low}" if high is None else f"an integer from {low} to {high}"
        if high is not None and value > high:
            return f"an integer from {low} to {high}"
        return None

    return check


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else "True or False"


def _number(low: float, high: float) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"a number from {low} to {high}"
        return None if low <= value <= high else f"a number from {low} to {high}"

    return check


def _throttle_rates(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        return 'a dict such as {"session": "120/min", "client": "600/min"}'
    for scope, rate in value.items():
        if scope not in _THROTTLE_SCOPES:
            hint = nearest_name(str(scope), _THROTTLE_SCOPES)
            return f"keyed by {' and '.join(_THROTTLE_SCOPES)}; {scope!r} is neither" + (
                f" (did you mean {hint!r}?)" if hint else ""
            )
        if rate is not None and not (isinstance(rate, str) and _RATE.fullmatch(rate)):
            return (
                f"rates written N/period (s, min, hour or day), e.g. '120/min', "
                f"or None to turn a scope off; {scope!r} has {rate!r}"
            )
    return None


def _cache_alias(value: Any) -> str | None:
    caches = getattr(settings, "CACHES", {"default": {}})
    if isinstance(value, str) and value in caches:
        return None
    return f"one of the CACHES aliases ({', '.join(map(repr, caches))})"


def _url_prefix(value: Any) -> str | None:
    ok = isinstance(value, str) and value.startswith("/") and value.endswith("/")
    return None if ok else "a path that starts and ends with '/', e.g. '/agent-api/'"


def _callable_path(optional: bool) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if optional and value is None:
            return None
        wanted = "the dotted path of a callable" + (", or None" if optional else "")
        if not isinstance(value, str):
            return wanted
        try:
            target = import_string(value)
        except ImportError as exc:
            return f"{wanted}; {value!r} cannot be imported ({exc})"
        return None if callable(target) else f"{wanted}; {value!r} is not callable"

    return check


def _any(value: Any) -> str | None:
    return None


# Upper bounds where a larger value breaks rather than loosens: PostgreSQL takes timeouts and
# row counts as 32-bit integers, and an expiry past ten years only courts date overflow.
_PG_INT_MAX = 2**31 - 1
_TEN_YEARS = 3650 * 24 * 3600

# What each key must be: a check returning None when the value is fine, or what it must be.
# EMBEDDERS gets its own checks (`_check_embedders`), BM25 its own id (E006).
VALIDATORS: dict[str, Callable[[Any], str | None]] = {
    "SESSION_DEFAULT_LIFETIME": _integer(1, _TEN_YEARS),
    "SESSION_MAX_LIFETIME": _integer(1, _TEN_YEARS),
    "SESSION_LAST_SEEN_INTERVAL": _integer(0, _TEN_YEARS),
    "URL_PREFIX": _url_prefix,
    "THROTTLE_RATES": _throttle_rates,
    "THROTTLE_CACHE": _cache_alias,
    "CHUNK_TARGET_CHARS": _integer(MIN_TARGET_CHARS),
    "CHUNK_OVERLAP_CHARS": _integer(0),
    "SEARCH_CANDIDATES": _integer(1, 1000),
    "SEARCH_MIN_SIMILARITY": _number(-1.0, 1.0),
    "SEARCH_EF_SEARCH": _integer(1, 1000),  # pgvector's bounds for hnsw.ef_search
    "SEARCH_BM25_K1": _any,
    "SEARCH_BM25_B": _any,
    "SEARCH_LEXICAL_READ_BUDGET": _integer(1, _PG_INT_MAX),
    "SEARCH_LEXICAL_PRUNING": _number(1.0, 10.0),
    "SEARCH_SEND_AHEAD": _boolean,
    "SEARCH_STATEMENT_TIMEOUT_MS": _integer(0, _PG_INT_MAX),
    "MAX_BODY_BYTES": _integer(1),
    "MAX_JSON_DEPTH": _integer(1),
    "DATABASE_WAIT_MS": _integer(0, _PG_INT_MAX),
    "INLINE_MAX_BYTES": _integer(0),
    "TURN_CONTEXT_HOOK": _callable_path(optional=True),
    "EMBEDDERS": _any,
}


def _check_values() -> list[checks.CheckMessage]:
    """Each value of the right type and range, so a typo fails `check`, not every request."""
    problems: list[str] = []
    for key, validate in VALIDATORS.items():
        wanted = validate(getattr(knowledge_settings, key))
        if wanted:
            problems.append(f"{SETTINGS_NAME}['{key}'] must be {wanted}.")
    if not problems:
        if knowledge_settings.SESSION_DEFAULT_LIFETIME > knowledge_settings.SESSION_MAX_LIFETIME:
            problems.append(
                f"{SETTINGS_NAME}['SESSION_DEFAULT_LIFETIME'] may not exceed SESSION_MAX_LIFETIME."
            )
        if 2 * knowledge_settings.CHUNK_OVERLAP_CHARS >= knowledge_settings.CHUNK_TARGET_CHARS:
            problems.append(
                f"{SETTINGS_NAME}['CHUNK_OVERLAP_CHARS'] must be less than half of "
                "CHUNK_TARGET_CHARS."
            )
    return [checks.Error(problem, id="bailing_knowledge.E011") for problem in problems]


def check_connect_timeout(database: dict[str, Any]) -> list[checks.CheckMessage]:
    """Connecting is the one database wait the app cannot cut short: it must fit the budget."""
    budget_ms = knowledge_settings.DATABASE_WAIT_MS or 0
    if not budget_ms or database.get("ENGINE") != "django.db.backends.postgresql":
        return []
    timeout = (database.get("OPTIONS") or {}).get("connect_timeout")
    try:
        fits = timeout is not None and 0 < float(timeout) * 1000 <= budget_ms
    except (TypeError, ValueError):
        fits = False
    if fits:
        return []
    return [
        checks.Warning(
            "The default database has no connect_timeout within "
            f"{SETTINGS_NAME}['DATABASE_WAIT_MS'] ({budget_ms} ms).",
            hint="Set DATABASES['default']['OPTIONS']['connect_timeout'] = 2 so that a "
            "request to an unreachable database fails within the wait budget.",
            id="bailing_knowledge.W002",
        )
    ]


def _check_embedders(embedders: dict[str, Any]) -> list[checks.CheckMessage]:
    """Each alias names an importable backend whose optional package is installed.

    A missing extra is found by name, so that it fails the start-up rather than the first
    search; then the entry is built and closed (its options checked), except a backend that
    loads a model when built, whose option names alone are checked: no model is loaded here.
    """
    from .models import KnowledgeBase
    from .retrieval.embedders import backend_class, check_embedder

    # A knowledge base stores its embedder's alias: the column bounds what an alias may be.
    longest = KnowledgeBase._meta.get_field("embedder").max_length
    errors: list[checks.CheckMessage] = []
    aliases: list[str] = []
    for alias in embedders:
        if isinstance(alias, str) and 0 < len(alias) <= longest:
            aliases.append(alias)
            continue
        errors.append(
            checks.Error(
                f"{SETTINGS_NAME}['EMBEDDERS'] alias {alias!r} must be a string of 1 to "
                f"{longest} characters.",
                id="bailing_knowledge.E007",
            )
        )
    for alias in sorted(aliases):
        try:
            backend = backend_class(alias)
        except ImproperlyConfigured as exc:
            errors.append(checks.Error(str(exc), id="bailing_knowledge.E007"))
            continue
        missing = backend.missing_requirement()
        if missing:
            errors.append(
                checks.Error(
                    f"{SETTINGS_NAME}['EMBEDDERS'][{alias!r}] uses {backend.__name__}, whose "
                    "package is not installed.",
                    hint=missing,
                    id="bailing_knowledge.E008",
                )
            )
            continue
        try:
            check_embedder(alias)
        except ImproperlyConfigured as exc:
            errors.append(checks.Error(str(exc), id="bailing_knowledge.E007"))
    return errors


def _check_bm25() -> list[checks.CheckMessage]:
    """k1 ≥ 0 and 0 ≤ b ≤ 1, as BM25 defines them; anything else ranks nonsense."""
    errors: list[checks.CheckMessage] = []
    for name, high in (("SEARCH_BM25_K1", None), ("SEARCH_BM25_B", 1.0)):
        value = getattr(knowledge_settings, name)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not 0 <= value < float("inf")
            or (high is not None and value > high)
        ):
            bounds = "between 0 and 1" if high is not None else "a finite number ≥ 0"
            errors.append(
                checks.Error(
                    f"{SETTINGS_NAME}['{name}'] must be {bounds}, not {value!r}.",
                    id="bailing_knowledge.E006",
                )
            )
    return errors


@checks.register(checks.Tags.database)
def check_database(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Run only when asked for database checks (`migrate`, `check --database default`)."""
    from .database import database_problems

    errors: list[checks.CheckMessage] = []
    for alias in databases or ():
        if not router.allow_migrate(alias, "bailing_knowledge"):
            continue
        connection = connections[alias]
        for problem in database_problems(connection):
            errors.append(checks.Error(problem, obj=alias, id="bailing_knowledge.E004"))
    return errors
