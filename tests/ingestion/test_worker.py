"""Queued ingestion run by a real `db_worker` process, the database task backend's worker."""

from __future__ import annotations

import os
import subprocess
import sys
from urllib.parse import quote, urlencode

import pytest
from django.db import connection
from django.urls import reverse

from bailing_knowledge.embedded import DATABASE_URL_ENV
from bailing_knowledge.models import Document
from tests.settings import ROOT
from tests.settings_worker import TASKS

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

    document = Document.objects.get()
    assert (document.status, document.revision, document.last_error) == ("ready", 1, "")
    assert document.chunks.exists()
    assert _listed(admin_client, "ready") and not _listed(admin_client, "pending")
