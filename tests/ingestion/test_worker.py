"""Queued ingestion run by a real `db_worker` process, the database task backend's worker:
an upload, and a knowledge base's embedder switch, each watched in the admin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from urllib.parse import quote, urlencode

import pytest
from django.db import connection
from django.urls import reverse

from bailing_knowledge.embedded import DATABASE_URL_ENV
from bailing_knowledge.ingestion.documents import upsert_document
from bailing_knowledge.models import Chunk, Document, KnowledgeBase
from tests.api.conftest import AgentCaller
from tests.settings import ROOT
from tests.settings_worker import BAILING_KNOWLEDGE, TASKS
from tests.test_admin import knowledge_base_form

pytestmark = pytest.mark.django_db(transaction=True)  # the worker must see committed rows


def _database_url() -> str:
    """The test database as a URL, for the worker's settings to connect to."""
    conf = connection.settings_dict
    query = {
        key: value
        for key, value in {
            "host": conf["HOST"],
            "port": conf["PORT"],
            "user": conf["USER"],
            "password": conf["PASSWORD"],
        }.items()
        if value
    }
    return f"postgresql:///{quote(conf['NAME'])}?{urlencode(query)}"


def run_worker() -> None:
    """Run what is queued in a `db_worker` process of its own, and wait until it exits."""
    worker = subprocess.run(
        [sys.executable, "-m", "django", "db_worker", "--batch", "--no-startup-delay"],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings_worker",
            DATABASE_URL_ENV: _database_url(),
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert worker.returncode == 0, worker.stderr


def _listed(admin_client, status: str) -> bool:
    changelist = reverse("admin:bailing_knowledge_document_changelist")
    page = admin_client.get(changelist, {"status__exact": status})
    assert page.status_code == 200
    return b"faq.md" in page.content


def test_db_worker_indexes_a_queued_upload(admin_client, kb, settings):
    from django.core.files.uploadedfile import SimpleUploadedFile

    settings.TASKS = TASKS
    upload = SimpleUploadedFile("faq.md", b"# FAQ\n\nRefunds take five working days.\n")
    response = admin_client.post(
        reverse("admin:bailing_knowledge_document_upload"),
        {"knowledge_base": kb.pk, "files": [upload]},
        follow=True,
    )
    assert "1 queued" in " ".join(str(m) for m in response.context["messages"])
    assert _listed(admin_client, "pending")
    assert not Document.objects.get().chunks.exists()

    run_worker()

    document = Document.objects.get()
    assert (document.status, document.revision, document.last_error) == ("ready", 1, "")
    assert document.chunks.exists()
    assert _listed(admin_client, "ready") and not _listed(admin_client, "pending")


def _admin_page(admin_client, url: str, query: dict | None = None) -> str:
    page = admin_client.get(url, query or {})
    assert page.status_code == 200
    return page.content.decode()


def _found(agent: AgentCaller, query: str) -> list[str]:
    """The titles an agent's search finds, over real HTTP through the API."""
    response = agent.post("/workspaces/orders/knowledge/search", {"query": query})
    assert response.status_code == 200, response.content
    return [hint["title"] for hint in json.loads(response.content)["hints"]]


def test_db_worker_re_embeds_a_queued_embedder_switch(admin_client, kb, issued, settings):
    """The admin says the switch is queued and shows the documents waiting; searches keep
    answering from the old chunks until the worker has written the new ones."""
    settings.BAILING_KNOWLEDGE = BAILING_KNOWLEDGE
    for key, title in (("refunds.md", "Refunds"), ("shipping.md", "Shipping")):
        upsert_document(kb, key, title, f"# {title}\n\n{title} take five working days.\n")
    agent = AgentCaller(issued.access_token)
    assert _found(agent, "refunds working days")[0] == "Refunds"
    kb_page = reverse("admin:bailing_knowledge_knowledgebase_change", args=[kb.pk])
    documents = reverse("admin:bailing_knowledge_document_changelist")

    settings.TASKS = TASKS
    response = admin_client.post(kb_page, knowledge_base_form(kb, embedder="small"), follow=True)
    assert (
        "handbook now embeds with 'small': "
        "2 documents queued for re-embedding; a worker will index them."
    ) in [str(m) for m in response.context["messages"]]
    assert KnowledgeBase.objects.get().embedder == "small"
    assert "2 of 2 documents waiting for re-index" in _admin_page(admin_client, kb_page)
    waiting = _admin_page(admin_client, documents, {"reindex": "queued"})
    assert "refunds.md" in waiting and "shipping.md" in waiting
    assert waiting.count("re-index queued") == 2
    # Still `ready`, still serving the old vectors; the query is embedded with the new
    # embedder, so the old chunks are found by their words.
    assert set(Document.objects.values_list("status", flat=True)) == {"ready"}
    assert 64 not in set(Chunk.objects.values_list("embedding_dimensions", flat=True))
    assert _found(agent, "refunds working days")[0] == "Refunds"

    run_worker()

    assert set(Chunk.objects.values_list("embedding_dimensions", flat=True)) == {64}
    assert not Document.objects.filter(reindex_queued_at__isnull=False).exists()
    assert set(Document.objects.values_list("status", "last_error")) == {("ready", "")}
    assert "waiting for re-index" not in _admin_page(admin_client, kb_page)
    done = _admin_page(admin_client, documents, {"reindex": "queued"})
    assert "refunds.md" not in done and "re-index queued" not in done
    assert _found(agent, "refunds working days")[0] == "Refunds"
