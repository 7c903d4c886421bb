"""`knowledge_ingest`: files and directories into a knowledge base."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from bailing_knowledge.ingestion.documents import delete_document
from bailing_knowledge.ingestion.loaders import LoadedDocument, register_loader, unregister_loader
from bailing_knowledge.models import Document, KnowledgeBase
from tests import django_connection_url

from . import run, run_json

pytestmark = pytest.mark.django_db

FILES = Path(__file__).resolve().parent.parent / "ingestion" / "files"


def run_failing(*args: str) -> tuple[str, str, CommandError]:
    """Run a command that must end in failure; return its stdout, stderr and the error."""
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError) as failed:
        call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue(), failed.value


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "docs"
    shutil.copytree(FILES, root)
    (root / "sub").mkdir()
    (root / "sub" / "faq.md").write_text("# FAQ\n\nQuestions and answers.\n", encoding="utf-8")
    (root / ".hidden.md").write_text("# Hidden\n\nNot ingested.\n", encoding="utf-8")
    return root


def test_ingest_a_directory_then_again(kb, tree):
    out, _, failed = run_failing("knowledge_ingest", "handbook", str(tree), "--json")
    summary = json.loads(out)
    assert failed.returncode == 1
    assert summary["new"] == 6
    assert summary["failed"] == 1  # the Latin-1 text file
    assert summary["unsupported"] == 1  # the .docx
    assert summary["chunks"] >= 6
    assert summary["failures"][0]["path"].endswith("latin1-menu.txt")
    keys = set(Document.objects.values_list("source_key", flat=True))
    assert {"guide.md", "sub/faq.md", "sample.pdf", "page.html"} <= keys
    assert ".hidden.md" not in keys
    assert Document.objects.get(source_key="sub/faq.md").title == "FAQ"

    again = json.loads(run_failing("knowledge_ingest", "handbook", str(tree), "--json")[0])
    assert (again["new"], again["updated"], again["unchanged"]) == (0, 0, 6)

    (tree / "sub" / "faq.md").write_text("# FAQ\n\nNew answers.\n", encoding="utf-8")
    changed = json.loads(run_failing("knowledge_ingest", "handbook", str(tree), "--json")[0])
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
    fifo = tmp_path / "pipe.md"
    os.mkfifo(fifo)
    with pytest.raises(CommandError, match=r"Not a regular file or directory: .*pipe\.md"):
        run("knowledge_ingest", "handbook", str(fifo))


def test_a_named_file_of_an_unsupported_type_stops_the_command(kb, tmp_path):
    """In a directory such a file is listed and skipped; named, it was wanted."""
    good = tmp_path / "good.md"
    good.write_text("# Good\n\nText.", encoding="utf-8")
    drawing = tmp_path / "diagram.vsdx"
    drawing.write_bytes(b"PK\x03\x04")
    with pytest.raises(CommandError, match=r"^No loader for .*diagram\.vsdx \(supported: .*\.md"):
        run("knowledge_ingest", "handbook", str(good), str(drawing))
    assert not Document.objects.exists()  # checked before anything was loaded
    summary = run_json("knowledge_ingest", "handbook", str(tmp_path))
    assert (summary["new"], summary["unsupported"]) == (1, 1)


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
    out, _, failed = run_failing("knowledge_ingest", "handbook", str(root), "--json")
    summary = json.loads(out)
    assert (summary["new"], summary["failed"]) == (2, 2)
    assert str(failed) == "2 of 4 files failed."
    errors = {Path(f["path"]).name: f["error"] for f in summary["failures"]}
    assert set(errors) == {"b.md", "c.txt"}
    assert "poisoned" in errors["b.md"]
    assert set(Document.objects.filter(status="ready").values_list("source_key", flat=True)) == {
        "a.md",
        "d.md",
    }


def test_text_output_has_one_line_per_failed_file(kb, tmp_path):
    root = tmp_path / "batch"
    root.mkdir()
    (root / "good.md").write_text("# Good\n\nFine text.", encoding="utf-8")
    (root / "empty.txt").write_text("\ufeff", encoding="utf-8")
    (root / "blank.md").write_text("   ", encoding="utf-8")
    out, err, failed = run_failing("knowledge_ingest", "handbook", str(root), "--no-progress")
    assert "1 new, 0 updated, 0 unchanged, 2 failed" in out
    lines = [line for line in err.splitlines() if line.startswith("failed: ")]
    assert sorted(lines) == [
        f"failed: {root / 'blank.md'}: no text",
        f"failed: {root / 'empty.txt'}: no text",
    ]
    assert failed.returncode == 1


@pytest.mark.django_db(transaction=True)
def test_the_exit_status_tells_a_script_whether_every_file_made_it(tmp_path):
    """Through `manage.py` as a shell script runs it: 0 when all went in, 1 when any failed."""
    from bailing_knowledge import services

    services.create_knowledge_base("scripted")
    good = tmp_path / "good.md"
    good.write_text("# Good\n\nFine text.", encoding="utf-8")
    bad = tmp_path / "bad.txt"
    bad.write_text("\ufeff", encoding="utf-8")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": django_connection_url(connection.settings_dict),
    }
    root = Path(__file__).resolve().parents[2]

    def ingest(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "django", "knowledge_ingest", "scripted", *args],
            cwd=root,
            env={**env, "PYTHONPATH": str(root)},
            capture_output=True,
            text=True,
            timeout=120,
        )

    assert ingest(str(good)).returncode == 0
    both = ingest(str(good), str(bad), "--json")
    assert both.returncode == 1, both.stderr
    assert json.loads(both.stdout)["failed"] == 1
    assert both.stderr.strip().endswith("1 of 2 files failed.")


def test_unreadable_entries_of_a_directory_are_reported_not_skipped(kb, tmp_path):
    root = tmp_path / "batch"
    root.mkdir()
    (root / "good.md").write_text("# Good\n\nFine text.", encoding="utf-8")
    (root / "gone.md").symlink_to(root / "moved-away.md")
    os.mkfifo(root / "pipe.md")  # never opened: reading it would wait for a writer
    out, _, failed = run_failing("knowledge_ingest", "handbook", str(root), "--json")
    summary = json.loads(out)
    assert (summary["new"], summary["failed"]) == (1, 2)
    assert str(failed) == "2 of 3 files failed."
    errors = {Path(f["path"]).name: f["error"] for f in summary["failures"]}
    assert errors == {"gone.md": "not a readable file", "pipe.md": "not a readable file"}


def test_links_out_of_the_directory_fail_and_are_not_stored(kb, tmp_path):
    """A link in the tree must not carry /etc/passwd or the process's environment into a
    searchable knowledge base."""
    root = tmp_path / "batch"
    root.mkdir()
    (root / "good.md").write_text("# Good\n\nFine text.", encoding="utf-8")
    (tmp_path / "secret.txt").write_text("SECRET_KEY=hunter2", encoding="utf-8")
    (root / "secret.txt").symlink_to(tmp_path / "secret.txt")
    (root / "passwd.txt").symlink_to("/etc/passwd")
    (root / "linked").symlink_to(tmp_path, target_is_directory=True)
    out, _, failed = run_failing("knowledge_ingest", "handbook", str(root), "--json")
    summary = json.loads(out)
    assert (summary["new"], summary["failed"]) == (1, 2)
    assert str(failed) == "2 of 3 files failed."
    errors = {Path(f["path"]).name: f["error"] for f in summary["failures"]}
    reason = "links outside the directory being ingested (not read)"
    assert errors == {"secret.txt": reason, "passwd.txt": reason}
    assert [Path(p).name for p in summary["unsupported_files"]] == ["linked"]
    assert list(Document.objects.values_list("source_key", flat=True)) == ["good.md"]


def test_a_file_name_that_is_not_utf8_is_shown_escaped_in_json(kb, tmp_path):
    """stdout stays one document of valid UTF-8: the name's byte as `\\xe9`."""
    (tmp_path / "good.md").write_text("# Good\n\nFine.", encoding="utf-8")
    with open(os.fsencode(tmp_path) + b"/caf\xe9.md", "wb") as handle:  # a Latin-1 name
        handle.write(b"# Cafe\n\nMenu.")
    out = io.StringIO()
    with pytest.raises(CommandError):
        args = ("knowledge_ingest", "handbook", str(tmp_path), "--json")
        call_command(*args, stdout=out, stderr=io.StringIO())
    out.getvalue().encode("utf-8")  # no lone surrogate left
    summary = json.loads(out.getvalue())
    assert summary["new"] == 1
    assert [f["path"] for f in summary["failures"]] == [str(tmp_path) + "/caf\\xe9.md"]
    assert summary["failures"][0]["error"] == "its name is not UTF-8 text: rename the file"


def test_a_control_character_in_a_file_name_keeps_each_report_line_one_line(kb, tmp_path):
    (tmp_path / "two\nlines.md").write_bytes(b"\xff\xfe\x00broken")
    (tmp_path / "tab\there.docx").write_bytes(b"PK")
    _, err, failed = run_failing("knowledge_ingest", "handbook", str(tmp_path), "--no-progress")
    lines = err.splitlines()
    assert [line.split(": ")[0] for line in lines] == ["failed", "unsupported"]
    assert lines[0].startswith(f"failed: {tmp_path}/two\\nlines.md: not valid utf-16")
    assert lines[1] == f"unsupported: {tmp_path}/tab\\there.docx"
    assert str(failed) == "1 of 1 files failed."
    # JSON escapes them itself: the paths there are the files' own.
    out, _, _ = run_failing("knowledge_ingest", "handbook", str(tmp_path), "--json")
    summary = json.loads(out)
    assert [f["path"] for f in summary["failures"]] == [str(tmp_path / "two\nlines.md")]
    assert summary["unsupported_files"] == [str(tmp_path / "tab\there.docx")]
    # And in the command's own errors.
    with pytest.raises(CommandError) as refused:
        run("knowledge_ingest", "handbook", str(tmp_path / "two\nlines.md"), "--prune")
    assert len(str(refused.value).splitlines()) == 1
    assert "two\\nlines.md is a file" in str(refused.value)


def test_a_knowledge_base_whose_embedder_is_gone_stops_before_any_work(kb, tmp_path):
    KnowledgeBase.objects.filter(pk=kb.pk).update(embedder="retired")
    (tmp_path / "a.md").write_text("# A\n\nText.", encoding="utf-8")
    with pytest.raises(CommandError, match=r"^Knowledge base handbook: .*'retired'"):
        run("knowledge_ingest", "handbook", str(tmp_path))
    assert not Document.objects.exists()


def _deny_listing(monkeypatch, name):
    """Listing `name` fails as for a directory without read permission (the tests run as
    root, which permissions do not stop)."""
    real = os.scandir

    def scandir(path="."):
        if os.path.basename(os.fspath(path)) == name:
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)


@pytest.mark.parametrize("named", ["docs", "secret"])
def test_a_directory_that_cannot_be_listed_stops_the_command(kb, tmp_path, monkeypatch, named):
    """os.walk skipped it without a word: its files were missing and the exit status 0."""
    root = tmp_path / "docs"
    (root / "secret").mkdir(parents=True)
    (root / "a.md").write_text("# A\n\nReadable.", encoding="utf-8")
    (root / "secret" / "s.md").write_text("# S\n\nHidden.", encoding="utf-8")
    _deny_listing(monkeypatch, "secret")
    target = root / "secret" if named == "secret" else root
    with pytest.raises(CommandError, match=r"^Cannot list .*secret: Permission denied\.$"):
        run("knowledge_ingest", "handbook", str(target))
    assert not Document.objects.exists()


def test_two_files_with_one_source_key_stop_the_command(kb, tmp_path):
    """`one/readme.md` and `two/readme.md` are both `readme.md`: the second would silently
    have replaced the first."""
    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "readme.md").write_text(f"# {folder}\n\nText.", encoding="utf-8")
    with pytest.raises(CommandError, match=r"same document \(source key 'readme\.md'\): .*one"):
        run("knowledge_ingest", "handbook", str(tmp_path / "one"), str(tmp_path / "two"))
    assert not Document.objects.exists()
    out = run("knowledge_ingest", "handbook", str(tmp_path), "--no-progress")
    assert "2 new" in out
    assert sorted(Document.objects.values_list("source_key", flat=True)) == [
        "one/readme.md",
        "two/readme.md",
    ]


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")


def test_prune_deletes_the_documents_of_files_gone_from_the_tree(kb, tmp_path):
    root = tmp_path / "tree"
    _write(root, {"a.md": "# A\n\nAlpha.", "b.md": "# B\n\nBeta.", "old/c.md": "# C\n\nGamma."})
    run("knowledge_ingest", "handbook", str(root), "--no-progress")
    (root / "old/c.md").rename(root / "c.md")  # renamed
    (root / "b.md").unlink()  # deleted
    (root / "a.md").write_bytes(b"\xff\xfe broken")  # still there, fails to load: kept
    (root / "notes.docx").write_bytes(b"PK")  # unsupported: does not matter
    out, _, failed = run_failing("knowledge_ingest", "handbook", str(root), "--prune", "--json")
    summary = json.loads(out)
    assert failed.returncode == 1  # a.md failed
    assert (summary["new"], summary["failed"], summary["pruned"]) == (1, 1, 2)
    assert summary["pruned_documents"] == ["b.md", "old/c.md"]
    assert sorted(Document.objects.values_list("source_key", flat=True)) == ["a.md", "c.md"]
    # With nothing gone, nothing is pruned.
    (root / "a.md").write_text("# A\n\nAlpha again.", encoding="utf-8")
    text = run("knowledge_ingest", "handbook", str(root), "--prune", "--no-progress")
    assert "pruned:" not in text
    assert Document.objects.count() == 2


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_while_pruning_reports_what_was_pruned(kb, tmp_path, monkeypatch, signum):
    root = tmp_path / "tree"
    _write(root, {"a.md": "# A\n\nAlpha.", "b.md": "# B\n\nBeta.", "c.md": "# C\n\nGamma."})
    run("knowledge_ingest", "handbook", str(root), "--no-progress")
    (root / "b.md").unlink()
    (root / "c.md").unlink()
    deleted: list[str] = []

    def stopping_delete(kb, source_key):
        if deleted:  # the second deletion is interrupted
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            os.kill(os.getpid(), signum)
        deleted.append(source_key)
        return delete_document(kb, source_key)

    monkeypatch.setattr("bailing_knowledge.services.ingest.delete_document", stopping_delete)
    out, _, failed = run_failing("knowledge_ingest", "handbook", str(root), "--prune", "--json")
    summary = json.loads(out)
    assert failed.returncode == 128 + signum
    assert str(failed).startswith("Interrupted while pruning, 1 deleted so far;")
    assert (summary["interrupted"], summary["pruned"], summary["unchanged"]) == (True, 1, 1)
    assert summary["pruned_documents"] == deleted == ["b.md"]
    assert sorted(Document.objects.values_list("source_key", flat=True)) == ["a.md", "c.md"]
    # Run again, it finishes.
    monkeypatch.undo()
    summary = run_json("knowledge_ingest", "handbook", str(root), "--prune")
    assert summary["pruned_documents"] == ["c.md"]


def test_prune_refuses_files_and_an_empty_tree(kb, tmp_path):
    _write(tmp_path, {"docs/a.md": "# A\n\nAlpha."})
    run("knowledge_ingest", "handbook", str(tmp_path / "docs"), "--no-progress")
    with pytest.raises(CommandError, match=r"^--prune takes directories only \(.*a\.md is"):
        run("knowledge_ingest", "handbook", str(tmp_path / "docs/a.md"), "--prune")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CommandError, match=r"^No files under .*empty: --prune would delete"):
        run("knowledge_ingest", "handbook", str(tmp_path / "empty"), "--prune")
    assert Document.objects.count() == 1


def test_a_place_named_twice_is_ingested_once(kb, tmp_path):
    _write(tmp_path, {"docs/a.md": "# A\n\nAlpha.", "docs/sub/b.md": "# B\n\nBeta."})
    docs = tmp_path / "docs"
    summary = run_json("knowledge_ingest", "handbook", str(docs), str(docs / "sub/../../docs"))
    assert (summary["new"], summary["unchanged"]) == (2, 0)


@pytest.mark.parametrize("inner", ["sub", "sub/b.md", "a.md"])
def test_a_path_inside_a_directory_also_named_stops_the_command(kb, tmp_path, inner):
    """`docs/sub/b.md` would be both `sub/b.md` and `b.md`: two documents of one file."""
    _write(tmp_path, {"docs/a.md": "# A\n\nAlpha.", "docs/sub/b.md": "# B\n\nBeta."})
    docs = tmp_path / "docs"
    with pytest.raises(CommandError, match=r"^.*docs/[a-z/.]+ is inside .*docs, also named"):
        run("knowledge_ingest", "handbook", str(docs / inner), str(docs))
    assert not Document.objects.exists()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_ends_the_pass_with_a_summary(kb, tmp_path, signum):
    """Ctrl-C, or SIGTERM from a supervisor, after some files: those stay stored, the rest
    waits for the next run, and the summary says so."""
    seen: list[str] = []

    def stopping_loader(path: Path) -> LoadedDocument:
        seen.append(path.name)
        if len(seen) == 20:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            os.kill(os.getpid(), signum)
        return LoadedDocument(title=path.stem, body=f"Text of {path.stem}.")

    register_loader(".stop", stopping_loader)
    try:
        for number in range(30):
            (tmp_path / f"{number:02}.stop").write_text("x", encoding="utf-8")
        out, _, failed = run_failing("knowledge_ingest", "handbook", str(tmp_path), "--json")
    finally:
        unregister_loader(".stop")
    summary = json.loads(out)
    assert failed.returncode == 128 + signum
    assert str(failed).startswith("Interrupted after ")
    assert summary["interrupted"] is True
    stored = Document.objects.count()
    assert summary["new"] == stored and 0 < stored < 20
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
