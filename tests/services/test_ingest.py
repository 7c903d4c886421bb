"""`ingest_paths`: files through their loaders and `upsert_documents`, one outcome per file."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from bailing_knowledge.models import Document
from bailing_knowledge.services.ingest import FileOutcome, ingest_paths

pytestmark = pytest.mark.django_db


def write(folder, name: str, content: bytes):
    path = folder / name
    path.write_bytes(content)
    return path


def test_one_outcome_per_file_in_input_order(kb, tmp_path):
    files = []
    for number in range(12):
        if number in (2, 9):
            path = write(tmp_path, f"bad{number}.txt", b"\xff\xfe\xfa not utf-8 \xff")
        elif number == 6:
            path = write(tmp_path, "notes.docx", b"binary")
        else:
            path = write(
                tmp_path, f"doc{number}.md", f"# Doc {number}\n\nText {number}.\n".encode()
            )
        files.append((path, path.name))

    outcomes = list(ingest_paths(kb, files))

    assert [(o.path, o.name) for o in outcomes] == files
    failed = {o.name for o in outcomes if o.outcome == "failed"}
    assert failed == {"bad2.txt", "notes.docx", "bad9.txt"}
    assert all(o.error for o in outcomes if o.outcome == "failed")
    assert {o.outcome for o in outcomes if o.name not in failed} == {"created"}
    assert all(o.chunks > 0 for o in outcomes if o.outcome == "created")
    assert sorted(Document.objects.values_list("source_key", flat=True)) == sorted(
        name for _, name in files if name not in failed
    )
    again = list(ingest_paths(kb.slug, files))
    assert [o.outcome for o in again] == [
        "failed" if o.name in failed else "unchanged" for o in outcomes
    ]


def test_a_loader_failure_names_the_reason_not_the_file_twice(kb, tmp_path):
    path = write(tmp_path, "notes.docx", b"binary")
    [outcome] = ingest_paths(kb, [(path, "notes.docx")])
    assert outcome.outcome == "failed"
    assert outcome.error and not outcome.error.startswith("notes.docx:")


def test_a_repeated_source_key_updates_what_the_first_one_wrote(kb, tmp_path):
    first = write(tmp_path, "a.md", b"# A\n\nFirst version.\n")
    (tmp_path / "later").mkdir()
    second = write(tmp_path / "later", "a.md", b"# A\n\nSecond version.\n")
    outcomes = list(ingest_paths(kb, [(first, "a.md"), (second, "a.md")]))
    assert [o.outcome for o in outcomes] == ["created", "updated"]
    assert Document.objects.get(source_key="a.md").body == "# A\n\nSecond version.\n"


def test_documents_are_upserted_in_batches(kb, tmp_path):
    """Many files cost far fewer statements than a document at a time would."""
    files = []
    for number in range(32):
        path = write(tmp_path, f"doc{number}.md", f"# Doc {number}\n\nText {number}.\n".encode())
        files.append((path, path.name))
    [single] = ingest_paths(kb, files[:1])
    assert single == FileOutcome(files[0][0], "doc0.md", "created", "", single.chunks)
    with CaptureQueriesContext(connection) as one:
        list(ingest_paths(kb, [files[1]]))
    with CaptureQueriesContext(connection) as many:
        outcomes = list(ingest_paths(kb, files[2:]))
    assert [o.outcome for o in outcomes] == ["created"] * 30
    assert len(many.captured_queries) < 10 * len(one.captured_queries)
