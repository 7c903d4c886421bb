"""Cut a document body into overlapping chunks whose offsets index the body exactly.

A chunk is what search ranks and what an agent sees first, so it should be one coherent piece
of text: a section, a few paragraphs, whole sentences. The chunker therefore returns spans
(`start`, `end` into the body, Python `str` indices) rather than strings, so that
`chunk.text == document.body[start:end]` holds by construction and a reader can always go
from a hit back to its place in the document.

How a body is cut (see docs/ingestion.md for the long version):

* **Sections first.** A Markdown heading line (ATX `# ...` or setext `===`/`---`
  underline, outside fenced code) starts a new chunk. Headings directly followed by another
  heading stay together with the content that follows, so no chunk is a bare heading.
* **Then size.** A section longer than `max_chars` is cut near `target_chars`, at the best
  boundary available in the window: a blank line, else a line break, else a sentence end
  (`. ! ?` before whitespace; `。`, `…` and the full-width `! ? ;` right away), else
  whitespace, else a grapheme-cluster boundary (UAX #29, via `regex`), so an emoji
  sequence or a letter with its accents is never split.
* **Overlap.** Inside a section, each chunk after the first starts about `overlap_chars`
  before the previous one ended, at a sentence start if there is one in that stretch, else a
  word start, else a grapheme boundary. Chunks of different sections do not overlap.
* **Clean edges.** No chunk starts or ends with whitespace, and none is empty; every
  non-whitespace character of the body is in at least one chunk.

Cost: linear. A few compiled regular-expression scans list the line, paragraph and sentence
breaks; per chunk, a binary search or a short search outwards from the target finds the cut.
Full grapheme segmentation (slow in pure Python terms) only runs in a window where no cheaper
proof of a boundary exists. About 0.05-0.15 s per MB of text.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass

import regex

# Markdown structure lives in `markdown`; re-exported here, where it was first published.
from ..markdown import (
    Heading,
    PieceTooShort,
    find_headings,
    front_matter_end,
    last_heading,
    plain_heading_text,
)

__all__ = [
    "DEFAULT_OVERLAP_CHARS",
    "DEFAULT_TARGET_CHARS",
    "MIN_TARGET_CHARS",
    "Heading",
    "PieceTooShort",
    "Span",
    "chunk_spans",
    "default_max_chars",
    "find_headings",
    "front_matter_end",
    "last_heading",
    "plain_heading_text",
]

DEFAULT_TARGET_CHARS = 1000
DEFAULT_OVERLAP_CHARS = 150
MIN_TARGET_CHARS = 50


@dataclass(frozen=True)
class Span:
    """A chunk as offsets into the body: the chunk's text is `body[start:end]`.

    `heading` is the plain text of the nearest heading the chunk sits under ("" before the
    first heading); it lets a reader label a hit without re-parsing the document.
    """

    start: int
    end: int
    heading: str = ""


def default_max_chars(target_chars: int) -> int:
    """The hard size limit used when `max_chars` is not given: target plus 25 %.

    The slack lets a chunk run on to the end of a sentence or paragraph a little past the
    target instead of being cut mid-sentence.
    """
    return target_chars + target_chars // 4


# --- Boundaries -----------------------------------------------------------------------------

# Whitespace is `str.isspace` throughout: the stdlib `re` `\s`, or `regex` `\s` plus
# U+001C..U+001F. So the chunker and `str.strip` agree on what whitespace is.
_WS_CHAR = re.compile(r"\s")
_NON_SPACE = re.compile(r"\S")
_NEWLINE_RUN = re.compile(r"\n\s*")
# Scanning speed of `regex` depends on how rarely the first item tried matches, so each
# backward pattern ends (in reverse mode: starts) with a rare character.
_WORD_END_REVERSE = regex.compile(r"(?r)[^\s\x1c-\x1f][\s\x1c-\x1f]")

_CLOSERS = "\"'\u2019\u201d\u00bb)]\u300d\u300f\uff09\u3011\u300b\u3009\uff63"
# Latin-style ends need whitespace after them, so "e.g." and "3.14" do not count; CJK ends
# (full and half width) end a sentence right away. Both may be followed by closing quotes.
_ENDS_SPACED = ".!?\u203c\u2047\u2048\u2049\u0964\u0965\u061f\u06d4"
_ENDS_CJK = "\u3002\uff61\uff0e\uff01\uff1f\uff1b\u2026\u2025"
_ENDS = _ENDS_SPACED + _ENDS_CJK
# A sentence end, checked in the pattern itself (a per-match Python check costs too much on
# CJK text, which has a sentence end every dozen characters): the punctuation run, its
# closing quotes, then whitespace, or for CJK anything that does not attach to the previous
# character (so the cut is a grapheme boundary). Possessive: never cut inside the run.
_SENTENCE_END = regex.compile(
    rf"[{regex.escape(_ENDS)}]++[{regex.escape(_CLOSERS)}]*+"
    rf"(?:(?=[\s\x1c-\x1f])|(?<=[{_ENDS_CJK}][{regex.escape(_CLOSERS)}]*)"
    r"(?=[^\p{GCB=Extend}\p{GCB=ZWJ}\p{GCB=SpacingMark}]))"
)

# A character around which grapheme clusters always break, when its neighbour is one too:
# not whitespace, and none of the classes that UAX #29 joins to a neighbour (extenders,
# joiners, spacing marks, prepends, regional indicators, Hangul jamo).
_SIMPLE = (
    r"[^\s\x1c-\x1f\p{GCB=Extend}\p{GCB=ZWJ}\p{GCB=SpacingMark}\p{GCB=Prepend}"
    r"\p{GCB=RI}\p{GCB=L}\p{GCB=V}\p{GCB=T}\p{GCB=LV}\p{GCB=LVT}]"
)
# A position that is provably a grapheme boundary between two non-whitespace characters,
# looking at those two characters only: two simple characters, or a mark followed by a
# simple character that no Indic conjunct rule (GB9c) can attach.
_PAIR = regex.compile(
    rf"(?<={_SIMPLE})(?={_SIMPLE})"
    rf"|(?<=[\p{{GCB=Extend}}\p{{GCB=SpacingMark}}])(?!\p{{InCB=Consonant}})(?={_SIMPLE})"
)
_PAIR_PROBES = 32  # positions tried on each side of a target before segmenting for real
_GRAPHEME = regex.compile(r"\X")


class _Boundaries:
    """Candidate cut positions in one body.

    A cut position is a content end: the character before it is not whitespace. Line and
    paragraph breaks are few and cheap to find, so they are listed once and bisected.
    So are sentence ends, found by one scan for their punctuation. Word ends and
    grapheme boundaries are many; they are searched for from each chunk's target outwards
    and the search stops at the nearest one, so the work per chunk is about the distance to
    the boundary it picks.
    """

    def __init__(self, body: str) -> None:
        self.body = body
        self.size = len(body)
        self.lines: list[int] = []  # content ends followed by a line break
        self.paragraphs: list[int] = []  # content ends followed by a blank line
        for match in _NEWLINE_RUN.finditer(body):
            cut = match.start()
            while cut > 0 and body[cut - 1].isspace():
                cut -= 1  # spaces before the newline (never another newline)
            if cut == 0:
                continue
            self.lines.append(cut)
            if body.find("\n", match.start() + 1, match.end()) >= 0:
                self.paragraphs.append(cut)
        self.sentences = [match.end() for match in _SENTENCE_END.finditer(body)]

    def next_content(self, pos: int) -> int:
        """The first non-whitespace offset at or after `pos` (the body's length if none)."""
        if pos < self.size and not self.body[pos].isspace():
            return pos
        match = _NON_SPACE.search(self.body, pos)
        return match.start() if match is not None else self.size

    # Paragraph and line breaks.
    def last_paragraph(self, lo: int, hi: int) -> int | None:
        return _last_in(self.paragraphs, lo, hi)

    def first_paragraph(self, lo: int, hi: int) -> int | None:
        return _first_in(self.paragraphs, lo, hi)

    def last_line(self, lo: int, hi: int) -> int | None:
        return _last_in(self.lines, lo, hi)

    def first_line(self, lo: int, hi: int) -> int | None:
        return _first_in(self.lines, lo, hi)

    # Sentence ends.
    def last_sentence(self, lo: int, hi: int) -> int | None:
        return _last_in(self.sentences, lo, hi)

    def first_sentence(self, lo: int, hi: int) -> int | None:
        return _first_in(self.sentences, lo, hi)

    # Word ends and starts.
    def last_word_end(self, lo: int, hi: int) -> int | None:
        if lo > hi:
            return None
        match = _WORD_END_REVERSE.search(self.body, max(lo - 1, 0), min(hi + 1, self.size))
        if match is None or match.start() + 1 < lo:
            return None
        return match.start() + 1

    def first_word_end(self, lo: int, hi: int) -> int | None:
        pos = lo
        while pos <= hi:
            match = _WS_CHAR.search(self.body, pos, min(hi + 1, self.size))
            if match is None:
                return None
            cut = match.start()
            if cut > 0 and not self.body[cut - 1].isspace():
                return cut
            pos = self.next_content(cut)  # inside a run that began earlier: skip it
        return None

    def first_word_start(self, lo: int, hi: int) -> int | None:
        if lo > hi:
            return None
        match = _WS_CHAR.search(self.body, max(lo - 1, 0), hi)
        if match is None:
            return None
        begin = self.next_content(match.start())
        return begin if begin <= hi and begin < self.size else None

    # Grapheme boundaries.
    def is_pair_boundary(self, pos: int) -> bool:
        """Whether `pos` is provably a grapheme boundary from its two neighbours alone."""
        return 0 < pos < self.size and _PAIR.match(self.body, pos) is not None

    def grapheme_cut(self, lo: int, target: int, hi: int, anchor: int) -> int | None:
        """A grapheme boundary between two non-whitespace characters in [lo, hi]: the last
        one at or before `target`, else the first after it.

        It probes a few positions around the target with the two-character test; only when
        those fail does it run full UAX #29 segmentation, from `anchor` (a chunk start).
        """
        if lo > hi:
            return None
        target = min(max(target, lo), hi)
        for pos in range(target, max(lo, target - _PAIR_PROBES) - 1, -1):
            if self.is_pair_boundary(pos):
                return pos
        for pos in range(target + 1, min(hi, target + _PAIR_PROBES) + 1):
            if self.is_pair_boundary(pos):
                return pos
        body = self.body
        below: int | None = None
        for match in _GRAPHEME.finditer(body, anchor, min(hi + 1, self.size)):
            end = match.end()
            if end > hi:
                break
            if end < lo or body[end - 1].isspace() or body[end].isspace():
                continue
            if end > target:
                return below if below is not None else end
            below = end
        return below

    def first_grapheme(self, lo: int, hi: int) -> int | None:
        """A provable grapheme boundary near `lo` (a few probes; None when they all fail)."""
        for pos in range(lo, min(hi, lo + _PAIR_PROBES) + 1):
            if self.is_pair_boundary(pos):
                return pos
        return None


def _last_in(values: list[int], lo: int, hi: int) -> int | None:
    """The largest value in [lo, hi], or None."""
    i = bisect_right(values, hi) - 1
    return values[i] if i >= 0 and values[i] >= lo else None


def _first_in(values: list[int], lo: int, hi: int) -> int | None:
    """The smallest value in [lo, hi], or None."""
    i = bisect_left(values, lo)
    return values[i] if i < len(values) and values[i] <= hi else None


# --- Chunking -------------------------------------------------------------------------------


def _validate(target_chars: int, overlap_chars: int, max_chars: int | None) -> int:
    for name, value in (("target_chars", target_chars), ("overlap_chars", overlap_chars)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{name} must be an integer, not {value!r}")
    if target_chars < MIN_TARGET_CHARS:
        raise ValueError(f"target_chars must be at least {MIN_TARGET_CHARS}, not {target_chars}")
    if overlap_chars < 0 or 2 * overlap_chars >= target_chars:
        raise ValueError(
            f"overlap_chars must be at least 0 and less than half of target_chars "
            f"({target_chars}), not {overlap_chars}"
        )
    if max_chars is None:
        return default_max_chars(target_chars)
    if not isinstance(max_chars, int) or isinstance(max_chars, bool):
        raise ValueError(f"max_chars must be an integer or None, not {max_chars!r}")
    if max_chars < target_chars:
        raise ValueError(f"max_chars ({max_chars}) must be at least target_chars ({target_chars})")
    return max_chars


def _sections(body: str, bounds: _Boundaries) -> list[tuple[int, int, int, str]]:
    """(start, end, heading_end, heading) per section, trimmed, non-empty.

    A section runs from a heading to the next heading that follows some content; headings
    with nothing but whitespace under them join the next section. `heading_end` is where the
    section's leading heading lines end (the section start when there are none).
    """
    starts = [(0, 0, "")]  # (start, end of its heading lines, heading text)
    for heading in find_headings(body):
        start, heading_end, _ = starts[-1]
        if bounds.next_content(heading_end) >= heading.start:
            # Nothing but headings (or nothing at all) since `start`: one section.
            first = start if heading_end > start else heading.start
            starts[-1] = (first, heading.end, heading.text)
        else:
            starts.append((heading.start, heading.end, heading.text))
    sections: list[tuple[int, int, int, str]] = []
    for i, (start, heading_end, text) in enumerate(starts):
        limit = starts[i + 1][0] if i + 1 < len(starts) else len(body)
        first = bounds.next_content(start)
        if first >= limit:
            continue
        end = limit
        while body[end - 1].isspace():
            end -= 1
        sections.append((first, end, max(heading_end, first), text))
    return sections


def chunk_spans(
    body: str,
    *,
    target_chars: int = DEFAULT_TARGET_CHARS,
    overlap_chars: int = DEFAULT_OVERLAP_CHARS,
    max_chars: int | None = None,
) -> list[Span]:
    """Cut `body` into chunks of about `target_chars` characters; return their spans.

    `overlap_chars` (0 ≤ overlap < target / 2) is how much consecutive chunks of one section
    share, so a sentence cut off at the end of one chunk is still whole at the start of the
    next. `max_chars` (default `target + 25 %`, never below the target) bounds every chunk;
    the only longer chunk is a single grapheme cluster that is itself longer than that.
    Sizes are in characters (code points), like the offsets.

    The result is deterministic, sorted, with strictly increasing starts and ends, and covers
    every non-whitespace character. Raises ValueError for parameters out of range.
    """
    max_chars = _validate(target_chars, overlap_chars, max_chars)
    if not body or body.isspace():
        return []
    bounds = _Boundaries(body)
    spans: list[Span] = []
    for start, end, heading_end, heading in _sections(body, bounds):
        _chunk_section(
            bounds,
            spans,
            start,
            end,
            heading_end,
            heading,
            target_chars=target_chars,
            overlap_chars=overlap_chars,
            max_chars=max_chars,
        )
    return spans


def _chunk_section(
    bounds: _Boundaries,
    spans: list[Span],
    start: int,
    end: int,
    heading_end: int,
    heading: str,
    *,
    target_chars: int,
    overlap_chars: int,
    max_chars: int,
) -> None:
    """Append the chunks of one section (`body[start:end]`, trimmed) to `spans`."""
    body = bounds.body
    min_chars = target_chars // 2
    chunk_start = start
    previous_end = start  # every chunk must end after this (progress)
    # The first chunk must reach past its heading lines into the section's content.
    first_content = bounds.next_content(heading_end) if heading_end > start else start
    while True:
        if end - chunk_start <= max_chars:
            spans.append(Span(chunk_start, end, heading))
            return
        floor = max(previous_end, chunk_start) + 1
        hi = chunk_start + max_chars
        if chunk_start == start and first_content < end and first_content + 1 <= hi:
            floor = max(floor, first_content + 1)
        lo = max(floor, chunk_start + min_chars)
        # Aim at the target, or at half of what is left (plus overlap) so the last two chunks
        # come out balanced instead of a full one and a sliver.
        remaining = end - chunk_start
        target = chunk_start + min(target_chars, (remaining + overlap_chars + 1) // 2)
        cut = _choose_cut(bounds, floor, lo, target, hi, chunk_start)
        if cut is None:
            # No boundary before `hi`: a grapheme cluster longer than the room. It becomes a
            # chunk of its own, without overlap, so no chunk is longer than it needs to be.
            chunk_start = bounds.next_content(previous_end)
            match = _GRAPHEME.match(body, chunk_start)
            cut = min(match.end() if match else chunk_start + 1, end)
            while body[cut - 1].isspace():
                cut -= 1
            spans.append(Span(chunk_start, cut, heading))
            previous_end = cut
            chunk_start = bounds.next_content(cut)
            if chunk_start >= end:
                return
            continue
        spans.append(Span(chunk_start, cut, heading))
        chunk_start = _overlap_start(bounds, cut, chunk_start, overlap_chars)
        previous_end = cut


def _choose_cut(
    bounds: _Boundaries, floor: int, lo: int, target: int, hi: int, anchor: int
) -> int | None:
    """The best content end for a chunk: strongest boundary kind first (blank line, line
    break, sentence end, word end, grapheme boundary), then nearest the target: the last one
    at or before it, else the first after it, within [lo, hi]. When [lo, hi] has none, the
    last one in [floor, lo) keeps the chunk short but still makes progress."""
    tiers: list[tuple[Callable[[int, int], int | None], Callable[[int, int], int | None]]] = [
        (bounds.last_paragraph, bounds.first_paragraph),
        (bounds.last_line, bounds.first_line),
        (bounds.last_sentence, bounds.first_sentence),
        (bounds.last_word_end, bounds.first_word_end),
    ]
    for last, first in tiers:
        cut = last(lo, target)
        if cut is None:
            cut = first(max(lo, target + 1), hi)
        if cut is not None:
            return cut
    cut = bounds.grapheme_cut(lo, target, hi, anchor)
    if cut is not None or floor >= lo:
        return cut
    for last, _ in tiers:
        cut = last(floor, lo - 1)
        if cut is not None:
            return cut
    return bounds.grapheme_cut(floor, lo - 1, lo - 1, anchor)


def _overlap_start(bounds: _Boundaries, cut: int, chunk_start: int, overlap_chars: int) -> int:
    """Where the chunk after `cut` begins: up to `overlap_chars` earlier, at the first
    sentence or line start in that stretch, else the first word start, else a grapheme
    boundary; right after the cut when none fits or the gap is wide."""
    resume = bounds.next_content(cut)
    if overlap_chars == 0 or resume - cut > overlap_chars:
        return resume
    lo = max(cut - overlap_chars, chunk_start + 1)
    if lo >= cut:
        return resume
    best: int | None = None
    line = bounds.first_line(lo - 1, cut - 1)
    if line is not None and bounds.next_content(line) < cut:
        best = bounds.next_content(line)
    sentence = bounds.first_sentence(lo - 1, cut - 1)
    while sentence is not None:
        begin = bounds.next_content(sentence)
        if begin >= cut:
            break
        if begin >= lo:
            best = begin if best is None else min(best, begin)
            break
        sentence = bounds.first_sentence(sentence + 1, cut - 1)
    if best is None:
        best = bounds.first_word_start(lo, cut - 1)
    if best is None:
        best = bounds.first_grapheme(lo, cut - 1)
    return resume if best is None else best
