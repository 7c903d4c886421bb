"""Markdown structure: where the headings and a leading front-matter block of a text are.

The chunker starts sections at headings, the loaders take a title from the first one and
skip front matter, and a read page labels itself with the heading it sits under: all three
ask here, so they agree on what a heading is. Pure functions over `str`, no database.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "Heading",
    "PieceTooShort",
    "code_block",
    "escape_line_start",
    "find_headings",
    "front_matter_end",
    "last_heading",
    "plain_heading_text",
]


@dataclass(frozen=True)
class Heading:
    """A Markdown heading: `start` is the offset of its first line, `end` the end of its last
    line (before the newline), `text` the heading without its `#` marks or inline markup."""

    start: int
    end: int
    level: int
    text: str


# Lines that matter for headings: fences (to ignore headings inside code), ATX headings and
# setext underlines. `^`/`$` in MULTILINE mode match around "\n" only.
_STRUCTURE = re.compile(
    r"^ {0,3}(?:"
    r"(?P<fence>`{3,}|~{3,})(?P<info>[^\n]*)"
    r"|(?P<atx>#{1,6})(?=[ \t]|\r?$)(?P<atx_text>[^\n]*)"
    r"|(?P<setext>=+|-+)[ \t\r]*$"
    r")",
    re.MULTILINE,
)
# YAML front matter at the very start: a `---` line, anything, a `---` or `...` line.
_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(?:[^\n]*\n)*?(?:---|\.\.\.)[ \t]*\r?(?:\n|\Z)")
_FRONT_MATTER_OPEN = re.compile(r"\A---[ \t]*\r?\n")
# A fence line alone (the `fence` branch of `_STRUCTURE`): where code blocks open and close.
_FENCE_LINE = re.compile(r"^ {0,3}(`{3,}|~{3,})([^\n]*)", re.MULTILINE)
# Lines that cannot be the text of a setext heading: indented code, list items, quotes.
_NOT_PARAGRAPH = re.compile(r"(?: {4}|\t|\s*(?:[-*+>]|\d{1,9}[.)])(?:\s|$))")
_ATX_CLOSING = re.compile(r"(?:^|[ \t]+)#+[ \t]*$")
_INLINE_MARKUP = [
    (re.compile(r"!?\[([^\]]*)\]\([^)]*\)"), r"\1"),  # links and images: keep the label
    (re.compile(r"<[^>\n]+>"), ""),  # inline HTML tags and autolinks' brackets
    (re.compile(r"(\*\*|__)(.+?)\1"), r"\2"),  # strong
    (re.compile(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])"), r"\1"),  # emphasis
    (re.compile(r"(?<!\w)_(?!\s)(.+?)(?<!\s)_(?!\w)"), r"\1"),  # emphasis, not snake_case
    (re.compile(r"`+"), ""),  # code spans
    (re.compile(r"\\([!-/:-@\[-`{-~])"), r"\1"),  # backslash escapes
]
_SPACES = re.compile(r"\s+")

# The open code fence while a scan is inside one: its character and its length.
_Fence = tuple[str, int]

# How far before the position `last_heading` first looks; the distance doubles while no
# heading turns up.
_FIRST_REACH = 4096


class PieceTooShort(ValueError):
    """A piece of a document does not hold what the answer depends on: read more of it."""


def plain_heading_text(markdown: str) -> str:
    """Heading text without inline Markdown: what a person would read as the heading."""
    text = markdown
    for pattern, replacement in _INLINE_MARKUP:
        text = pattern.sub(replacement, text)
    return _SPACES.sub(" ", text).strip()


# What a line of plain text may start with that `_STRUCTURE` would read as structure.
_STRUCTURE_START = re.compile(r"(?:#{1,6}(?=[ \t]|$)|[=-]+[ \t]*$|`{3,}|~{3,})")
_BACKTICKS = re.compile(r"`{3,}")


def escape_line_start(line: str) -> str:
    """`line`, a line of plain text, with a backslash before a start that Markdown would read
    as a heading, a setext underline or a code fence ("# 1 in sales", "---"), so that text
    converted from another format does not start sections of its own."""
    stripped = line.lstrip(" ")
    if len(line) - len(stripped) > 3 or not _STRUCTURE_START.match(stripped):
        return line
    return f"{line[: len(line) - len(stripped)]}\\{stripped}"


def code_block(text: str) -> str:
    """`text` as a fenced code block, its fence longer than any run of backticks inside, so
    that none of its lines ("# a shell comment") is read as a heading."""
    longest = max((len(run) for run in _BACKTICKS.findall(text)), default=2)
    fence = "`" * (longest + 1)
    return f"{fence}\n{text}\n{fence}"


def front_matter_end(body: str, *, whole: bool = True) -> int:
    """Offset just past a leading YAML front-matter block, or 0 when there is none.

    With `whole=False`, `body` is only the beginning of a document: `PieceTooShort` when the
    block may end beyond it, since the answer then depends on the rest.
    """
    match = _FRONT_MATTER.match(body)
    end = match.end() if match else 0
    if not whole and (
        (match is not None and not match.group().endswith("\n"))  # closed by the cut?
        or (match is None and _FRONT_MATTER_OPEN.match(body))  # opened, closes further on?
        or (body.startswith("---") and "\n" not in body)  # opens on a line not yet ended?
    ):
        raise PieceTooShort("the front matter may end beyond the text given")
    return end


def _after_fence_line(fence: _Fence | None, marker: str, info: str) -> _Fence | None:
    """The fence state after a fence line: `marker` its run of ` or ~, `info` the rest."""
    if fence is None:
        opens = not (marker[0] == "`" and "`" in info)  # ``` fences: no ` in info
        return (marker[0], len(marker)) if opens else None
    if marker[0] == fence[0] and len(marker) >= fence[1] and not info.strip():
        return None
    return fence


def _fence_at(text: str, start: int, end: int) -> _Fence | None:
    """The code-fence state at line start `end`, scanning from line start `start` (outside).

    Found by looking for the markers and checking only the lines that hold one, so on a long
    stretch of prose it costs a byte scan, not a pattern match on every line.
    """
    fence: _Fence | None = None
    position = start
    while position < end:
        ticks = _find_run(text, "`", position, end)
        tildes = _find_run(text, "~", position, end)
        marker = min(ticks, tildes) if ticks >= 0 and tildes >= 0 else max(ticks, tildes)
        if marker < 0:
            break
        # A fence line opens with at most three spaces, so a marker further in is no fence.
        line_start = max(start, text.rfind("\n", start, marker) + 1)
        match = _FENCE_LINE.match(text, line_start, end) if marker - line_start <= 3 else None
        if match is not None:
            fence = _after_fence_line(fence, match.group(1), match.group(2))
        line_end = text.find("\n", marker, end)
        if line_end < 0:
            break
        position = line_end + 1
    return fence


def _find_run(text: str, mark: str, start: int, end: int) -> int:
    """Offset of the first run of three `mark` in `text[start:end]`, or -1.

    A search for one character runs at memory speed, a search for three of the same much
    slower: the second only runs from the first `mark` on, so prose without any costs little.
    """
    first = text.find(mark, start, end)
    return first if first < 0 else text.find(mark * 3, first, end)


def find_headings(body: str) -> list[Heading]:
    """Every Markdown heading of `body`, in order.

    ATX headings (`# Title`, up to six `#`, a space after them) and setext headings (a
    single-line paragraph underlined with `===` or `---`) count; lines inside fenced code
    blocks and in a leading front-matter block do not. This is deliberately a small subset of
    CommonMark: it only has to find section starts, and a miss costs a less tidy chunk, not a
    wrong answer.
    """
    return _scan_headings(body, front_matter_end(body), None)


def _scan_headings(body: str, skip_until: int, fence: _Fence | None) -> list[Heading]:
    """The headings of `body` from `skip_until` on, entering it with fence state `fence`."""
    headings: list[Heading] = []
    for match in _STRUCTURE.finditer(body, skip_until):
        marker = match.group("fence")
        if marker is not None:
            fence = _after_fence_line(fence, marker, match.group("info"))
            continue
        if fence is not None:
            continue
        start = match.start()
        line_end = body.find("\n", start)
        line_end = len(body) if line_end < 0 else line_end
        if match.group("atx") is not None:
            raw = _ATX_CLOSING.sub("", match.group("atx_text").rstrip("\r"))
            headings.append(
                Heading(start, line_end, len(match.group("atx")), plain_heading_text(raw))
            )
            continue
        # Setext underline: the previous line is the heading if it is a one-line paragraph.
        if start == 0:
            continue
        prev_start = body.rfind("\n", 0, start - 1) + 1
        prev_line = body[prev_start : start - 1]
        if prev_start < skip_until or not prev_line.strip() or _NOT_PARAGRAPH.match(prev_line):
            continue
        if headings and headings[-1].end == start - 1:
            continue  # the previous line is itself a heading
        if prev_start > 0:
            before_start = body.rfind("\n", 0, prev_start - 1) + 1
            before = body[before_start : prev_start - 1]
            after_heading = bool(headings) and headings[-1].end == prev_start - 1
            if before.strip() and not after_heading:
                continue  # part of a longer paragraph: leave it alone
        level = 1 if match.group("setext")[0] == "=" else 2
        headings.append(Heading(prev_start, line_end, level, plain_heading_text(prev_line)))
    return headings


def last_heading(
    text: str, position: int, *, floor: int = 0, complete: bool = False
) -> Heading | None:
    """The last heading of a document that starts at or before `position`, from its beginning.

    `text` is the beginning of a Markdown document. The answer is the last of `find_headings`
    of the whole document up to `position`, except that None may come back when that heading
    starts before `floor`. `text` must reach the end of the line after the one holding
    `position`, or the end of the document (`complete`), and hold all of a front-matter
    block; otherwise `PieceTooShort`.

    Why it is cheap: only fence lines carry state over a long distance, and they are found by
    looking for their markers. The other rules look at most two lines back, so a scan that
    starts where neither of the next two lines is shaped like a setext underline finds the
    same headings from there on. The scan starts shortly before `position` and goes further
    back, doubling the distance, only while no heading turns up: with a heading every few KB,
    a few KB are scanned, wherever the position is.
    """
    eol = text.find("\n", position)
    cut = text.find("\n", eol + 1) if eol >= 0 else -1
    if cut < 0:
        if not complete:
            raise PieceTooShort("the line after the position is not in the text")
        cut = len(text)
    skip_until = front_matter_end(text, whole=complete)
    if skip_until > position:
        return None  # inside the front matter: no heading starts before its end
    reach = _FIRST_REACH
    while True:
        point = _restart_at_or_before(text, max(floor, position - reach), skip_until)
        if point is None:
            headings, base = _scan_headings(text[:cut], skip_until, None), 0
        else:
            state = _fence_at(text, skip_until, point)
            headings, base = _scan_headings(text[point:cut], 0, state), point
        before = [h for h in headings if h.start + base <= position]
        if before:
            found = before[-1]
            return Heading(found.start + base, found.end + base, found.level, found.text)
        if point is None or point <= floor:
            return None
        reach *= 2


def _restart_at_or_before(text: str, limit: int, lowest: int) -> int | None:
    """The last line start in `(lowest, limit]` where a scan can start afresh, or None.

    There, neither that line nor the next is shaped like a setext underline, the only rule
    that looks at the lines before it.
    """
    point = text.rfind("\n", 0, limit) + 1
    after = text.find("\n", point)
    next_underline = after >= 0 and _is_underline(text, after + 1)
    while point > lowest:
        underline = _is_underline(text, point)
        if not underline and not next_underline:
            return point
        next_underline = underline
        point = text.rfind("\n", 0, point - 1) + 1
    return None


def _is_underline(text: str, line_start: int) -> bool:
    """Whether the line at `line_start` is shaped like a setext underline (`===`, `---`)."""
    match = _STRUCTURE.match(text, line_start)
    return match is not None and match.group("setext") is not None
