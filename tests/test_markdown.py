"""Markdown structure: headings and front matter, by example and against a full scan.

DB-free: pure functions of a string.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bailing_knowledge import markdown
from bailing_knowledge.markdown import (
    Heading,
    PieceTooShort,
    find_headings,
    front_matter_end,
    last_heading,
)


def test_find_headings():
    body = (
        "---\ntitle: x\n---\n"  # front matter: its closing line is no setext underline
        "# One #\n"
        "text\n\n"
        "Two *em*\n===\n\n"
        "~~~\n## not one\n~~~\n"
        "   ### Three\n"
        "    #### indented code\n"
        "#### \n"
    )
    assert [(h.level, h.text) for h in find_headings(body)] == [
        (1, "One"),
        (1, "Two em"),
        (3, "Three"),
        (4, ""),
    ]
    first = find_headings(body)[0]
    assert first == Heading(start=17, end=24, level=1, text="One")
    assert body[first.start : first.end] == "# One #"


# --- The last heading before a position, from the beginning of a document -----------------

# Lines the heading rule treats differently: headings of both kinds and their look-alikes,
# fences (with and without info strings), underline and front-matter look-alikes, blank lines.
STRUCTURE_LINES = [
    "# Title",
    "## Sub *em*",
    "###### six",
    "####### seven",
    "#no",
    "   # three",
    "    # four",
    "Text line",
    "Another paragraph line.",
    "",
    " ",
    "\u3000",
    "===",
    "---",
    "--- ",
    "----",
    "\t---",
    "= =",
    "- item",
    "1. item",
    "> quote",
    "```",
    "```python",
    "``` x ` y",
    "~~~",
    "~~~~",
    "````",
    "  ```",
    "    ```",
    "  ~~~ info",
    "Title\r",
    "===\r",
    "e\u0301 \U0001f44d\U0001f3fd 中文",
    "...",
    "#",
    "text ```inline``` here",
    "`code` and ~tilde~",
]
markdown_documents = st.builds(
    lambda front, lines, end: front + "\n".join(lines) + end,
    st.sampled_from(["", "---\ntitle: x\n```\n---\n", "---\na: b\n"]),
    st.lists(st.sampled_from(STRUCTURE_LINES), min_size=1, max_size=80),
    st.sampled_from(["", "\n"]),
)


@settings(max_examples=1500, deadline=None)
@given(body=markdown_documents, data=st.data())
def test_last_heading_agrees_with_find_headings(body, data):
    position = data.draw(st.integers(0, len(body)), label="position")
    floor = data.draw(st.integers(0, position), label="floor")
    cut = data.draw(st.integers(position, len(body)), label="cut")
    reach = data.draw(st.sampled_from([1, 7, 4096]), label="first reach")
    before = [h for h in find_headings(body) if h.start <= position]
    expected = before[-1] if before else None
    original = markdown._FIRST_REACH
    markdown._FIRST_REACH = reach  # restart close to the position, then further back
    try:
        found = last_heading(body[:cut], position, floor=floor, complete=cut == len(body))
    except PieceTooShort:
        # Only when the piece ends before the line after the position's line, or inside a
        # front-matter block that may go on.
        text = body[:cut]
        line_end = text.find("\n", position)
        next_line_cut = line_end < 0 or text.find("\n", line_end + 1) < 0
        if not next_line_cut:
            with pytest.raises(PieceTooShort):
                front_matter_end(text, whole=False)
        assert cut < len(body)
        return
    finally:
        markdown._FIRST_REACH = original
    if expected is not None and expected.start >= floor:
        assert found == expected
    else:
        assert found in (None, expected)


def test_last_heading_sees_code_fences_opened_long_before():
    body = "# Top\n\n```\n" + "code\n" * 50_000 + "# comment, not a heading\n" + "x\n" * 10
    position = body.index("# comment") + 5
    assert last_heading(body, position, floor=position - 1000, complete=True) is None
    assert last_heading(body, position, complete=True) == find_headings(body)[0]
    closed = body.replace("code\n" * 50_000, "code\n```\n" + "prose\n" * 50_000)
    position = closed.index("# comment") + 5
    assert last_heading(closed, position, complete=True) == find_headings(closed)[-1]


def test_last_heading_scans_near_the_position_only():
    sections = "".join(f"\n## Section {i}\n\n" + "A sentence of prose. " * 150 for i in range(500))
    body = "# Handbook\n" + sections  # 1.6 MB
    position = len(body) - 1000
    calls = []
    original = markdown._scan_headings

    def counting(text, skip_until, fence):
        calls.append(len(text) - skip_until)
        return original(text, skip_until, fence)

    markdown._scan_headings = counting
    try:
        found = last_heading(body, position, complete=True)
    finally:
        markdown._scan_headings = original
    assert found == find_headings(body)[-1]
    assert sum(calls) < 20_000  # a few KB, not 1.6 MB


def test_last_heading_needs_the_line_after_the_position():
    body = "Heading text\n===\n"
    with pytest.raises(PieceTooShort):
        last_heading(body[:13], 3)  # the underline is cut off
    assert last_heading(body[:13], 3, complete=True) is None  # ... or the body ends there
    assert last_heading(body, 3) == Heading(0, 16, 1, "Heading text")


def test_front_matter_end_of_a_beginning():
    assert front_matter_end("---\na: b\n---\nText", whole=False) == 13
    assert front_matter_end("# Title\n", whole=False) == 0
    assert front_matter_end("----\n", whole=False) == 0
    for beginning in ("---\na: b\n", "---\na: b\n---", "---"):
        with pytest.raises(PieceTooShort):
            front_matter_end(beginning, whole=False)
        front_matter_end(beginning)  # the whole document: no doubt left


# Text shaped to hit the structure rules: marks, spaces and words, in lines.
structured_text = st.lists(st.text(alphabet="#=-`~ \tax", max_size=12), min_size=1, max_size=6).map(
    "\n".join
)


@given(text=structured_text)
def test_a_code_block_holds_no_heading_whatever_its_text(text):
    body = f"Before\n\n{markdown.code_block(text)}\n\n# After"
    assert [h.text for h in find_headings(body)] == ["After"]


@given(lines=st.lists(st.text(alphabet="#=-`~ \tax", max_size=12), min_size=1, max_size=6))
def test_escaped_lines_start_no_structure(lines):
    """Escaped line by line, converted text neither starts a heading nor opens a fence that
    would hide the real heading after it."""
    body = "\n".join(markdown.escape_line_start(line) for line in lines if "\n" not in line)
    assert [h.text for h in find_headings(f"{body}\n\n# After")] == ["After"]


@pytest.mark.parametrize(
    ("line", "escaped"),
    [
        ("# of seats", "\\# of seats"),
        ("  ### deep", "  \\### deep"),
        ("---", "\\---"),
        ("===  ", "\\===  "),
        ("```python", "\\```python"),
        ("~~~", "\\~~~"),
        ("#hashtag", "#hashtag"),
        ("####### seven", "####### seven"),
        ("    # indented code", "    # indented code"),
        ("-- dash", "-- dash"),
        ("plain", "plain"),
    ],
)
def test_escape_line_start(line, escaped):
    assert markdown.escape_line_start(line) == escaped
