"""Searches and read chains while every document is re-ingested over and over.

A search must never answer `ok` with no hints for a term every revision contains (an agent
cannot tell that from "no knowledge"); a read chain must never mix revisions; every answer
stays within its byte budget.
"""

from __future__ import annotations

import json
import random
import threading

import httpx
import pytest
from django.db import connection

from bailing_knowledge import services
from bailing_knowledge.ingestion.documents import upsert_document

from ..api.conftest import AgentCaller
from . import figures

SEARCH = "/workspaces/orders/knowledge/search"
READ = "/workspaces/orders/knowledge/read"


@pytest.mark.django_db(transaction=True)
def test_a_reingestion_between_the_legs_and_validation_is_never_ok_with_nothing():
    """Deterministic: every document is re-ingested, and committed, right before the hits
    are validated. Under one snapshot the hits stay valid; were the legs and the validation
    to read different snapshots, every hit would be dropped as stale."""
    kb = services.create_knowledge_base("handbook")
    route = services.create_route("orders", knowledge_bases=[kb])
    client = services.create_client("acme-agent", routes=[route])
    issued = services.issue_session(client, principal_id="u", routes=[route])
    for n in range(3):
        upsert_document(kb, f"r{n}.md", f"Refunds {n}", f"Refunds take {n + 5} days. " * 30)

    def reingest() -> None:
        for n in range(3):
            upsert_document(kb, f"r{n}.md", f"Refunds {n}", f"Refunds take {n + 9} days. " * 30)
        connection.close()

    fired = []

    def between_legs_and_validation(execute, sql, params, many, context):
        # Commit a re-ingestion of every document right before hits are validated.
        if "bk:fetch" in sql and not fired:
            fired.append(True)
            thread = threading.Thread(target=reingest)
            thread.start()
            thread.join()
        return execute(sql, params, many, context)

    with connection.execute_wrapper(between_legs_and_validation):
        response = AgentCaller(issued.access_token).post(SEARCH, {"query": "refunds"})
    assert fired, "the search no longer validates its hits in a `bk:fetch` statement"
    body = json.loads(response.content)
    assert response.status_code == 200
    assert body["hints"] or body["status"] != "ok", body


class Load:
    """Searches and read chains against the live server, with their figures."""

    def __init__(self, server) -> None:
        self.server = server
        self.headers = {"Authorization": f"Bearer {server.token}"}
        self.searches = self.ok_with_nothing = self.chains = self.mixed = 0
        self.over_budget = self.server_errors = self.pages = 0
        self.unexpected: list[str] = []
        self.lock = threading.Lock()

    def search(self, http: httpx.Client) -> list[dict]:
        response = http.post(self.server.url + SEARCH, json={"query": "refunds"})
        with self.lock:
            self.searches += 1
            self.server_errors += response.status_code >= 500
            if response.status_code != 200:
                self.unexpected.append(f"search {response.status_code}")
                return []
            self.over_budget += len(response.content) > 4096
            body = response.json()
            if body["status"] == "ok" and not body["hints"]:
                self.ok_with_nothing += 1
        return body["hints"]

    def chain(self, http: httpx.Client, hint: dict, rng: random.Random) -> None:
        max_bytes = rng.choice([4096, 4096, 8192, 32768])
        revisions, cursor = set(), None
        while True:
            body = {"ref": hint["ref"], "max_bytes": max_bytes}
            if cursor:
                body["cursor"] = cursor
            response = http.post(self.server.url + READ, json=body)
            with self.lock:
                self.pages += 1
                self.server_errors += response.status_code >= 500
                self.over_budget += len(response.content) > max_bytes
            if response.status_code == 409 and response.json()["error"] == "knowledge_changed":
                break  # the document moved on: the agent searches again
            if response.status_code != 200:
                with self.lock:
                    self.unexpected.append(f"read {response.status_code}")
                break
            page = response.json()
            revisions.add(page["revision"])
            cursor = page["next_cursor"]
            if cursor is None:
                break
        with self.lock:
            self.chains += 1
            self.mixed += len(revisions | {hint["revision"]}) > 1

    def work(self, stop: threading.Event, seed: int, reads: bool) -> None:
        rng = random.Random(seed)
        with httpx.Client(timeout=30, headers=self.headers) as http:
            while not stop.is_set():
                hints = self.search(http)
                if reads and hints:
                    self.chain(http, rng.choice(hints), rng)


@pytest.fixture(scope="module")
def reingestion_load(fault_server):
    seconds = figures.scale(3, 60)
    reingester = fault_server.reingest(seconds)
    load = Load(fault_server)
    stop = threading.Event()
    workers = [
        threading.Thread(target=load.work, args=(stop, n, n % 2 == 1), daemon=True)
        for n in range(4)
    ]
    for worker in workers:
        worker.start()
    try:
        output, _ = reingester.communicate(timeout=seconds + 120)
    finally:
        stop.set()
        for worker in workers:
            worker.join(60)
    assert reingester.returncode == 0
    rounds = int(output.split()[-1])
    figures.count("reingestion_rounds", rounds)
    figures.count("reingestion_searches", load.searches)
    figures.count("reingestion_read_chains", load.chains)
    figures.record("reingestion_5xx", load.server_errors, 0)
    figures.record("reingestion_budget_violations", load.over_budget, 0)
    figures.record("reingestion_mixed_revision_chains", load.mixed, 0)
    figures.record("reingestion_ok_with_nothing", load.ok_with_nothing, 0)
    return load


def test_read_chains_never_mix_revisions_during_reingestion(reingestion_load):
    load = reingestion_load
    assert load.searches > 0 and load.chains > 0
    assert load.server_errors == 0
    assert load.over_budget == 0
    assert load.mixed == 0
    assert not load.unexpected, load.unexpected[:5]


def test_searches_during_reingestion_are_never_ok_with_nothing(reingestion_load):
    assert reingestion_load.ok_with_nothing == 0
