"""The MCP server, driven by the official MCP client SDK over stdio and streamable HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from bailing_knowledge.client import KnowledgeClient, ReferenceInvalid
from bailing_knowledge.client.mcp_server import ServerConfig, create_server, main

from .conftest import MANUAL, REFUNDS, DripHub, drip_answer, ready_run

ROOT = Path(__file__).resolve().parents[2]
live = pytest.mark.django_db(transaction=True)


def _env(hub, token: str | None = None, **extra: str) -> dict[str, str]:
    return {
        "BAILING_HUB_URL": hub.url,
        "BAILING_ROUTE": hub.route,
        "BAILING_ACCESS_TOKEN": token or hub.token,
        "PYTHONPATH": str(ROOT),
        **extra,
    }


def _stdio(hub, token: str | None = None, *args: str, **env: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "bailing_knowledge.client", *args],
        env=_env(hub, token, **env),
        cwd=str(ROOT),
    )


def _text(result) -> dict:
    assert len(result.content) == 1
    return json.loads(result.content[0].text)


@asynccontextmanager
async def _session(
    params: StdioServerParameters | None = None, transport=None
) -> AsyncIterator[ClientSession]:
    """An initialised MCP client session over stdio (`params`) or another transport."""
    async with (
        transport or stdio_client(params) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def _call(session: ClientSession, name: str, arguments: dict) -> tuple[bool, dict]:
    result = await session.call_tool(name, arguments)
    return result.is_error, _text(result)


@live
def test_stdio_server_searches_and_reads(hub, manual):
    async def scenario():
        async with _session(_stdio(hub)) as session:
            tools = {tool.name: tool for tool in (await session.list_tools()).tools}

            error, found = await _call(session, "knowledge_search", {"query": "refund"})
            assert not error and found["trust"] == "reference_only"
            ref = found["hints"][0]["ref"]
            error, document = await _call(session, "knowledge_read", {"ref": ref})
            assert not error

            error, manual = await _call(
                session, "knowledge_search", {"query": "forklift safety", "limit": 1}
            )
            manual_ref = manual["hints"][0]["ref"]
            error, page = await _call(
                session,
                "knowledge_read",
                {"ref": manual_ref, "follow": False, "max_bytes": 4096},
            )
            assert not error and page["next_cursor"]

            error, results = await _call(session, "search", {"query": "forklift safety"})
            assert not error
            error, fetched = await _call(session, "fetch", {"id": results["results"][0]["id"]})
            assert not error

            # The SDK validates arguments against the published schema first.
            bad = await session.call_tool("knowledge_search", {"query": "x", "limit": 9})
            assert bad.is_error and "limit" in bad.content[0].text
            return tools, found, document, page, results, fetched

    tools, found, document, page, results, fetched = asyncio.run(scenario())
    assert set(tools) == {"knowledge_search", "knowledge_read", "search", "fetch"}
    assert tools["knowledge_search"].input_schema["required"] == ["query"]
    assert tools["knowledge_read"].annotations.read_only_hint
    assert found["hints"][0]["title"] == "Refund policy"
    assert (document["content"], document["trust"]) == (REFUNDS, "reference_only")
    assert MANUAL.startswith(page["content"]) and len(page["content"]) < len(MANUAL)
    first = results["results"][0]
    assert first["title"] == "Forklift manual" and first["url"].startswith("bailing-knowledge://")
    assert (fetched["id"], fetched["text"]) == (first["id"], MANUAL)
    assert fetched["metadata"]["trust"] == "reference_only"


@live
def test_stdio_errors_are_tool_errors_with_the_code(hub):
    async def scenario():
        async with _session(_stdio(hub, "bka_" + "q" * 43)) as session:
            search = await session.call_tool("knowledge_search", {"query": "refund"})
            fetch = await session.call_tool("fetch", {"id": "AAAA"})
            return search, fetch

    search, fetch = asyncio.run(scenario())
    assert search.is_error and "unauthorized" in search.content[0].text
    assert _text(search)["error"] == "unauthorized"
    assert fetch.is_error and _text(fetch)["error"] == "unauthorized"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@live
def test_streamable_http_server(hub):
    port = _free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bailing_knowledge.client",
            "--transport",
            "streamable-http",
            "--port",
            str(port),
            "--tools",
            "knowledge",
        ],
        cwd=ROOT,
        env={**os.environ, **_env(hub)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)

        async def scenario():
            transport = streamable_http_client(f"http://127.0.0.1:{port}/mcp")
            async with _session(transport=transport) as session:
                names = [tool.name for tool in (await session.list_tools()).tools]
                found = _text(await session.call_tool("knowledge_search", {"query": "refund"}))
                return names, found

        names, found = asyncio.run(scenario())
    finally:
        process.terminate()
        process.wait(10)
    assert sorted(names) == ["knowledge_read", "knowledge_search"]
    assert found["hints"][0]["title"] == "Refund policy"


def test_configuration_errors_exit_cleanly(monkeypatch, capsys):
    for name in ("BAILING_HUB_URL", "BAILING_ACCESS_TOKEN", "BAILING_ROUTE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as caught:
        main([])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "BAILING_HUB_URL" in err and "BAILING_ACCESS_TOKEN" in err and "BAILING_ROUTE" in err

    monkeypatch.setenv("BAILING_HUB_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("BAILING_ROUTE", "orders")
    monkeypatch.setenv("BAILING_ACCESS_TOKEN", "bka_x")
    with pytest.raises(SystemExit) as caught:
        main(["--transport", "streamable-http", "--host", "0.0.0.0"])  # noqa: S104
    assert caught.value.code == 2 and "--allow-remote" in capsys.readouterr().err

    monkeypatch.setenv("BAILING_HUB_URL", "ftp://hub")
    with pytest.raises(SystemExit) as caught:
        main([])
    assert caught.value.code == 2 and "http" in capsys.readouterr().err


def test_config_never_shows_the_token():
    config = ServerConfig.from_env(
        {
            "BAILING_HUB_URL": "http://hub",
            "BAILING_ROUTE": "orders",
            "BAILING_ACCESS_TOKEN": "bka_s",
        }
    )
    assert "bka_s" not in repr(config)
    assert config.api_prefix == "/agent-api/v1"


@live
def test_a_run_id_reads_the_refs_of_its_run(hub):
    """On-demand delivery hands the model run-bound refs: they need the run's id."""
    run = ready_run(hub)
    with KnowledgeClient(hub.url, hub.route, hub.token) as client:
        ref = client.search("refund", run_id=run.run_id).hints[0].ref

    async def scenario(params):
        async with _session(params) as session:
            read = await _call(session, "knowledge_read", {"ref": ref})
            fetched = await _call(session, "fetch", {"id": ref})
            found = await _call(session, "knowledge_search", {"query": "refund"})
            return read, fetched, found

    (error, read), (fetch_error, fetched), (_, found) = asyncio.run(
        scenario(_stdio(hub, BAILING_RUN_ID=run.run_id))
    )
    assert not error and not fetch_error
    assert read["content"] == REFUNDS == fetched["text"]
    with KnowledgeClient(hub.url, hub.route, hub.token) as client, pytest.raises(ReferenceInvalid):
        client.read(found["hints"][0]["ref"])  # its own search's refs are bound to the run too

    (error, read), (fetch_error, fetched), _ = asyncio.run(scenario(_stdio(hub)))
    assert error and read["error"] == "knowledge_reference_invalid"
    assert fetch_error and fetched["error"] == "knowledge_reference_invalid"


def test_config_reads_the_run_id():
    environ = {"BAILING_HUB_URL": "http://hub", "BAILING_ROUTE": "o", "BAILING_ACCESS_TOKEN": "t"}
    assert ServerConfig.from_env(environ).run_id is None
    assert ServerConfig.from_env({**environ, "BAILING_RUN_ID": " run_1 "}).run_id == "run_1"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("BAILING_ACCESS_TOKEN", "bka_é"),
        ("BAILING_ACCESS_TOKEN", "bka_a b"),
        ("BAILING_ACCESS_TOKEN", "bka_\x7f"),
        ("BAILING_RUN_ID", "run_é"),
    ],
)
def test_a_malformed_token_or_run_id_stops_the_start(monkeypatch, capsys, name, value):
    """Else the server started, and every tool call failed outside the protocol's errors."""
    monkeypatch.setenv("BAILING_HUB_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("BAILING_ROUTE", "orders")
    monkeypatch.setenv("BAILING_ACCESS_TOKEN", "bka_x")
    monkeypatch.delenv("BAILING_RUN_ID", raising=False)
    monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as caught:
        main([])
    assert caught.value.code == 2
    assert f"{name} must be visible ASCII" in capsys.readouterr().err


def test_create_server_checks_a_config_made_in_code():
    with pytest.raises(ValueError, match="visible ASCII"):
        create_server(ServerConfig("http://hub", "bka_é", "orders"))
    with pytest.raises(ValueError, match="run_id"):
        create_server(ServerConfig("http://hub", "bka_x", "orders", run_id="run 1"))
    with pytest.raises(ValueError, match="timeout"):
        create_server(ServerConfig("http://hub", "bka_x", "orders", timeout=0))


@pytest.mark.parametrize("value", ["0", "-1", "abc", "inf", "nan", "601", "1e9"])
def test_a_timeout_out_of_range_stops_the_start(monkeypatch, capsys, value):
    monkeypatch.setenv("BAILING_HUB_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("BAILING_ROUTE", "orders")
    monkeypatch.setenv("BAILING_ACCESS_TOKEN", "bka_x")
    monkeypatch.setenv("BAILING_TIMEOUT", value)
    with pytest.raises(SystemExit) as caught:
        main([])
    assert caught.value.code == 2 and "BAILING_TIMEOUT must be" in capsys.readouterr().err


def test_the_timeout_setting_bounds_each_call():
    """The server used DEFAULT_TIMEOUT (30 s) whatever the host needed."""
    environ = {"BAILING_HUB_URL": "http://hub", "BAILING_ROUTE": "o", "BAILING_ACCESS_TOKEN": "t"}
    assert ServerConfig.from_env(environ).timeout == 30
    assert ServerConfig.from_env({**environ, "BAILING_TIMEOUT": " 2.5 "}).timeout == 2.5

    hub = DripHub(drip_answer(b"{}"), drip_from=5)

    async def scenario():
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "bailing_knowledge.client"],
            env={
                "BAILING_HUB_URL": hub.url,
                "BAILING_ROUTE": "orders",
                "BAILING_ACCESS_TOKEN": "bka_x",
                "BAILING_TIMEOUT": "1",
                "PYTHONPATH": str(ROOT),
            },
            cwd=str(ROOT),
        )
        async with _session(params) as session:
            started = time.monotonic()
            result = await _call(session, "knowledge_search", {"query": "refund"})
            return result, time.monotonic() - started

    try:
        (error, result), elapsed = asyncio.run(scenario())
    finally:
        hub.close()
    assert error and result["error"] == "hub_unreachable"
    assert "within 1 seconds" in result["reason"] and elapsed < 5
