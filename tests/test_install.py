"""Installing the app into an existing Django project, and the migrations themselves."""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from io import StringIO
from pathlib import Path

import httpx
import psycopg
import pytest
from django.conf import settings
from django.core.management import call_command
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from psycopg import sql

from bailing_knowledge.database import CREATED_MARK

from . import connection_url

SETTINGS = """
import json
import os

from bailing_knowledge.embedded import database_settings

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
DATABASES = {"default": database_settings(
    os.environ["HOST_DB_URL"],
    OPTIONS={"connect_timeout": 2, **json.loads(os.environ.get("HOST_DB_OPTIONS", "{}"))},
)}
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


SEARCH_SMOKE = """
import django, json
django.setup()
from django.test import Client
from bailing_knowledge import services
from bailing_knowledge.ingestion.documents import upsert_document

kb = services.create_knowledge_base("policies")
upsert_document(kb, "refunds.md", "Refunds", "# Refunds\\n\\nRefunds are paid within five days.")
route = services.create_route("help", knowledge_bases=[kb])
client = services.create_client("helper", routes=[route])
issued = services.issue_session(client, principal_id="p", routes=[route])
answer = Client().post(
    "/agent-api/v1/workspaces/help/knowledge/search",
    data=json.dumps({"query": "when are refunds paid"}),
    content_type="application/json",
    headers={"Authorization": "Bearer " + issued.access_token},
)
assert answer.status_code == 200, answer.content
print(json.loads(answer.content)["hints"][0]["title"])
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


def _admin(dbname: str | None = None) -> psycopg.Connection:
    conninfo = {k: v for k, v in _admin_conninfo().items() if v}
    if dbname:
        conninfo["dbname"] = dbname
    return psycopg.connect(**conninfo, autocommit=True)


def test_urls_carry_the_password():
    url = connection_url({"user": "app", "password": "p@ss:/w", "host": "db", "port": 5433}, "kb")
    assert psycopg.conninfo.conninfo_to_dict(url) == {
        "user": "app",
        "password": "p@ss:/w",
        "host": "db",
        "port": "5433",
        "dbname": "kb",
    }


@pytest.fixture
def scratch_database(database_server):
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


def _host(tmp_path: Path, url: str, options: dict | None = None) -> Callable[..., str]:
    """A project of its own, as `startproject` lays one out, using the app on `url` (with
    these database `OPTIONS` added).

    Returns a function that runs Python in that project and gives back its stdout (with its
    stderr when the run is expected to fail, `ok=False`).
    """
    (tmp_path / "host").mkdir()
    (tmp_path / "host" / "__init__.py").write_text("")
    (tmp_path / "host" / "settings.py").write_text(textwrap.dedent(SETTINGS))
    (tmp_path / "host" / "urls.py").write_text(textwrap.dedent(URLS))
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "host.settings",
        "PYTHONPATH": str(tmp_path),
        "HOST_DB_URL": url,
        "HOST_DB_OPTIONS": json.dumps(options or {}),
    }

    def run(*args: str, ok: bool = True) -> str:
        result = subprocess.run(
            [sys.executable, *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert (result.returncode == 0) == ok, result.stdout + result.stderr
        return result.stdout if ok else result.stdout + result.stderr

    return run


def test_existing_project_installs_migrates_and_serves(tmp_path, scratch_database):
    run = _host(tmp_path, connection_url(_admin_conninfo(), scratch_database))
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


def test_the_demo_seeds_idempotently_and_prints_credentials(tmp_path, scratch_database, app_role):
    """What `make demo` runs before serving, twice in a row, on an empty database.

    As a role whose password the server asks for: the URL handed to the process must carry it.
    """
    conninfo, _ = app_role
    with _admin(scratch_database) as conn:
        conn.execute("CREATE EXTENSION vector")
    url = connection_url(conninfo, scratch_database)
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
    """`make demo` end to end: the example project's embedder is WordLlama, so the query the
    demo suggests, which shares no word with the refund policy ("money back"), finds it
    first, over real HTTP."""
    pytest.importorskip("wordllama")
    url = connection_url(_admin_conninfo(), scratch_database)
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
                # The query of the `curl` line the demo prints, as a first user would try it.
                suggested = re.search(r"-d '(\{.*?\})'", log.read_text())
                assert suggested is not None, log.read_text()
                answer = httpx.post(
                    search,
                    json=json.loads(suggested.group(1)),
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


@contextmanager
def _password_required(conn: psycopg.Connection, role: str) -> Iterator[bool]:
    """Make the server ask `role` for its password, when the test may edit its pg_hba.conf.

    The embedded server trusts every local connection; a server of the operator's own
    (DATABASE_URL) keeps its own rules, and the test then relies on them.
    """
    hba = Path(conn.execute("SHOW hba_file").fetchone()[0])
    try:
        original = hba.read_text()
        hba.write_text(
            f"local all {role} scram-sha-256\n"
            f"host all {role} 127.0.0.1/32 scram-sha-256\n"
            f"host all {role} ::1/128 scram-sha-256\n" + original
        )
    except OSError:
        yield False
        return
    conn.execute("SELECT pg_reload_conf()")
    try:
        yield True
    finally:
        hba.write_text(original)
        conn.execute("SELECT pg_reload_conf()")


@pytest.fixture
def app_role(scratch_database):
    """A login role that is not a superuser, with a password, owning the scratch database."""
    role = f"bk_app_{uuid.uuid4().hex[:10]}"
    password = secrets.token_urlsafe(12) + "@:/"
    with _admin() as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} NOSUPERUSER NOCREATEDB NOCREATEROLE").format(
                sql.Identifier(role), sql.Literal(password)
            )
        )
        conn.execute(
            sql.SQL("ALTER DATABASE {} OWNER TO {}").format(
                sql.Identifier(scratch_database), sql.Identifier(role)
            )
        )
        try:
            with _password_required(conn, role) as enforced:
                yield {**_admin_conninfo(), "user": role, "password": password}, enforced
        finally:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(scratch_database)
                )
            )
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def _vector_comment(dbname: str) -> str | None:
    with _admin(dbname) as conn:
        row = conn.execute(
            "SELECT obj_description(oid, 'pg_extension') FROM pg_extension WHERE extname = 'vector'"
        ).fetchone()
    return None if row is None else row[0] or ""


def test_a_role_without_superuser_rights_migrates_and_searches(
    tmp_path, scratch_database, app_role
):
    conninfo, enforced = app_role
    # The embedded server is the test's own: it must be made to ask for the password.
    assert enforced or os.environ.get("DATABASE_URL")
    if enforced:
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(**{**conninfo, "dbname": scratch_database, "password": ""}).close()
    run = _host(tmp_path, connection_url(conninfo, scratch_database))

    # Without the extension, migrate stops at the system check with the statement to run.
    refused = run("-m", "django", "migrate", "--noinput", ok=False)
    assert "bailing_knowledge.E004" in refused
    assert "CREATE EXTENSION vector;" in refused
    assert "Traceback" not in refused
    assert "DATABASE_URL" not in refused

    with _admin(scratch_database) as conn:
        conn.execute("CREATE EXTENSION vector")
    run("-m", "django", "migrate", "--noinput")
    run("-m", "django", "check", "--database", "default", "--fail-level", "WARNING")
    assert run("-c", textwrap.dedent(SEARCH_SMOKE)).strip() == "Refunds"

    # Reversing leaves the administrator's extension in place, and applying again works.
    run("-m", "django", "migrate", "bailing_knowledge", "zero", "--noinput")
    assert _vector_comment(scratch_database) is not None
    run("-m", "django", "migrate", "--noinput")


def test_reversing_drops_only_the_extension_the_migration_created(scratch_database, tmp_path):
    """As a superuser the migration creates `vector` and marks it; reversing drops it."""
    run = _host(tmp_path, connection_url(_admin_conninfo(), scratch_database))
    run("-m", "django", "migrate", "--noinput")
    assert _vector_comment(scratch_database).endswith(CREATED_MARK)
    run("-m", "django", "migrate", "bailing_knowledge", "zero", "--noinput")
    assert _vector_comment(scratch_database) is None


def test_a_project_binding_parameters_on_the_server_migrates_searches_and_reverses(
    scratch_database, tmp_path
):
    """Django's `server_side_binding` sends parameters apart from the statement, which a
    utility statement (the extension's comment) cannot take; with `prepare_threshold` 0 every
    statement is prepared, the search's too."""
    options = {"server_side_binding": True, "prepare_threshold": 0}
    run = _host(tmp_path, connection_url(_admin_conninfo(), scratch_database), options)
    run("-m", "django", "migrate", "--noinput")
    assert _vector_comment(scratch_database).endswith(CREATED_MARK)
    assert run("-c", textwrap.dedent(SEARCH_SMOKE)).strip() == "Refunds"
    run("-m", "django", "migrate", "bailing_knowledge", "zero", "--noinput")
    assert _vector_comment(scratch_database) is None


def test_the_example_warns_of_its_development_secret_key_only_for_deployment(database_server):
    manage = Path(__file__).resolve().parent.parent / "example_project" / "manage.py"
    env = {
        **{
            k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "SECRET_KEY")
        },
        "DATABASE_URL": connection_url(_admin_conninfo(), settings.DATABASES["default"]["NAME"]),
    }

    def check(*args: str) -> str:
        result = subprocess.run(
            [sys.executable, str(manage), "check", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return result.stdout + result.stderr

    assert "demo.W001" not in check()
    assert "demo.W001" in check("--deploy")
