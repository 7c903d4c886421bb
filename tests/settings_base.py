"""Settings shared by the test suite and the benchmarks: one Django project, two databases.

`tests.settings` and `benchmarks.settings` start from here and add their database and URLs.
`database()` gives the `DATABASES` entry: `DATABASE_URL`'s database at once when it is set,
otherwise the embedded PostgreSQL, started only by `start_database()`, so a test run that
needs no database starts no server.
"""

import os
from pathlib import Path
from typing import Any

from bailing_knowledge.embedded import DATABASE_URL_ENV, database_settings, database_url

ROOT = Path(__file__).resolve().parent.parent

DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "bailing_knowledge",
]

MIDDLEWARE = [
    "bailing_knowledge.middleware.NoStoreMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
STATIC_URL = "/static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Both send hundreds of requests per minute from one session; throttle tests set their own.
BAILING_KNOWLEDGE = {"THROTTLE_RATES": {"session": None, "client": None}}

# Where a `database()` entry keeps the embedded server's folder until `start_database()`.
_EMBEDDED_FOLDER = "EMBEDDED_FOLDER"


def database(folder: Path, *, lazy: bool = False, **extra: Any) -> dict[str, Any]:
    """A `DATABASES` entry: `DATABASE_URL`, else the embedded server in `folder`.

    With `lazy`, the embedded server is not started here: the entry names no database until
    `start_database()` fills it in (Django refuses to connect before, for want of a NAME).
    """
    if os.environ.get(DATABASE_URL_ENV, "").strip() or not lazy:
        return database_settings(database_url(folder), **extra)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "",
        _EMBEDDED_FOLDER: folder,
        **extra,
    }


def start_database(entry: dict[str, Any]) -> None:
    """Start the embedded server of a lazy `database()` entry and complete the entry in place.

    In place, because Django's connection objects hold this very dict.
    """
    folder = entry.pop(_EMBEDDED_FOLDER, None)
    if folder is not None:
        entry.update(database_settings(database_url(folder)))
