"""File loaders and file discovery, on real files: the committed samples under `files/`.

DB-free: loaders are pure functions of a file's bytes.
"""

from __future__ import annotations

import codecs
import logging
import os
import sys
from pathlib import Path

import pytest

from bailing_knowledge.ingestion import loaders
from bailing_knowledge.ingestion.loaders import (
    SUPPORTED_SUFFIXES,
    Discovered,
    LoadedDocument,
    LoaderError,
    discover,
    get_loader,
    html_to_text,
    iter_files,
    load_file,
    markdown_title,
    normalize_text,
    register_loader,
    supported_suffixes,
    unregister_loader,
)
from bailing_knowledge.markdown import find_headings

FILES = Path(__file__).resolve().parent / "files"


# --- A minimal PDF, written by hand -------------------------------------------------------


def _pdf_string(text: str) -> bytes:
    escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
    return b"(" + escaped.encode("latin-1") + b")"


def build_pdf(pages: list[list[str]], title: str | None = None) -> bytes:
    """A valid PDF 1.4 file: one Helvetica text line per string, pages in order.

    Writing the few objects by hand (catalog, page tree, font, info, a page and a content
    stream per page) with exact cross-reference offsets keeps the sample reproducible and
    independent of any PDF-writing library. `files/sample.pdf` is this function's output.
    """
    objects: list[bytes] = []
    font, info = 3, 4
    page_ids = [5 + 2 * i for i in range(len(pages))]
    kids = b" ".join(b"%d 0 R" % page_id for page_id in page_ids)
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, len(pages)))
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    info_entries = b"/Producer (bailing_knowledge tests)"
    if title is not None:
        info_entries = b"/Title " + _pdf_string(title) + b" " + info_entries
    objects.append(b"<< " + info_entries + b" >>")
    for page_id, lines in zip(page_ids, pages, strict=True):
        text = b" T* ".join(_pdf_string(line) + b" Tj" for line in lines)
        stream = b"BT /F1 12 Tf 16 TL 72 720 Td " + text + b" ET"
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            b"/Resources << /Font << /F1 %d 0 R >> >> /Contents %d 0 R >>" % (font, page_id + 1)
        )
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream))
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root 1 0 R /Info %d 0 R >>\n" % (len(objects) + 1, info)
    out += b"startxref\n%d\n%%%%EOF\n" % xref
    return bytes(out)


SAMPLE_PDF_PAGES = [
    ["Warranty terms", "Every device has a two year warranty."],
    ["Repairs (outside the warranty) are charged at cost."],
]
SAMPLE_PDF_TITLE = "Warranty handbook"


def test_committed_sample_pdf_is_reproducible():
    assert (FILES / "sample.pdf").read_bytes() == build_pdf(SAMPLE_PDF_PAGES, SAMPLE_PDF_TITLE)


# --- Plain text -----------------------------------------------------------------------------


def test_text_strips_the_bom_and_normalises_crlf():
    raw = (FILES / "welcome-note.txt").read_bytes()
    assert raw.startswith(codecs.BOM_UTF8) and b"\r\n" in raw
    doc = load_file(FILES / "welcome-note.txt")
    assert doc == LoadedDocument(
        title="welcome-note",
        body="Welcome to the support desk.\nOpening hours are 9 to 5.\n\nCall us any time.\n",
        metadata={"content_type": "text/plain", "source_path": "welcome-note.txt"},
    )


def test_text_that_is_not_utf8_is_reported_not_guessed():
    with pytest.raises(LoaderError) as excinfo:
        load_file(FILES / "latin1-menu.txt")
    assert str(excinfo.value) == (
        "latin1-menu.txt: not valid UTF-8 text (undecodable byte at offset 3)"
    )
    assert excinfo.value.name == "latin1-menu.txt"


@pytest.mark.parametrize(
    ("bom", "payload", "offset"),
    [
        (codecs.BOM_UTF8, b"caf\xe9 au lait", 3 + 3),
        (codecs.BOM_UTF16_LE, "café".encode("utf-16-le") + b"\x00\xd8A\x00", 2 + 8),
    ],
)
def test_the_offset_of_a_bad_byte_counts_from_the_start_of_the_file(tmp_path, bom, payload, offset):
    """Not from after the byte-order mark: the offset is for finding the byte in the file."""
    path = tmp_path / "menu.txt"
    path.write_bytes(bom + payload)
    with pytest.raises(LoaderError, match=rf"undecodable byte at offset {offset}\)$"):
        load_file(path)


def test_error_messages_name_the_source_key_never_the_machine_path():
    with pytest.raises(LoaderError) as excinfo:
        load_file(FILES / "latin1-menu.txt", source_key="menus/latin1-menu.txt")
    assert str(excinfo.value).startswith("menus/latin1-menu.txt: not valid UTF-8")
    assert str(FILES) not in str(excinfo.value)


def test_utf16_with_bom_is_decoded(tmp_path):
    path = tmp_path / "notes.TXT"  # suffixes are matched case-insensitively
    path.write_bytes(codecs.BOM_UTF16_LE + "Grüße\r\naus Köln".encode("utf-16-le"))
    assert load_file(path).body == "Grüße\naus Köln"


def test_nul_characters_and_lone_carriage_returns_are_normalised(tmp_path):
    path = tmp_path / "legacy.txt"
    path.write_bytes(b"old\rmac\x00 file\r\n")
    assert load_file(path).body == "old\nmac file\n"


@pytest.mark.parametrize("content", [b"", b"  \r\n\t\n", b"\x00\x00"])
def test_a_file_without_text_is_an_error(tmp_path, content):
    path = tmp_path / "empty.txt"
    path.write_bytes(content)
    with pytest.raises(LoaderError, match=r"^empty\.txt: no text$"):
        load_file(path)


def test_normalize_text_keeps_everything_else():
    text = "tab\there\u2028nbsp\xa0 \U0001f600 e\u0301 \x1f end  "
    assert normalize_text(text) == text
    assert normalize_text("a\ud800b") == "ab"  # unpaired surrogates cannot be stored


# --- Markdown -------------------------------------------------------------------------------


def test_markdown_body_is_the_source_and_title_the_first_heading():
    doc = load_file(FILES / "guide.md", source_key="docs/guide.md")
    assert doc.title == "Getting started"  # inline markup removed; front matter skipped
    assert doc.body == (FILES / "guide.md").read_text(encoding="utf-8")
    assert doc.metadata == {"content_type": "text/markdown", "source_path": "docs/guide.md"}


def test_chinese_markdown():
    doc = load_file(FILES / "returns-zh.md")
    assert doc.title == "退货政策"
    assert "商品在签收后三十天内可以退货。" in doc.body


@pytest.mark.parametrize(
    ("text", "title"),
    [
        ("---\ntitle: 'From front matter'\n---\n# Heading\n", "From front matter"),
        # Read as YAML reads the scalar: escapes, folded and literal blocks, continuations.
        ('---\ntitle: "Say \\"hi\\" \\u00e9"\n---\n', 'Say "hi" é'),
        ("---\ntitle: 'It''s here'\n---\n", "It's here"),
        ("---\ntitle: >-\n  Folded\n  title\nlayout: page\n---\n# Heading\n", "Folded title"),
        ("---\ntitle: |\n  Literal\n\n  block\n---\n", "Literal block"),
        ("---\ntitle:\n  On the next line\n---\n", "On the next line"),
        ("---\ntitle: Plain text # a comment\n---\n", "Plain text"),
        ('---\ntitle: ""\n---\n# Heading\n', "Heading"),
        ("---\ntitle: null\n---\n# Heading\n", "Heading"),
        ("---\ntitle: ~\n---\n# Heading\n", "Heading"),
        ("---\ntitle: null  # none yet\n---\n# Heading\n", "Heading"),
        ("---\ntitle: 'null'\n---\n# Heading\n", "null"),
        ("Intro line\n\n## Second level\n\n# First level\n", "First level"),
        ("Some text\n\n### Only a third level ###\n", "Only a third level"),
        ("Setext **title**\n================\n\nBody\n", "Setext title"),
        ("Paragraph line one\nline two\n---\n", ""),  # a multi-line paragraph: not a heading
        ("```\n# inside a fence\n```\n", ""),
        ("#hashtag is not a heading\n", ""),
        ("# [Linked](https://x.test) and `code` in snake_case\n", "Linked and code in snake_case"),
    ],
)
def test_markdown_title(text, title):
    assert markdown_title(text) == title


def test_markdown_without_heading_is_titled_by_the_file_stem(tmp_path):
    path = tmp_path / "faq-shipping.markdown"
    path.write_text("Just a paragraph.\n", encoding="utf-8")
    assert load_file(path).title == "faq-shipping"


def test_long_titles_are_cut_to_fit_the_model_field(tmp_path):
    path = tmp_path / "long.md"
    path.write_text("# " + "e\u0301" * 400 + "\n\nBody\n", encoding="utf-8")
    title = load_file(path).title
    assert len(title) <= loaders.TITLE_MAX_CHARS
    assert title == "e\u0301" * 250  # cut between grapheme clusters, not inside one


def test_control_characters_never_reach_a_title(tmp_path):
    """A YAML escape (or an HTML character reference) can spell one; in a hint's JSON each
    would cost six bytes of the budget and say nothing."""
    path = tmp_path / "odd.md"
    path.write_text('---\ntitle: "Bell\\a and\\x01 \\x85 more"\n---\nText.\n', encoding="utf-8")
    assert load_file(path).title == "Bell and more"
    assert loaders._clean_title("A\x01B\x7fC\x9fD") == "A B C D"  # any loader's title


# --- HTML -----------------------------------------------------------------------------------


def test_html_keeps_visible_text_with_structure():
    doc = load_file(FILES / "page.html")
    assert doc.title == "Returns & Refunds"
    assert doc.metadata["content_type"] == "text/html"
    assert doc.body == (
        "Home\n\n"
        "# Returns policy\n\n"
        "Items can be returned within 30\xa0days of delivery \u2014 no questions asked.\n\n"
        "## How to return\n\n"
        "1. Open My orders.\n"
        "2. Choose the item & click Return.\n\n"
        "- Keep the receipt\n"
        "- Use the original box\n"
        "  - if you still have it\n\n"
        "Region | Days\n"
        "EU | 30\n\n"
        "```\nline one\n"
        "  indented line\n```\n\n"
        "Caf\u00e9 <b> \U0001f600\n"
        "Second line"
    )
    for hidden in ("secret", "font-family", "Enable JavaScript", "hidden template", "nope"):
        assert hidden not in doc.body


def test_html_text_does_not_start_sections_of_its_own():
    """Only h1-h6 become headings: a shell comment in `pre`, or a paragraph that happens to
    start like Markdown structure, stays text."""
    html = (
        "<h2>Setup</h2><pre># install it\nmake\n---\n```inner```</pre>"
        "<p># of seats</p><p>Total<br>---</p><p>~~~ wave</p>"
        "<ul><li><pre># listed</pre></li></ul>"
    )
    _, body = html_to_text(html)
    assert [h.text for h in find_headings(body)] == ["Setup"]
    assert body == (
        "## Setup\n\n"
        "````\n# install it\nmake\n---\n```inner```\n````\n\n"
        "\\# of seats\n\n"
        "Total\n\\---\n\n"
        "\\~~~ wave\n\n"
        "-\n```\n# listed\n```"
    )


def test_html_table_cells_are_joined_once_they_hold_text():
    cells = "<td> </td><td>a</td><td></td>" + "<td>b</td>" * 3
    assert html_to_text(f"<table><tr>{cells}</tr></table>")[1] == "a | | b | b | b"


def test_html_title_falls_back_to_the_first_h1_then_the_stem(tmp_path):
    assert html_to_text("<h2>Sub</h2><h1>Main <b>one</b></h1><p>x</p>")[0] == "Main one"
    path = tmp_path / "untitled.htm"
    path.write_text("<p>Only a paragraph</p>", encoding="utf-8")
    doc = load_file(path)
    assert (doc.title, doc.body) == ("untitled", "Only a paragraph")


def test_html_without_a_closed_head_still_shows_its_body():
    title, body = html_to_text("<html><head><title>T</title><body><p>Visible</p></body>")
    assert (title, body) == ("T", "Visible")


def test_html_declared_charset_is_honoured(tmp_path):
    path = tmp_path / "legacy.html"
    path.write_bytes(b'<meta charset="iso-8859-1"><p>Caf\xe9 \x80 5</p>')
    assert load_file(path).body == "Caf\u00e9 \u20ac 5"  # ISO-8859-1 is read as windows-1252


def test_html_empty_list_items_do_not_leak_their_marker():
    assert html_to_text("<ul><li></li></ul><p>Text</p>")[1] == "Text"


def test_html_with_no_visible_text_is_an_error(tmp_path):
    path = tmp_path / "blank.html"
    path.write_text("<html><head><title>Only a title</title></head><body> </body></html>")
    with pytest.raises(LoaderError, match="no text"):
        load_file(path)


# --- PDF ------------------------------------------------------------------------------------


def test_pdf_text_per_page_and_metadata_title():
    pytest.importorskip("pypdf")
    doc = load_file(FILES / "sample.pdf")
    assert doc.title == SAMPLE_PDF_TITLE
    assert doc.metadata == {
        "content_type": "application/pdf",
        "pages": 2,
        "source_path": "sample.pdf",
    }
    assert doc.body == (
        "Warranty terms\nEvery device has a two year warranty.\n\n"
        "Repairs (outside the warranty) are charged at cost."
    )


def test_pdf_without_title_metadata_is_titled_by_the_stem(tmp_path):
    pytest.importorskip("pypdf")
    path = tmp_path / "manual.pdf"
    path.write_bytes(build_pdf([["Hello"]]))
    assert load_file(path).title == "manual"


def test_pdf_that_is_encrypted_is_reported(tmp_path):
    pypdf = pytest.importorskip("pypdf")
    writer = pypdf.PdfWriter(clone_from=pypdf.PdfReader(FILES / "sample.pdf"))
    writer.encrypt(user_password="s3cret", owner_password="owner", algorithm="AES-128")
    path = tmp_path / "locked.pdf"
    with path.open("wb") as handle:
        writer.write(handle)
    with pytest.raises(LoaderError, match=r"^locked\.pdf: the PDF is encrypted$"):
        load_file(path)


def test_pdf_protected_only_by_an_owner_password_is_read(tmp_path):
    pypdf = pytest.importorskip("pypdf")
    writer = pypdf.PdfWriter(clone_from=pypdf.PdfReader(FILES / "sample.pdf"))
    writer.encrypt(user_password="", owner_password="owner", algorithm="AES-128")
    path = tmp_path / "no-print.pdf"
    with path.open("wb") as handle:
        writer.write(handle)
    assert "two year warranty" in load_file(path).body


def test_pdf_that_is_damaged_is_reported(tmp_path):
    pytest.importorskip("pypdf")
    path = tmp_path / "broken.pdf"
    path.write_bytes(b"%PDF-1.4\nthis is not a pdf at all\n")
    with pytest.raises(LoaderError, match=r"^broken\.pdf: (not a readable PDF|no text)"):
        load_file(path)


def test_why_pypdf_cannot_read_a_pdf_is_in_its_failure(tmp_path, caplog):
    """pypdf logs the cause, naming no file, and raises an error that says less."""
    pytest.importorskip("pypdf")
    caplog.set_level(logging.WARNING)
    broken = tmp_path / "broken.pdf"
    broken.write_bytes(b"%PDF-1.4\nbroken")
    with pytest.raises(LoaderError) as excinfo:
        load_file(broken)
    assert str(excinfo.value) == (
        "broken.pdf: not a readable PDF (PdfStreamError; EOF marker not found)"
    )
    # pypdf's own line reaches the host's handlers as before.
    assert [r.getMessage() for r in caplog.records if r.name.startswith("pypdf")] == [
        "EOF marker not found"
    ]
    data = build_pdf([["Repaired text"]])
    repaired = tmp_path / "repaired.pdf"
    repaired.write_bytes(data[: data.rindex(b"startxref")] + b"startxref\n9\n%%EOF\n")
    assert load_file(repaired).body == "Repaired text"


def test_pdf_without_pypdf_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "pypdf", None)  # makes `import pypdf` fail
    with pytest.raises(LoaderError) as excinfo:
        load_file(FILES / "sample.pdf")
    assert str(excinfo.value) == (
        'sample.pdf: reading PDF files needs pypdf: pip install "bailing-knowledge[pdf]"'
    )


# --- Unsupported files and the registry ----------------------------------------------------


def test_unsupported_suffix_is_an_error_for_load_file():
    with pytest.raises(LoaderError, match=r"^contract\.docx: unsupported file type '\.docx'$"):
        load_file(FILES / "contract.docx")


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(LoaderError, match=r"^gone\.txt: not a readable file$"):
        load_file(tmp_path / "gone.txt")


@pytest.fixture
def registry():
    """Restore the loader registry after a test that changes it."""
    saved = dict(loaders._LOADERS)
    yield
    loaders._LOADERS.clear()
    loaders._LOADERS.update(saved)


def test_builtin_suffixes():
    assert {".txt", ".md", ".markdown", ".html", ".htm", ".pdf"} == SUPPORTED_SUFFIXES


def test_a_host_can_register_a_loader(registry, tmp_path):
    def load_rst(path: Path) -> LoadedDocument:
        text = path.read_text(encoding="utf-8")
        title, _, _ = text.partition("\n")
        return LoadedDocument(title=title, body=text, metadata={"content_type": "text/x-rst"})

    register_loader("RST", load_rst)  # leading dot and case are optional
    assert ".rst" in supported_suffixes()
    assert get_loader("guide.rst") is load_rst
    path = tmp_path / "guide.rst"
    path.write_text("Guide\n=====\r\n\r\nText\x00.\n", encoding="utf-8")
    doc = load_file(path, source_key="manuals/guide.rst")
    assert doc == LoadedDocument(
        title="Guide",
        body="Guide\n=====\n\nText.\n",  # the common normalisation applies to every loader
        metadata={"content_type": "text/x-rst", "source_path": "manuals/guide.rst"},
    )
    assert discover([path])[0].supported
    unregister_loader(".rst")
    assert get_loader("guide.rst") is None


def test_registering_a_taken_suffix_needs_replace(registry):
    with pytest.raises(ValueError, match="already registered"):
        register_loader(".md", loaders.load_text)
    register_loader(".md", loaders.load_text, replace=True)
    assert get_loader("x.md") is loaders.load_text


@pytest.mark.parametrize("suffix", ["", ".", "a/b", "  ", ".tar.gz", ". md"])
def test_registering_a_bad_suffix_is_refused(registry, suffix):
    with pytest.raises(ValueError, match="not a file suffix"):
        register_loader(suffix, loaders.load_text)


def test_unexpected_loader_failures_become_safe_errors(registry, tmp_path):
    def broken(path: Path) -> LoadedDocument:
        raise RuntimeError(f"secret detail about {path}")

    register_loader(".bin", broken)
    path = tmp_path / "data.bin"
    path.write_bytes(b"x")
    with pytest.raises(LoaderError) as excinfo:
        load_file(path)
    assert str(excinfo.value) == "data.bin: could not be loaded (RuntimeError)"
    assert isinstance(excinfo.value.__cause__, RuntimeError)


# --- Discovery ------------------------------------------------------------------------------


def _tree(root: Path, files: list[str]) -> None:
    for name in files:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"text of {name}\n", encoding="utf-8")


def test_iter_files_is_sorted_relative_and_skips_hidden(tmp_path):
    _tree(
        tmp_path,
        [
            "b.md",
            "a/z.txt",
            "a/b/c.html",
            "a.txt",
            ".env",
            ".git/config",
            "a/.hidden/secret.md",
            "a/.draft.md",
            "C.md",
        ],
    )
    keys = [key for _, key in iter_files(tmp_path)]
    assert keys == ["C.md", "a/b/c.html", "a/z.txt", "a.txt", "b.md"]
    for path, key in iter_files(tmp_path):
        assert path == tmp_path / key


def test_iter_files_of_a_single_file_keys_it_by_name(tmp_path):
    _tree(tmp_path, ["deep/dir/report.md"])
    assert list(iter_files(tmp_path / "deep/dir/report.md")) == [
        (tmp_path / "deep/dir/report.md", "report.md")
    ]


def test_iter_files_follows_file_links_but_not_directory_links(tmp_path):
    _tree(tmp_path, ["docs/real.md", "elsewhere/outside.md"])
    (tmp_path / "docs/link.md").symlink_to(tmp_path / "docs/real.md")
    (tmp_path / "docs/loop").symlink_to(tmp_path / "docs", target_is_directory=True)
    (tmp_path / "docs/dangling.md").symlink_to(tmp_path / "missing.md")
    os.mkfifo(tmp_path / "docs/pipe.md")
    keys = [key for _, key in iter_files(tmp_path / "docs")]
    # What cannot be read is listed, for loading to report: never silently left out.
    assert keys == ["dangling.md", "link.md", "loop", "pipe.md", "real.md"]
    for name in ("dangling.md", "pipe.md"):
        with pytest.raises(LoaderError, match=rf"^{name}: not a readable file$"):
            load_file(tmp_path / "docs" / name)


def test_a_link_out_of_the_tree_is_refused_when_loaded_under_its_root(tmp_path):
    _tree(tmp_path, ["docs/real.md", "secret.md"])
    docs = tmp_path / "docs"
    (docs / "inside.md").symlink_to(docs / "real.md")
    (docs / "outside.md").symlink_to(tmp_path / "secret.md")
    (docs / "passwd.md").symlink_to("/etc/passwd")
    (docs / "dotdot.md").symlink_to("../secret.md")
    (docs / "gone.md").symlink_to(tmp_path / "nowhere.md")
    assert load_file(docs / "inside.md", root=docs).body.strip()
    for name in ("outside.md", "passwd.md", "dotdot.md", "gone.md"):
        with pytest.raises(LoaderError, match=rf"^{name}: links outside the directory"):
            load_file(docs / name, root=docs)
    # Named directly, or found under the directory the link points into, it is read.
    assert load_file(docs / "outside.md").body.strip()
    assert load_file(docs / "outside.md", root=tmp_path).body.strip()


def test_a_link_to_a_hidden_file_inside_the_tree_is_refused(tmp_path):
    _tree(tmp_path, ["docs/real.md", "docs/.git/notes.md"])
    docs = tmp_path / "docs"
    (docs / ".env").write_text("SECRET_KEY=do-not-index\n", encoding="utf-8")
    (docs / "env.md").symlink_to(".env")
    (docs / "notes.md").symlink_to(docs / ".git/notes.md")
    for name in ("env.md", "notes.md"):
        with pytest.raises(LoaderError, match=rf"^{name}: links to a hidden file or directory"):
            load_file(docs / name, root=docs)
    # A tree that is itself under a hidden directory is not refused for it.
    hidden_root = tmp_path / ".site"
    _tree(hidden_root, ["a.md"])
    (hidden_root / "b.md").symlink_to("a.md")
    assert load_file(hidden_root / "b.md", root=hidden_root).body.strip()


def test_a_root_reached_through_a_link_keeps_its_own_links(tmp_path):
    _tree(tmp_path, ["real/a.md"])
    (tmp_path / "real/b.md").symlink_to("a.md")
    (tmp_path / "alias").symlink_to(tmp_path / "real", target_is_directory=True)
    found = discover([tmp_path / "alias"])
    assert [(item.source_key, item.root) for item in found] == [
        ("a.md", tmp_path / "alias"),
        ("b.md", tmp_path / "alias"),
    ]
    for item in found:
        assert load_file(item.path, source_key=item.source_key, root=item.root).body


def test_a_file_name_that_is_not_utf8_says_so(tmp_path):
    path = Path(os.fsdecode(os.fsencode(tmp_path) + b"/caf\xe9.md"))
    path.write_text("# Cafe\n\nMenu.", encoding="utf-8")
    with pytest.raises(LoaderError, match=r"its name is not UTF-8 text: rename the file$"):
        load_file(path)


def test_iter_files_of_a_missing_path_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        list(iter_files(tmp_path / "nope"))


def test_discover_reports_unsupported_files_without_failing():
    found = discover([FILES])
    assert [(item.source_key, item.supported) for item in found] == [
        ("contract.docx", False),
        ("guide.md", True),
        ("latin1-menu.txt", True),
        ("page.html", True),
        ("returns-zh.md", True),
        ("sample.pdf", True),
        ("welcome-note.txt", True),
    ]
    assert all(isinstance(item, Discovered) and item.path.parent == FILES for item in found)


def test_discover_keeps_the_order_of_its_arguments(tmp_path):
    _tree(tmp_path, ["z/one.md", "a/two.md", "a/three.TXT"])
    found = discover([tmp_path / "z", tmp_path / "a"])
    assert [(item.source_key, item.supported) for item in found] == [
        ("one.md", True),
        ("three.TXT", True),
        ("two.md", True),
    ]


def test_every_committed_sample_loads_or_fails_cleanly():
    """The ingest command's loop: each file either loads or raises LoaderError."""
    outcomes = {}
    for item in discover([FILES]):
        try:
            doc = load_file(item.path, source_key=item.source_key)
        except LoaderError as exc:
            outcomes[item.source_key] = exc.reason.split(" (")[0]
        else:
            assert doc.body.strip() and doc.title and "\r" not in doc.body
            outcomes[item.source_key] = "ok"
    if "sample.pdf" in outcomes and "pypdf" in outcomes["sample.pdf"]:
        outcomes["sample.pdf"] = "ok"  # pypdf is optional
    assert outcomes == {
        "contract.docx": "unsupported file type '.docx'",
        "guide.md": "ok",
        "latin1-menu.txt": "not valid UTF-8 text",
        "page.html": "ok",
        "returns-zh.md": "ok",
        "sample.pdf": "ok",
        "welcome-note.txt": "ok",
    }
