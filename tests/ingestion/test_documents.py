"""upsert_document, delete, reindex and the task layer, on the real database."""

from __future__ import annotations

import threading
import time

import pytest
from django.core.exceptions import ValidationError
from django.db import connection, connections

from bailing_knowledge import services
from bailing_knowledge.ingestion import documents as ingest
from bailing_knowledge.ingestion.tasks import run_task
from bailing_knowledge.models import Chunk, Document, content_hash

pytestmark = pytest.mark.django_db

BODY = "# Title\n\n" + "\n\n".join(
    f"Paragraph {i} talks about topic {i}. It has two sentences." for i in range(60)
)


def _chunks(document):
    return list(Chunk.objects.filter(document=document).order_by("ordinal"))


def test_create_indexes_chunks_that_are_slices_of_the_body(kb):
    result = ingest.upsert_document(kb, "a.md", "Title", BODY, {"lang": "en"})
    assert result.outcome == "created"
    document = result.document
    assert (document.revision, document.status) == (1, "ready")
    assert document.content_hash == content_hash("Title", BODY)
    chunks = _chunks(document)
    assert result.chunks == len(chunks) > 1
    for chunk in chunks:
        assert chunk.text == BODY[chunk.start : chunk.end]
        assert chunk.revision == 1
        assert chunk.embedding_dimensions == 384
        assert len(chunk.embedding) == 384
        assert chunk.search_vector


def test_upsert_is_idempotent(kb):
    first = ingest.upsert_document(kb, "a.md", "Title", BODY)
    before = [c.pk for c in _chunks(first.document)]
    again = ingest.upsert_document(kb, "a.md", "Title", BODY)
    assert again.outcome == "unchanged"
    document = Document.objects.get(pk=first.document.pk)
    assert document.revision == 1
    assert [c.pk for c in _chunks(document)] == before


def test_metadata_change_alone_creates_no_revision(kb):
    first = ingest.upsert_document(kb, "a.md", "Title", BODY, {"audiences": ["staff"]})
    again = ingest.upsert_document(kb, "a.md", "Title", BODY, {"audiences": ["partners"]})
    assert again.outcome == "unchanged"
    document = Document.objects.get(pk=first.document.pk)
    assert (document.revision, document.metadata) == (1, {"audiences": ["partners"]})


def test_new_content_swaps_in_a_new_revision(kb):
    first = ingest.upsert_document(kb, "a.md", "Title", BODY)
    second = ingest.upsert_document(kb, "a.md", "Title", BODY + "\n\nA new closing paragraph.")
    assert second.outcome == "updated"
    document = Document.objects.get(pk=first.document.pk)
    assert document.revision == 2
    assert {c.revision for c in _chunks(document)} == {2}
    retitled = ingest.upsert_document(kb, "a.md", "Other title", document.body)
    assert retitled.outcome == "updated"
    assert Document.objects.get(pk=document.pk).revision == 3


def test_nul_characters_are_removed(kb):
    result = ingest.upsert_document(kb, "a.md", "Ti\x00tle", "Bo\x00dy text")
    assert (result.document.title, result.document.body) == ("Title", "Body text")


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("", "T", "B"), "source_key"),
        (("k" * 513, "T", "B"), "source_key"),
        (("k", " ", "B"), "title"),
        (("k", "T" * 501, "B"), "title"),
        (("k", "T", " \n "), "body"),
    ],
)
def test_bad_input_is_rejected_and_writes_nothing(kb, args, field):
    with pytest.raises(ValidationError) as info:
        ingest.upsert_document(kb, *args)
    assert field in info.value.message_dict
    assert not Document.objects.exists()


@pytest.mark.parametrize("metadata", [{"audiences": "staff"}, {"roles": [1]}, {"roles": [""]}])
def test_visibility_metadata_must_be_lists_of_strings(kb, metadata):
    with pytest.raises(ValidationError):
        ingest.upsert_document(kb, "k", "T", "Body", metadata)


def _broken_embedder(settings):
    settings.BAILING_KNOWLEDGE = {
        "EMBEDDERS": {
            "default": {
                "BACKEND": "bailing_knowledge.retrieval.embedders.OpenAIEmbedder",
                "OPTIONS": {"BASE_URL": "http://127.0.0.1:9/v1", "MODEL": "m", "MAX_RETRIES": 0},
            }
        }
    }


def test_embedder_failure_keeps_the_serving_revision(kb, settings):
    first = ingest.upsert_document(kb, "a.md", "Title", BODY)
    _broken_embedder(settings)
    failed = ingest.upsert_document(kb, "a.md", "Title", "Completely new text.")
    assert failed.outcome == "failed"
    assert "Embedding failed" in failed.error
    document = Document.objects.get(pk=first.document.pk)
    assert (document.revision, document.body, document.status) == (1, BODY, "ready")
    assert document.last_error


def test_embedder_failure_on_a_new_document_marks_it_failed_and_retry_works(kb, settings):
    _broken_embedder(settings)
    failed = ingest.upsert_document(kb, "new.md", "New", "Some text.")
    document = Document.objects.get(pk=failed.document.pk)
    assert (document.status, document.chunks.count()) == ("failed", 0)
    settings.BAILING_KNOWLEDGE = {}
    retried = ingest.reindex_document(document)
    document.refresh_from_db()
    assert retried.outcome == "created"
    assert (document.status, document.revision, document.last_error) == ("ready", 1, "")


def test_reindex_keeps_the_revision(kb):
    first = ingest.upsert_document(kb, "a.md", "Title", BODY)
    old_ids = {c.pk for c in _chunks(first.document)}
    result = ingest.reindex_document(first.document)
    assert result.outcome == "updated"
    document = Document.objects.get(pk=first.document.pk)
    assert document.revision == 1
    assert not old_ids & {c.pk for c in _chunks(document)}


def test_changing_the_embedder_re_embeds(kb, settings):
    settings.BAILING_KNOWLEDGE = {
        "EMBEDDERS": {
            "default": {"BACKEND": "bailing_knowledge.retrieval.embedders.HashingEmbedder"},
            "small": {
                "BACKEND": "bailing_knowledge.retrieval.embedders.HashingEmbedder",
                "OPTIONS": {"DIMENSIONS": 64},
            },
        }
    }
    document = ingest.upsert_document(kb, "a.md", "Title", BODY).document
    ingest.set_knowledge_base_embedder(kb, "small")
    assert {c.embedding_dimensions for c in _chunks(document)} == {64}
    with pytest.raises(ValidationError):
        ingest.set_knowledge_base_embedder(kb, "missing")


def test_delete_document(kb):
    document = ingest.upsert_document(kb, "a.md", "Title", BODY).document
    assert ingest.delete_document(kb, "a.md") is True
    assert not Chunk.objects.filter(document_id=document.pk).exists()
    assert ingest.delete_document(kb, "a.md") is False


queued: list = []


def queueing_runner(name, kwargs):
    queued.append((name, kwargs))


def test_a_queueing_runner_defers_the_work(kb, settings):
    settings.BAILING_KNOWLEDGE = {"TASK_RUNNER": "tests.ingestion.test_documents.queueing_runner"}
    queued.clear()
    result = ingest.upsert_document(kb, "a.md", "Title", BODY)
    assert result.outcome == "queued"
    assert not Document.objects.exists()
    ((name, kwargs),) = queued
    assert name == "bailing_knowledge.ingestion.documents.index_document"
    import json

    json.dumps(kwargs)  # a queue can carry the arguments
    assert run_task(name, kwargs).outcome == "created"
    assert Document.objects.get().status == "ready"


@pytest.mark.django_db(transaction=True)
def test_a_concurrent_reader_sees_the_old_or_the_new_revision_never_a_mix():
    kb = services.create_knowledge_base("live")
    bodies = [f"# Version {v}\n\n" + f"Version {v} sentence. " * 400 for v in range(8)]
    document = ingest.upsert_document(kb, "doc.md", "Doc", bodies[0]).document
    stop = threading.Event()
    observations: list[tuple[int, set[int], bool]] = []
    errors: list[BaseException] = []

    def reader():
        try:
            while not stop.is_set():
                with connection.cursor() as cursor:
                    # One statement, as the search's legs are: one snapshot.
                    cursor.execute(
                        "SELECT d.revision, c.revision, "
                        'substr(d.body, c."start" + 1, c."end" - c."start") = c."text" '
                        "FROM bailing_knowledge_document d JOIN bailing_knowledge_chunk c "
                        "ON c.document_id = d.id WHERE d.id = %s",
                        [document.pk],
                    )
                    rows = cursor.fetchall()
                if rows:
                    observations.append((rows[0][0], {r[1] for r in rows}, all(r[2] for r in rows)))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for body in bodies[1:]:
            # Give the reader a look at each revision before the next one lands.
            seen = len(observations)
            deadline = time.monotonic() + 30
            while len(observations) <= seen and time.monotonic() < deadline:
                time.sleep(0.005)
            ingest.upsert_document(kb, "doc.md", "Doc", body)
    finally:
        stop.set()
        thread.join(30)
    assert not errors
    assert len(observations) > 5
    revisions_seen = set()
    for document_revision, chunk_revisions, texts_match in observations:
        assert chunk_revisions == {document_revision}
        assert texts_match
        revisions_seen.add(document_revision)
    assert len(revisions_seen) > 1
