"""Installing the app into an existing Django project, and the migrations themselves."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from importlib import metadata
from io import StringIO
from pathlib import Path

import httpx
import psycopg
import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from psycopg import sql

from bailing_knowledge.database import PGVECTOR_MISSING, database_problems

SETTINGS = """
import os

SECRET_KEY = "throwaway"
DEBUG = False
ALLOWED_HOSTS = ["testserver"]
USE_TZ = True
ROOT_URLCONF = "host.urls"
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
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
DATABASES = {"default": {
    "ENGINE": "django.db.backends.postgresql",
    "NAME": os.environ["HOST_DB_NAME"],
    "HOST": os.environ["HOST_DB_HOST"],
    "PORT": os.environ["HOST_DB_PORT"],
    "USER": os.environ["HOST_DB_USER"],
    "PASSWORD": os.environ["HOST_DB_PASSWORD"],
    "OPTIONS": {"connect_timeout": 2},
}}
STATIC_URL = "/static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
"""

URLS = """
from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("agent-api/v1/", include("bailing_knowledge.urls")),
]
"""

SMOKE = """
import django, json
django.setup()
from django.test import Client
from bailing_knowledge import services

kb = services.create_knowledge_base("faq")
route = services.create_route("support", knowledge_bases=[kb])
client = services.create_client("bot", routes=[route])
issued = services.issue_session(client, principal_id="p", routes=[route])
url = "/agent-api/v1/workspaces/support/knowledge/capabilities"
http = Client()
assert http.get(url).status_code == 401
answer = http.get(url, headers={"Authorization": "Bearer " + issued.access_token})
assert answer.status_code == 200, answer.content
assert answer["Cache-Control"] == "no-store"
print(json.loads(answer.content)["route"])
"""


def _admin_conninfo() -> dict:
    db = settings.DATABASES["default"]
    return {
        "dbname": db["NAME"],
        "host": db["HOST"],
        "port": db["PORT"],
        "user": db["USER"],
        "password": db["PASSWORD"],
    }


@pytest.fixture
def scratch_database():
    """A fresh, empty database on the test server, dropped afterwards."""
    name = f"bk_install_{uuid.uuid4().hex[:12]}"
    conninfo = {k: v for k, v in _admin_conninfo().items() if v}
    with psycopg.connect(**conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with psycopg.connect(**conninfo, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def test_existing_project_installs_migrates_and_serves(tmp_path, scratch_database):
    (tmp_path / "host").mkdir()
    (tmp_path / "host" / "__init__.py").write_text("")
    (tmp_path / "host" / "settings.py").write_text(textwrap.dedent(SETTINGS))
    (tmp_path / "host" / "urls.py").write_text(textwrap.dedent(URLS))
    db = _admin_conninfo()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "host.settings",
        "PYTHONPATH": str(tmp_path),
        "HOST_DB_NAME": scratch_database,
        "HOST_DB_HOST": db["host"] or "",
        "HOST_DB_PORT": str(db["port"] or ""),
        "HOST_DB_USER": db["user"] or "",
        "HOST_DB_PASSWORD": db["password"] or "",
    }

    def run(*args: str) -> str:
        result = subprocess.run(
            [sys.executable, *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    run("-m", "django", "migrate", "--noinput")
    assert "[X] 0001_initial" in run("-m", "django", "showmigrations", "bailing_knowledge")
    run("-m", "django", "check", "--database", "default", "--fail-level", "WARNING")
    assert run("-c", textwrap.dedent(SMOKE)).strip() == "support"


@pytest.mark.django_db
def test_makemigrations_is_clean():
    out = StringIO()
    call_command("makemigrations", "bailing_knowledge", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


@pytest.mark.django_db
def test_migrations_reverse_and_reapply():
    call_command("migrate", "bailing_knowledge", "zero", verbosity=0)
    call_command("migrate", "bailing_knowledge", verbosity=0)


class _Cursor:
    def __init__(self, row):
        self.row = row

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def execute(self, *args):
        pass

    def fetchone(self):
        return self.row


class _Connection:
    vendor = "postgresql"
    pg_version = 160000

    def __init__(self, row):
        self.row = row

    def cursor(self):
        return _Cursor(self.row)


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        (None, PGVECTOR_MISSING),
        (("0.5.1", None), "pgvector 0.5.1 is too old"),
    ],
)
def test_database_problems_explain_missing_or_old_pgvector(row, expected):
    problems = database_problems(_Connection(row))
    assert any(expected in p for p in problems)


def test_database_problems_accept_a_current_pgvector():
    assert database_problems(_Connection(("0.8.0", "0.8.0"))) == []


def test_migration_stops_with_the_message_when_pgvector_is_missing(monkeypatch):
    from bailing_knowledge import database

    monkeypatch.setattr(database, "database_problems", lambda connection: [PGVECTOR_MISSING])

    class Editor:
        connection = _Connection(None)

    with pytest.raises(ImproperlyConfigured, match="pgvector"):
        database.CreateVectorExtension().database_forwards(
            "bailing_knowledge", Editor(), None, None
        )


def test_the_demo_seeds_idempotently_and_prints_credentials(tmp_path, scratch_database):
    """What `make demo` runs before serving, twice in a row, on an empty database."""
    db = _admin_conninfo()
    host = db["host"] or "localhost"
    url = f"postgresql://{db['user'] or ''}@/{scratch_database}?host={host}"
    if db["port"]:
        url += f"&port={db['port']}"
    env = {
        **{k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        "DATABASE_URL": url,
        "DEMO_ADMIN_PASSWORD_FILE": str(tmp_path / "password"),
    }
    manage = Path(__file__).resolve().parent.parent / "example_project" / "manage.py"
    outputs = []
    for _ in range(2):
        result = subprocess.run(
            [sys.executable, str(manage), "demo", "--no-serve"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        outputs.append(result.stdout)
    for output in outputs:
        assert "BAILING_HUB_URL=http://127.0.0.1:8000" in output
        assert "BAILING_ROUTE=demo" in output
        assert "BAILING_ACCESS_TOKEN=bka_" in output
        assert "user 'admin'" in output
    tokens = [line for out in outputs for line in out.splitlines() if "ACCESS_TOKEN=" in line]
    assert len(set(tokens)) == 2
    assert (tmp_path / "password").read_text().strip() in outputs[1]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_demo_serves_and_finds_a_paraphrase_with_wordllama(tmp_path, scratch_database):
    """`make demo` end to end: the example project's embedder is WordLlama, so a query that
    shares no word with the refund policy ("money back") finds it first, over real HTTP."""
    pytest.importorskip("wordllama")
    db = _admin_conninfo()
    host = db["host"] or "localhost"
    url = f"postgresql://{db['user'] or ''}@/{scratch_database}?host={host}"
    if db["port"]:
        url += f"&port={db['port']}"
    env = {
        **{k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        "DATABASE_URL": url,
        "DEMO_ADMIN_PASSWORD_FILE": str(tmp_path / "password"),
        "PYTHONUNBUFFERED": "1",
    }
    manage = Path(__file__).resolve().parent.parent / "example_project" / "manage.py"
    addr = f"127.0.0.1:{_free_port()}"
    log = tmp_path / "demo.log"
    with log.open("w") as output:
        server = subprocess.Popen(
            [sys.executable, str(manage), "demo", "--addr", addr],
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        search = f"http://{addr}/agent-api/v1/workspaces/demo/knowledge/search"
        deadline = time.monotonic() + 240
        token = None
        answer = None
        while answer is None:
            assert server.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
            found = re.search(r"BAILING_ACCESS_TOKEN=(\S+)", log.read_text())
            if token is None and found is None:
                continue
            token = found.group(1)
            try:
                answer = httpx.post(
                    search,
                    json={"query": "money back"},
                    headers={"Authorization": f"Bearer {token}"},
                    timeout=10,
                )
            except httpx.TransportError:
                continue  # not listening yet
        assert answer.status_code == 200, answer.text
        hints = answer.json()["hints"]
        assert hints[0]["title"] == "Refund policy", hints
    finally:
        server.terminate()
        server.wait(timeout=30)


def _base_requirements(distribution: str, seen: set[str]) -> set[str]:
    """The installed distributions `distribution` pulls in without any extra, recursively."""
    name = canonicalize_name(distribution)
    if name in seen:
        return seen
    seen.add(name)
    try:
        requires = metadata.requires(distribution) or []
    except metadata.PackageNotFoundError:
        return seen
    for line in requires:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            _base_requirements(requirement.name, seen)
    return seen


def test_installing_without_extras_brings_no_numpy_and_no_model():
    """`pip install bailing-knowledge`: the embedders beyond hashing are opt-in extras."""
    base = _base_requirements("bailing-knowledge", set())
    assert {"django", "psycopg", "pgvector"} <= base
    heavy = {"numpy", "wordllama", "tokenizers", "safetensors", "torch", "sentence-transformers"}
    assert not base & heavy
    extras = metadata.metadata("bailing-knowledge").get_all("Provides-Extra")
    assert {"wordllama", "demo", "dev"} <= {canonicalize_name(extra) for extra in extras}
