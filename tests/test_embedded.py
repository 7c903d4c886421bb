"""The embedded PostgreSQL helper and DATABASE_URL parsing."""

from __future__ import annotations

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
    assert config["OPTIONS"] == {"sslmode": "require"}
    assert config["CONN_MAX_AGE"] == 60


@pytest.mark.parametrize("url", ["mysql://x/y", "sqlite:///db.sqlite3", "not a url"])
def test_other_databases_are_refused(url):
    with pytest.raises(ImproperlyConfigured):
        embedded.database_settings(url)


def test_the_embedded_server_gets_room_for_its_indexes(monkeypatch, tmp_path):
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("BAILING_PG_SHARED_BUFFERS", "256MB")
    url = embedded.database_url(tmp_path / "pg")
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
