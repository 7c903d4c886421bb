"""`knowledge_ingest`: files and directories into a knowledge base."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from django.core.management.base import CommandError

from bailing_knowledge.models import Document

from . import run, run_json

pytestmark = pytest.mark.django_db

FILES = Path(__file__).resolve().parent.parent / "ingestion" / "files"


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "docs"
    shutil.copytree(FILES, root)
    (root / "sub").mkdir()
    (root / "sub" / "faq.md").write_text("# FAQ\n\nQuestions and answers.\n", encoding="utf-8")
    (root / ".hidden.md").write_text("# Hidden\n\nNot ingested.\n", encoding="utf-8")
    return root


def test_ingest_a_directory_then_again(kb, tree):
    summary = run_json("knowledge_ingest", "handbook", str(tree))
    assert summary["new"] == 6
    assert summary["failed"] == 1  # the Latin-1 text file
    assert summary["unsupported"] == 1  # the .docx
    assert summary["chunks"] >= 6
    assert summary["failures"][0]["path"].endswith("latin1-menu.txt")
    keys = set(Document.objects.values_list("source_key", flat=True))
    assert {"guide.md", "sub/faq.md", "sample.pdf", "page.html"} <= keys
    assert ".hidden.md" not in keys
    assert Document.objects.get(source_key="sub/faq.md").title == "FAQ"

    again = run_json("knowledge_ingest", "handbook", str(tree))
    assert (again["new"], again["updated"], again["unchanged"]) == (0, 0, 6)

    (tree / "sub" / "faq.md").write_text("# FAQ\n\nNew answers.\n", encoding="utf-8")
    changed = run_json("knowledge_ingest", "handbook", str(tree))
    assert (changed["updated"], changed["unchanged"]) == (1, 5)
    assert Document.objects.get(source_key="sub/faq.md").revision == 2


def test_a_file_given_directly_is_keyed_by_its_name(kb, tree):
    run_json("knowledge_ingest", "handbook", str(tree / "sub" / "faq.md"))
    assert Document.objects.get().source_key == "faq.md"


def test_text_output_summarises(kb, tree):
    out = run("knowledge_ingest", "handbook", str(tree / "guide.md"), "--no-progress")
    assert "1 new, 0 updated, 0 unchanged, 0 failed" in out


def test_unknown_kb_and_missing_paths(kb, tmp_path):
    with pytest.raises(CommandError, match="nope"):
        run("knowledge_ingest", "nope", str(tmp_path))
    with pytest.raises(CommandError, match="No such file"):
        run("knowledge_ingest", "handbook", str(tmp_path / "missing"))


def test_each_failure_names_its_own_file(kb, tmp_path, settings):
    settings.BAILING_KNOWLEDGE = {
        "EMBEDDERS": {"default": {"BACKEND": "tests.ingestion.test_documents.PoisonEmbedder"}}
    }
    root = tmp_path / "batch"
    root.mkdir()
    for name, text in [
        ("a.md", "# A\n\nFine text."),
        ("b.md", "# B\n\nPOISON text."),
        ("c.txt", "\ufeff"),  # no text once loaded: a loader failure
        ("d.md", "# D\n\nMore fine text."),
    ]:
        (root / name).write_text(text, encoding="utf-8")
    summary = run_json("knowledge_ingest", "handbook", str(root))
    assert (summary["new"], summary["failed"]) == (2, 2)
    errors = {Path(f["path"]).name: f["error"] for f in summary["failures"]}
    assert set(errors) == {"b.md", "c.txt"}
    assert "poisoned" in errors["b.md"]
    assert set(Document.objects.filter(status="ready").values_list("source_key", flat=True)) == {
        "a.md",
        "d.md",
    }
