"""System checks: misconfiguration is reported at start-up, not at the first agent call."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, router

from .conf import SETTINGS_NAME, knowledge_settings


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

    Nothing is built here (no model is loaded): a missing extra is found by name, so that it
    fails the start-up rather than the first search.
    """
    from .retrieval.embedders import backend_class

    errors: list[checks.CheckMessage] = []
    for alias in sorted(embedders):
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
