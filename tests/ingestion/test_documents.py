"""upsert_document, delete, reindex and queued indexing, on the real database."""

from __future__ import annotations

import hashlib
import struct
import threading
import time

import pytest
from django.core.exceptions import ValidationError
from django.db import connection, connections

from bailing_knowledge import services
from bailing_knowledge.ingestion import documents as ingest
from bailing_knowledge.ingestion.chunker import chunk_spans
from bailing_knowledge.ingestion.tasks import ImmediateBackend
from bailing_knowledge.models import Chunk, Document, content_hash
from bailing_knowledge.retrieval.embedders import EmbedderError, HashingEmbedder

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


UNSTORABLE_METADATA = [
    {"note": "a\x00b"},
    {"note": "a\ud800b"},
    {"a\x00": 1},
    {"deep": [{"x": ["\udfff"]}]},
]


@pytest.mark.parametrize("metadata", UNSTORABLE_METADATA)
def test_metadata_jsonb_cannot_hold_is_a_validation_error(kb, metadata):
    """PostgreSQL refused it deep in the write (`DataError`), past every validation."""
    with pytest.raises(ValidationError) as info:
        ingest.upsert_document(kb, "a.md", "Title", "Body text", metadata)
    assert info.value.message_dict["metadata"] == [
        "Must not contain NUL or unpaired surrogates in keys or strings."
    ]
    assert not Document.objects.exists()


def test_unstorable_metadata_fails_only_its_document_in_a_batch(kb):
    results = list(
        ingest.upsert_documents(
            kb,
            [
                ingest.DocumentInput("a.md", "A", "Alpha text"),
                ingest.DocumentInput("b.md", "B", "Beta text", UNSTORABLE_METADATA[0]),
                ingest.DocumentInput("c.md", "C", "Gamma text"),
            ],
        )
    )
    assert [r.outcome for r in results] == ["created", "failed", "created"]
    assert set(Document.objects.values_list("source_key", flat=True)) == {"a.md", "c.md"}


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


def test_delete_document(kb):
    document = ingest.upsert_document(kb, "a.md", "Title", BODY).document
    assert ingest.delete_document(kb, "a.md") is True
    assert not Chunk.objects.filter(document_id=document.pk).exists()
    assert ingest.delete_document(kb, "a.md") is False


QUEUE = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}


def _queued() -> list[tuple[str, dict]]:
    from django_tasks_db.models import DBTaskResult

    return [
        (result.task_path, result.args_kwargs["kwargs"])
        for result in DBTaskResult.objects.order_by("enqueued_at")
    ]


def test_a_queueing_backend_leaves_a_pending_document(kb, settings):
    settings.TASKS = QUEUE
    result = ingest.upsert_document(kb, "a.md", "Title", BODY)
    assert result.outcome == "queued"
    document = Document.objects.get()
    assert (document.pk, document.status, document.body) == (result.document.pk, "pending", BODY)
    assert not document.chunks.exists()
    ((path, kwargs),) = _queued()
    assert path == "bailing_knowledge.ingestion.pipeline.index_task"
    assert ingest.index_task.call(**kwargs) == "created"
    document.refresh_from_db()
    assert (document.status, document.revision) == ("ready", 1)
    assert document.chunks.exists()


def test_a_queued_update_keeps_the_document_serving_until_indexed(kb, settings):
    served = ingest.upsert_document(kb, "a.md", "Title", BODY).document
    settings.TASKS = QUEUE
    assert ingest.upsert_document(kb, "a.md", "Title", BODY + " More.").outcome == "queued"
    served.refresh_from_db()
    assert (served.status, served.body) == ("ready", BODY)
    ((_, kwargs),) = _queued()
    assert ingest.index_task.call(**kwargs) == "updated"
    served.refresh_from_db()
    assert (served.status, served.revision, served.body) == ("ready", 2, BODY + " More.")


def test_a_queued_document_that_fails_to_embed_is_failed(kb, settings):
    settings.BAILING_KNOWLEDGE = {
        "EMBEDDERS": {"default": {"BACKEND": "tests.ingestion.test_documents.PoisonEmbedder"}}
    }
    settings.TASKS = QUEUE
    ingest.upsert_document(kb, "a.md", "Title", "POISON " + BODY)
    ((_, kwargs),) = _queued()
    assert ingest.index_task.call(**kwargs) == "failed"
    document = Document.objects.get()
    assert (document.status, document.last_error) == ("failed", "Embedding failed: poisoned")


def test_an_older_queued_version_gives_way_to_the_newer(kb, settings):
    settings.TASKS = QUEUE
    ingest.upsert_document(kb, "a.md", "Title", BODY)
    ingest.upsert_document(kb, "a.md", "Title", BODY + " Newer.")
    (_, older), (_, newer) = _queued()
    assert Document.objects.get().body == BODY + " Newer."
    assert ingest.index_task.call(**older) == "unchanged"
    assert Document.objects.get().status == "pending"
    assert ingest.index_task.call(**newer) == "created"
    assert Document.objects.get().status == "ready"


def test_a_queued_edit_gives_way_to_the_served_content_asked_for_again(kb, settings):
    served = ingest.upsert_document(kb, "a.md", "Title", BODY).document
    settings.TASKS = QUEUE
    assert ingest.upsert_document(kb, "a.md", "Title", BODY + " Edit.").outcome == "queued"
    assert ingest.upsert_document(kb, "a.md", "Title", BODY).outcome == "unchanged"
    ((_, kwargs),) = _queued()
    assert ingest.index_task.call(**kwargs) == "unchanged"
    served.refresh_from_db()
    assert (served.body, served.revision, served.status) == (BODY, 1, "ready")


def test_queued_edits_of_a_serving_document_end_with_the_last(kb, settings):
    ingest.upsert_document(kb, "a.md", "Title", BODY)
    settings.TASKS = QUEUE
    ingest.upsert_document(kb, "a.md", "Title", BODY + " Older.")
    ingest.upsert_document(kb, "a.md", "Title", BODY + " Newer.")
    (_, older), (_, newer) = _queued()
    assert ingest.index_task.call(**older) == "unchanged"
    assert ingest.index_task.call(**newer) == "updated"
    assert ingest.index_task.call(**older) == "unchanged"
    document = Document.objects.get()
    assert (document.body, document.revision) == (BODY + " Newer.", 2)
    assert document.queued_hash == document.content_hash


def test_a_queued_edit_gives_way_to_content_written_inline_since(kb, settings):
    ingest.upsert_document(kb, "a.md", "Title", BODY)
    settings.TASKS = QUEUE
    ingest.upsert_document(kb, "a.md", "Title", BODY + " Queued.")
    settings.TASKS = {"default": {"BACKEND": f"{ImmediateBackend.__module__}.ImmediateBackend"}}
    assert ingest.upsert_document(kb, "a.md", "Title", BODY + " Inline.").outcome == "updated"
    ((_, kwargs),) = _queued()
    assert ingest.index_task.call(**kwargs) == "unchanged"
    assert Document.objects.get().body == BODY + " Inline."


def test_an_overtaken_edit_gives_way_when_it_comes_to_swap_or_fail(kb, settings):
    """Overtaken while its task embeds: the swap, under the row's lock, sees it."""
    settings.BAILING_KNOWLEDGE = {
        "EMBEDDERS": {"default": {"BACKEND": "tests.ingestion.test_documents.PoisonEmbedder"}}
    }
    ingest.upsert_document(kb, "a.md", "Title", BODY, {"audiences": ["staff"]})
    settings.TASKS = QUEUE
    for text in (BODY + " Edit.", BODY + " POISON"):
        ingest.upsert_document(kb, "a.md", "Title", text, {"audiences": ["public"]})
        ingest.upsert_document(kb, "a.md", "Title", BODY, {"audiences": ["staff"]})
    for _, kwargs in _queued():
        result = ingest.index_document(**kwargs, queued=True)
        assert (result.outcome, result.chunks) == ("unchanged", 0)
    document = Document.objects.get()
    assert (document.body, document.revision, document.last_error) == (BODY, 1, "")
    assert document.metadata == {"audiences": ["staff"]}


def test_an_edit_queued_before_the_document_recorded_it_still_runs(kb, settings):
    ingest.upsert_document(kb, "a.md", "Title", BODY)
    settings.TASKS = QUEUE
    ingest.upsert_document(kb, "a.md", "Title", BODY + " Edit.")
    Document.objects.update(queued_hash="")  # as queued by a release without the column
    ((_, kwargs),) = _queued()
    assert ingest.index_task.call(**kwargs) == "updated"
    assert Document.objects.get().body == BODY + " Edit."


def test_a_queued_reindex_runs_through_its_task(kb, settings):
    document = ingest.upsert_document(kb, "a.md", "Title", BODY).document
    settings.TASKS = QUEUE
    assert ingest.reindex_document(document).outcome == ingest.DocumentOutcome.QUEUED
    ((path, kwargs),) = _queued()
    assert path == "bailing_knowledge.ingestion.maintenance.reindex_task"
    assert ingest.reindex_task.call(**kwargs) == "updated"


def test_work_queued_by_the_old_task_layer_still_runs(kb):
    """`run_task` drains what a project's old TASK_RUNNER queued, under the old names."""
    from bailing_knowledge.ingestion.tasks import run_task

    kwargs = {
        "knowledge_base_id": kb.pk,
        "source_key": "a.md",
        "title": "Title",
        "body": BODY,
        "metadata": {},
    }
    with pytest.deprecated_call():
        result = run_task("bailing_knowledge.ingestion.documents.index_document", kwargs)
    assert result.outcome == "created"
    name = "bailing_knowledge.ingestion.documents.reindex_document_task"
    with pytest.deprecated_call():
        result = run_task(name, {"document_id": result.document.pk})
    assert result.outcome == "updated"


def test_outcomes_are_the_words_of_the_json_output(kb):
    import json

    result = ingest.upsert_document(kb, "a.md", "Title", BODY)
    assert result.outcome is ingest.DocumentOutcome.CREATED
    assert json.dumps({"outcome": result.outcome}) == '{"outcome": "created"}'
    assert [str(outcome) for outcome in ingest.DocumentOutcome] == [
        "created",
        "updated",
        "unchanged",
        "queued",
        "failed",
    ]


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


# --------------------------------------------------------------------------------------------
# What the bulk writer stores


def _float4(values):
    return struct.unpack(f">{len(values)}f", struct.pack(f">{len(values)}f", *values))


def test_chunks_hold_the_embedders_vectors_and_the_lexical_terms(kb):
    from bailing_knowledge.retrieval.analysis import document_terms
    from bailing_knowledge.retrieval.embedders import get_embedder
    from bailing_knowledge.retrieval.postings import chunk_terms, encode_terms

    body = (
        "# 退货\n\n退货政策：三十天内可以退货。Returns café — naïve “quotes” \\ backslash.\n\n"
        + BODY
    )
    document = ingest.upsert_document(kb, "a.md", "Title", body).document
    chunks = _chunks(document)
    vectors = get_embedder(kb.embedder).embed_documents([c.text for c in chunks])
    with connection.cursor() as cursor:
        for chunk, vector in zip(chunks, vectors, strict=True):
            # float4 storage: the embedder's values rounded to single precision, exactly.
            assert _float4(chunk.embedding) == _float4(vector)
            lexical = encode_terms(
                chunk_terms(chunk.text, document_terms("Title", kb.language), kb.language)
            )
            cursor.execute(
                "SELECT search_vector = %s::tsvector, lexical_terms = %s::tsvector, "
                "lexical_length = %s, text_hash = %s "
                "FROM bailing_knowledge_chunk WHERE id = %s",
                [
                    lexical.levels,
                    lexical.terms,
                    lexical.length,
                    hashlib.sha256(chunk.text.encode()).hexdigest(),
                    chunk.pk,
                ],
            )
            assert cursor.fetchone() == (True, True, True, True)


def test_the_staging_table_is_empty_after_a_write(kb):
    ingest.upsert_document(kb, "a.md", "Title", BODY)
    ingest.upsert_document(kb, "b.md", "Title", BODY + " More.")
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM bailing_knowledge_chunk_stage")
        assert cursor.fetchone() == (0,)


# --------------------------------------------------------------------------------------------
# upsert_documents


def _inputs(*documents):
    return [ingest.DocumentInput(*document) for document in documents]


def test_upsert_documents_gives_one_result_per_input_in_order(kb):
    ingest.upsert_document(kb, "kept.md", "Kept", BODY, {"roles": ["a"]})
    ingest.upsert_document(kb, "changed.md", "Changed", BODY)
    results = list(
        ingest.upsert_documents(
            kb,
            _inputs(
                ("new.md", "New", BODY + " New."),
                ("kept.md", "Kept", BODY, {"roles": ["b"]}),
                ("bad.md", "Bad", "  "),
                ("changed.md", "Changed", BODY + " Changed."),
                ("new.md", "New", BODY + " New again."),  # the same key twice
                ("", "No key", BODY),
            ),
            batch_size=3,
        )
    )
    assert [(r.source_key, r.outcome) for r in results] == [
        ("new.md", "created"),
        ("kept.md", "unchanged"),
        ("bad.md", "failed"),
        ("changed.md", "updated"),
        ("new.md", "updated"),
        ("", "failed"),
    ]
    assert "body" in results[2].error and "source_key" in results[5].error
    new = Document.objects.get(source_key="new.md")
    assert (new.revision, new.body) == (2, BODY + " New again.")
    assert {c.revision for c in _chunks(new)} == {2}
    assert Document.objects.get(source_key="kept.md").metadata == {"roles": ["b"]}
    assert Document.objects.get(source_key="changed.md").revision == 2
    assert not Document.objects.filter(source_key="bad.md").exists()
    assert results[0].chunks == len(_chunks(new)) or results[4].chunks == len(_chunks(new))


def test_the_last_version_of_a_key_wins_across_batches(kb):
    ingest.upsert_document(kb, "x.md", "X", BODY)
    results = ingest.upsert_documents(
        kb,
        _inputs(("x.md", "X", BODY + " B."), ("y.md", "Y", BODY), ("x.md", "X", BODY)),
        batch_size=2,
    )
    assert [r.outcome for r in results] == ["updated", "created", "updated"]
    document = Document.objects.get(source_key="x.md")
    assert (document.body, document.revision) == (BODY, 3)


def test_upsert_documents_stores_what_upsert_document_stores(db):
    one = services.create_knowledge_base("one")
    many = services.create_knowledge_base("many")
    bodies = [f"# Part {n}\n\n" + BODY.replace("topic", f"subject {n}") for n in range(5)]
    for n, body in enumerate(bodies):
        ingest.upsert_document(one, f"{n}.md", f"Part {n}", body)
    list(
        ingest.upsert_documents(
            many, _inputs(*[(f"{n}.md", f"Part {n}", body) for n, body in enumerate(bodies)])
        )
    )

    def stored(kb):
        return [
            (c.document.source_key, c.ordinal, c.start, c.end, c.text, c.text_hash, *c.embedding)
            for c in Chunk.objects.filter(knowledge_base=kb)
            .select_related("document")
            .order_by("document__source_key", "ordinal")
        ]

    assert stored(one) == stored(many)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM bailing_knowledge_chunk a JOIN bailing_knowledge_chunk b "
            "ON a.text_hash = b.text_hash AND a.ordinal = b.ordinal "
            "WHERE a.knowledge_base_id = %s AND b.knowledge_base_id = %s "
            "AND a.search_vector = b.search_vector",
            [one.pk, many.pk],
        )
        assert cursor.fetchone()[0] == Chunk.objects.filter(knowledge_base=one).count()


class PoisonEmbedder(HashingEmbedder):
    """Fails any call that includes a text containing POISON."""

    def embed_documents(self, texts):
        if any("POISON" in text for text in texts):
            raise EmbedderError("poisoned")
        return super().embed_documents(texts)


def test_an_embedding_failure_fails_only_its_document(kb, settings):
    settings.BAILING_KNOWLEDGE = {
        "EMBEDDERS": {"default": {"BACKEND": "tests.ingestion.test_documents.PoisonEmbedder"}}
    }
    ingest.upsert_document(kb, "served.md", "Served", BODY)
    results = list(
        ingest.upsert_documents(
            kb,
            _inputs(
                ("a.md", "A", BODY),
                ("served.md", "Served", BODY + " POISON"),
                ("b.md", "B", "POISON " + BODY),
                ("c.md", "C", BODY + " C."),
            ),
        )
    )
    assert [r.outcome for r in results] == ["created", "failed", "failed", "created"]
    assert all("poisoned" in r.error for r in results[1:3])
    served = Document.objects.get(source_key="served.md")
    assert (served.status, served.revision, served.body) == ("ready", 1, BODY)
    assert "poisoned" in served.last_error
    assert Document.objects.get(source_key="b.md").status == "failed"
    assert Document.objects.filter(status="ready").count() == 3


class OutOfRangeEmbedder(HashingEmbedder):
    """Spoils the vector of a text with a marker in it."""

    def embed_documents(self, texts):
        vectors = super().embed_documents(texts)
        for text, vector in zip(texts, vectors, strict=True):
            if "HUGE" in text:
                vector[3] = 1e6
            elif "NAN" in text:
                vector[3] = float("nan")
            elif "INF" in text:
                vector[3] = float("-inf")
            elif "SHORT" in text:
                vector.pop()
        return vectors


def test_vectors_the_index_cannot_hold_fail_their_document_clearly(kb, settings):
    settings.BAILING_KNOWLEDGE = {
        "EMBEDDERS": {"default": {"BACKEND": "tests.ingestion.test_documents.OutOfRangeEmbedder"}}
    }
    markers = ["HUGE", "NAN", "INF", "SHORT", "fine"]
    results = list(
        ingest.upsert_documents(kb, _inputs(*[(f"{m}.md", m, f"{BODY} {m}") for m in markers]))
    )
    assert [r.outcome for r in results] == ["failed"] * 4 + ["created"]
    assert all("65504" in r.error for r in results[:3])
    assert "383 dimensions, not 384" in results[3].error
    assert Chunk.objects.count() == results[4].chunks


def test_upsert_documents_with_a_queueing_backend_queues_changed_documents(kb, settings):
    ingest.upsert_document(kb, "kept.md", "Kept", BODY)
    settings.TASKS = QUEUE
    results = list(
        ingest.upsert_documents(
            kb, _inputs(("kept.md", "Kept", BODY), ("new.md", "New", BODY), ("bad.md", "B", ""))
        )
    )
    assert [r.outcome for r in results] == ["unchanged", "queued", "failed"]
    ((_, kwargs),) = _queued()
    assert kwargs["source_key"] == "new.md"
    assert Document.objects.get(source_key="new.md").status == "pending"


def test_stopping_early_writes_only_the_batch_of_the_last_result(kb):
    ingest.upsert_document(kb, "kept.md", "Kept", BODY, {"roles": ["old"]})
    documents = [(f"{n}.md", f"Doc {n}", f"{BODY} {n}.") for n in range(6)]
    documents[2] = ("kept.md", "Kept", BODY, {"roles": ["new"]})  # in the second batch
    results = ingest.upsert_documents(kb, _inputs(*documents), batch_size=2)
    first = next(results)
    results.close()
    assert first.outcome == "created"
    keys = set(Document.objects.values_list("source_key", flat=True))
    assert keys == {"0.md", "1.md", "kept.md"}
    assert Document.objects.get(source_key="kept.md").metadata == {"roles": ["old"]}


@pytest.mark.parametrize(
    ("document", "field"),
    [
        (("k.md", "T", None), "body"),
        ((7, "T", "Body"), "source_key"),
        (("k\x00.md", "T", "Body"), "source_key"),
        (("k.md", "T", "Body", {"when": object()}), "metadata"),
        (("k.md", "T", "Body", {"score": float("nan")}), "metadata"),
    ],
)
def test_bad_input_of_any_kind_fails_only_its_document(kb, document, field):
    results = list(ingest.upsert_documents(kb, _inputs(("a.md", "A", BODY), document)))
    assert [r.outcome for r in results] == ["created", "failed"]
    assert results[1].error.startswith(f"{field}: ")
    assert list(Document.objects.values_list("source_key", flat=True)) == ["a.md"]


def test_unpaired_surrogates_are_removed_like_nul(kb):
    result = ingest.upsert_document(kb, "a.md", "Ti\ud800tle", "Bo\udc00dy\x00 text")
    assert (result.document.title, result.document.body) == ("Title", "Body text")


def test_many_writes_in_one_transaction_leave_the_stage_empty(kb):
    from django.db import transaction

    with transaction.atomic():
        for n in range(4):
            ingest.upsert_document(kb, f"{n}.md", "Title", f"{BODY} {n}")
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM bailing_knowledge_chunk_stage")
            assert cursor.fetchone() == (0,)
    for document in Document.objects.all():
        assert [(c.start, c.end) for c in _chunks(document)] == [
            (span.start, span.end) for span in chunk_spans(document.body)
        ]


@pytest.mark.django_db(transaction=True)
def test_concurrent_bulk_writers_of_the_same_keys_both_succeed():
    kb = services.create_knowledge_base("busy")
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def writer(version: int) -> None:
        try:
            barrier.wait(10)
            documents = [(f"{n}.md", f"Doc {n}", f"{BODY} v{version} n{n}.") for n in range(12)]
            order = documents if version else documents[::-1]
            for result in ingest.upsert_documents(kb, _inputs(*order), batch_size=4):
                assert result.outcome in ("created", "updated"), result
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writer, args=(v,)) for v in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert Document.objects.filter(knowledge_base=kb).count() == 12
    for document in Document.objects.filter(knowledge_base=kb):
        chunks = _chunks(document)
        assert chunks and {c.revision for c in chunks} == {document.revision}
        assert all(c.text == document.body[c.start : c.end] for c in chunks)
