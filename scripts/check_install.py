"""`make check-install`: install the built wheels as a new team would, and use them.

1. Builds the `bailing-knowledge` wheel and the `bailing-knowledge-client` wheel.
2. Starts a PostgreSQL server of its own (the embedded one, in a temporary folder) and
   prepares it as an administrator would for an application: a login role that is not a
   superuser, with a password the server asks for, owning the database, and the `vector`
   extension created by the administrator.
3. In a fresh virtualenv, installs the server wheel, runs `django-admin startproject`,
   configures the project as docs/installation.md says, migrates as that role, creates a
   knowledge base, ingests a file, sets up a route, a client and a session, serves the
   project, and searches and reads over HTTP.
4. In a second fresh virtualenv, installs the client wheel with its `mcp` extra, checks
   that no server-side package came with it, and has its MCP server answer a tool call
   against the running project.

Everything lives in a temporary folder that is removed afterwards; the exit status is
non-zero at the first step that fails, with its output.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ROLE = "knowledge_app"
DATABASE = "knowledge"
SERVER_ONLY = ("django", "djangorestframework", "psycopg", "pgvector", "drf-spectacular")

SETTINGS = """

# --- bailing_knowledge, as docs/installation.md says ---
from bailing_knowledge.embedded import database_settings, database_url

INSTALLED_APPS += ["django.contrib.postgres", "rest_framework", "bailing_knowledge"]
MIDDLEWARE.insert(0, "bailing_knowledge.middleware.NoStoreMiddleware")
DATABASES = {
    "default": database_settings(
        database_url(BASE_DIR / ".data" / "pgdata"),  # DATABASE_URL when set
        CONN_MAX_AGE=60,
        CONN_HEALTH_CHECKS=True,
    )
}
"""

URLS = """

from django.urls import include

urlpatterns += [path("agent-api/v1/", include("bailing_knowledge.urls"))]
"""

REFUNDS = """# Refund policy

Customers may return unused items within thirty days for a full refund. Refunds are paid to
the original payment method within five business days.
"""

MCP_CALL = """
import asyncio, json, os, sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main():
    params = StdioServerParameters(command=sys.argv[1], args=[], env=dict(os.environ))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        result = await session.call_tool("knowledge_search", {"query": "refund payment"})
        assert not result.is_error, result.content
        print(json.loads(result.content[0].text)["hints"][0]["title"])


asyncio.run(main())
"""


def step(title: str) -> None:
    print(f"check-install: {title}", flush=True)


def run(*args: str | Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    result = subprocess.run(
        [str(arg) for arg in args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode != 0:
        sys.exit(
            f"check-install: FAILED: {' '.join(map(str, args))}\n{result.stdout}{result.stderr}"
        )
    return result.stdout


def pip_install(venv: Path, *requirements: str) -> None:
    run(venv / "bin" / "python", "-m", "pip", "install", "--quiet", *requirements)


def fresh_venv(path: Path) -> Path:
    run(sys.executable, "-m", "venv", "--clear", path)
    return path


def http(method: str, url: str, token: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(  # noqa: S310 - a loopback URL of the check's own
        url,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
        return json.loads(answer.read())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


HOLDER = """
import sys
from bailing_knowledge.embedded import embedded_database_url
print(embedded_database_url(sys.argv[1]), flush=True)
sys.stdin.read()  # the server's user until the check closes this pipe
"""


def start_database(folder: Path) -> tuple[subprocess.Popen[str], str]:
    """A PostgreSQL of the check's own, kept running by a child process as its user."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "BAILING_PG_SHARED_BUFFERS": "128MB", "PYTHONPATH": str(ROOT)},
    )
    assert holder.stdout is not None
    return holder, holder.stdout.readline().strip()


def stop_database(holder: subprocess.Popen[str], folder: Path) -> None:
    """Close the holder's pipe; its server stops with its last user, then goes."""
    assert holder.stdin is not None
    holder.stdin.close()
    holder.wait(60)
    deadline = time.monotonic() + 60
    while (folder / "postmaster.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.2)


def prepare_database(admin_url: str) -> str:
    """The administrator's part: a role with a password, its database, the extension."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    password = secrets.token_urlsafe(16)
    with psycopg.connect(admin_url, autocommit=True) as admin:
        hba = Path(admin.execute("SHOW hba_file").fetchone()[0])
        hba.write_text(f"local all {ROLE} scram-sha-256\n" + hba.read_text())
        admin.execute("SELECT pg_reload_conf()")
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} NOSUPERUSER NOCREATEDB NOCREATEROLE").format(
                sql.Identifier(ROLE), sql.Literal(password)
            )
        )
        admin.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(DATABASE), sql.Identifier(ROLE)
            )
        )
    with psycopg.connect(make_conninfo(admin_url, dbname=DATABASE), autocommit=True) as db:
        db.execute("CREATE EXTENSION vector")
    params = conninfo_to_dict(admin_url)
    where = "&".join(f"{key}={params[key]}" for key in ("host", "port") if params.get(key))
    try:
        psycopg.connect(f"postgresql://{ROLE}@/{DATABASE}?{where}").close()
    except psycopg.OperationalError:
        pass
    else:
        sys.exit("check-install: FAILED: the server let the role in without its password")
    return f"postgresql://{ROLE}:{password}@/{DATABASE}?{where}"


def main() -> None:
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="bk-check-install-"))
    server = holder = None
    try:
        step("building the wheels")
        dist = work / "dist"
        run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", dist, ROOT)
        full_wheel = next(dist.glob("bailing_knowledge-*.whl"))
        client_wheel = run(sys.executable, ROOT / "scripts" / "build_client_dist.py", dist)
        client_wheel = client_wheel.strip().splitlines()[-1]

        step("PostgreSQL: a role with a password, not a superuser; the extension by an admin")
        holder, admin_url = start_database(work / "pg")
        url = prepare_database(admin_url)

        step("server virtualenv: the wheel, startproject, settings as documented")
        venv = fresh_venv(work / "server-venv")
        pip_install(venv, f"{full_wheel}[binary]")
        python = venv / "bin" / "python"
        run(venv / "bin" / "django-admin", "startproject", "helpdesk", cwd=work)
        project = work / "helpdesk"
        with (project / "helpdesk" / "settings.py").open("a") as settings:
            settings.write(SETTINGS)
        with (project / "helpdesk" / "urls.py").open("a") as urls:
            urls.write(URLS)
        env = {**os.environ, "DATABASE_URL": url}
        env.pop("DJANGO_SETTINGS_MODULE", None)
        manage = (python, project / "manage.py")

        step("migrate and check as the role")
        run(*manage, "migrate", "--noinput", env=env)
        run(*manage, "check", "--database", "default", "--fail-level", "WARNING", env=env)

        step("knowledge base, ingestion, route, client, session")
        files = work / "handbook"
        files.mkdir()
        (files / "refunds.md").write_text(REFUNDS)
        run(*manage, "knowledge_base", "create", "handbook", env=env)
        ingested = json.loads(
            run(*manage, "knowledge_ingest", "handbook", files, "--json", env=env)
        )
        assert ingested["new"] == 1 and ingested["failed"] == 0, ingested
        run(*manage, "knowledge_route", "create", "support", "--kb", "handbook", env=env)
        run(*manage, "agent_client", "create", "helpdesk-bot", "--route", "support", env=env)
        issued = run(
            *manage,
            "agent_session",
            "issue",
            "helpdesk-bot",
            "--principal",
            "alice",
            "--route",
            "support",
            "--json",
            env=env,
        )
        token = json.loads(issued)["access_token"]

        step("serving, then search and read over HTTP")
        port = free_port()
        hub = f"http://127.0.0.1:{port}"
        server = subprocess.Popen(
            [*map(str, manage), "runserver", f"127.0.0.1:{port}", "--noreload"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        api = f"{hub}/agent-api/v1/workspaces/support/knowledge"
        for _ in range(100):
            try:
                capabilities = http("GET", f"{api}/capabilities", token)
                break
            except OSError:
                time.sleep(0.2)
        else:
            sys.exit("check-install: FAILED: the project did not answer\n" + server.stderr.read())
        assert capabilities["route"] == "support", capabilities
        found = http("POST", f"{api}/search", token, {"query": "when are refunds paid"})
        hint = found["hints"][0]
        assert hint["title"] == "Refund policy", found
        page = http("POST", f"{api}/read", token, {"ref": hint["ref"]})
        assert "five business days" in page["content"], page

        step("client virtualenv: the client wheel with mcp, no server stack")
        client = fresh_venv(work / "client-venv")
        pip_install(client, f"{client_wheel}[mcp]")
        installed = {
            line.split("==")[0].lower()
            for line in run(client / "bin" / "python", "-m", "pip", "freeze").splitlines()
        }
        stray = sorted(installed & set(SERVER_ONLY))
        if stray:
            sys.exit(f"check-install: FAILED: the client distribution installed {stray}")
        run(client / "bin" / "python", "-c", "import bailing_knowledge.client.mcp_server")
        no_django = subprocess.run(
            [client / "bin" / "python", "-c", "import django"], capture_output=True
        )
        if no_django.returncode == 0:
            sys.exit("check-install: FAILED: Django is importable in the client virtualenv")

        step("the client's MCP server answers a tool call against the project")
        mcp_env = {
            **os.environ,
            "BAILING_HUB_URL": hub,
            "BAILING_ROUTE": "support",
            "BAILING_ACCESS_TOKEN": token,
        }
        mcp_env.pop("PYTHONPATH", None)
        title = run(
            client / "bin" / "python",
            "-c",
            textwrap.dedent(MCP_CALL),
            client / "bin" / "bailing-knowledge-mcp",
            env=mcp_env,
            cwd=work,
        )
        assert title.strip() == "Refund policy", title
        print(f"check-install: OK in {time.monotonic() - started:.0f} s", flush=True)
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
        if holder is not None:
            stop_database(holder, work / "pg")
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
