"""Byte budgets: make a response fit in N bytes, measured on the exact bytes that are sent.

The protocol bounds whole rendered responses (search ≤ 4096 bytes, a read page ≤ `max_bytes`).
Estimating is not enough: DRF re-escapes U+2028/U+2029 after `json.dumps`, control characters
grow sixfold, quotes and backslashes double. So this module

* renders with the very renderer the views use (`render`), so "measured" is "sent";
* knows the exact cost of a string inside a JSON string (`escaped_len`), which is additive:
  a response's size is the size of its skeleton (every text field empty) plus the escaped
  length of each text, so budgets can be allocated without re-rendering in a loop;
* cuts text on grapheme-cluster boundaries (`regex` `\\X`), so an emoji family, a flag or a
  letter with its accent is never split; only when a single cluster is larger than the whole
  room does it cut inside it, and then on a code-point boundary (never inside a character);
* checks every final answer with `render` and raises `BudgetError` rather than send one byte
  over budget.

Everything here is pure (no database, no clock) and linear in the text it keeps: cutting a
1 MB body costs a few scans of the page, never of the body.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from itertools import accumulate
from typing import Any

import regex

from .constants import SEARCH_MAX_BYTES, SEARCH_MAX_RESULTS
from .renderers import AgentJSONRenderer

__all__ = [
    "BudgetError",
    "cut_to_bytes",
    "escaped_len",
    "fit_end",
    "fit_read_page",
    "fit_search_response",
    "render",
    "utf8_len",
]

# One extended grapheme cluster (UAX #29), as the `regex` module implements it.
_GRAPHEME = regex.compile(r"\X")

# Escape costs are counted on the UTF-8 bytes, where every character JSON escapes specially is
# a single byte that cannot occur inside a multi-byte sequence: `bytes.translate` counts them
# at C speed. Two-byte escapes: \" \\ \b \f \n \r \t.
_TWO_BYTE_ESCAPES = b'"\\\b\f\n\r\t'
# The other C0 controls become \u00XX: 6 bytes instead of 1.
_SIX_BYTE_CONTROLS = bytes([*range(0x00, 0x08), 0x0B, *range(0x0E, 0x20)])
# U+2028 and U+2029, which DRF re-escapes as \u2028 and \u2029: 6 bytes instead of 3.
_LINE_SEPARATORS = ("\u2028".encode(), "\u2029".encode())
# Lead bytes of any non-ASCII character, and of a character beyond the BMP (ASCII output).
_NON_ASCII_LEADS = bytes(range(0xC0, 0x100))
_ASTRAL_LEADS = bytes(range(0xF0, 0x100))

# Characters segmented per `regex` call (see `_Segmenter`).
_SEGMENT_CHARS = 256
# How far back `_Segmenter` looks for two ASCII characters to segment from.
_ASCII_LOOKBACK = 32

_RENDERER = AgentJSONRenderer()


class BudgetError(ValueError):
    """The fixed part of a response (without any of the cuttable text) exceeds the budget.

    Raised instead of sending an oversized body; it signals a caller bug or an impossible
    budget (e.g. a 5 KB ref with a 4096-byte search budget), never bad client input.
    """


def render(data: Any) -> bytes:
    """The exact bytes the agent views send for `data`.

    It is the views' own renderer (`AgentJSONRenderer`: compact, indent ignored, U+2028 and
    U+2029 re-escaped), so a size measured here is the size on the wire by construction.
    """
    return _RENDERER.render(data)


def utf8_len(text: str) -> int:
    """UTF-8 size of `text` (what `total_content_bytes` and the read chain count)."""
    return len(text.encode("utf-8"))


def escaped_len(text: str) -> int:
    """Bytes `text` contributes between the quotes of a JSON string rendered by `render`.

    Equals `len(render(text)) - 2`, computed with a few C-speed scans instead of rendering.
    With Unicode output (the protocol's): `"` `\\` and \\b \\f \\n \\r \\t cost 2, other
    controls below U+0020 cost 6 (\\u00XX), U+2028/U+2029 cost 6 (DRF re-escapes them),
    U+007F costs 1, anything else its UTF-8 length. If a host forces ASCII output, the cost
    follows that too, so budgets stay exact whatever the renderer is configured to do.
    Like `render`, it rejects text with lone surrogates (`UnicodeEncodeError`).
    """
    if _RENDERER.ensure_ascii:
        # \uXXXX for DEL and every non-ASCII character (a surrogate pair beyond the BMP).
        data = text.encode("utf-8", "surrogatepass")
        return (
            len(text)
            + _count(data, _TWO_BYTE_ESCAPES)
            + 5 * (_count(data, _SIX_BYTE_CONTROLS) + data.count(b"\x7f"))
            + 5 * _count(data, _NON_ASCII_LEADS)
            + 6 * _count(data, _ASTRAL_LEADS)
        )
    data = text.encode("utf-8")
    return (
        len(data)
        + _count(data, _TWO_BYTE_ESCAPES)
        + 5 * _count(data, _SIX_BYTE_CONTROLS)
        + 3 * sum(map(data.count, _LINE_SEPARATORS))
    )


def _count(data: bytes, members: bytes) -> int:
    """How many bytes of `data` are in `members`."""
    return len(data) - len(data.translate(None, members))


def _cost_function(escaped: bool) -> Callable[[str], int]:
    return escaped_len if escaped else utf8_len


def _largest_fitting(
    text: str, start: int, stop: int, room: int, cost: Callable[[str], int]
) -> int:
    """Largest `e` in `[start, stop]` with `cost(text[start:e]) <= room` (`room` >= 0).

    Cost is additive and every character costs at least one byte. So when the whole run is
    `over` bytes too long, dropping its last `over` characters is enough, and the answer lies
    between that point and as many characters past it as bytes are left: a binary search over
    that short stretch, scanning only the pieces it adds. One scan of the run, then a few of
    short pieces, instead of a scan of the whole run per halving.
    """
    total = cost(text[start:stop])
    if total <= room:
        return stop
    lo = max(start, stop - (total - room))
    used = total - cost(text[lo:stop])  # the cost of text[start:lo], which fits
    hi = min(stop - 1, lo + room - used)  # nothing beyond `hi` fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        extra = cost(text[lo:mid])
        if used + extra <= room:
            lo, used = mid, used + extra
            hi = min(hi, lo + room - used)
        else:
            hi = mid - 1
    return lo


class _Segmenter:
    """Cluster boundaries of `text` after `start` (itself a boundary), found lazily and kept.

    Segmenting with `regex` straight over the text would be quadratic on a long run of
    regional indicators (each match looks back to the start of the run to pair flags), so
    the text is segmented in slices of `_SEGMENT_CHARS` that each begin on a known boundary
    (the slice hides what precedes it, which is right: a boundary is a fresh start for every
    UAX #29 rule). The last cluster of a slice may be cut short by the slice's end, so it is
    kept only when the slice reaches the end of the text; a slice holding one unfinished
    cluster (a base with thousands of combining marks) is doubled until the cluster ends.
    An ASCII slice without CR needs no `regex`: every position in it is a boundary (nothing
    ASCII extends, prepends or joins). Linear in the characters segmented, whatever the text;
    boundaries found once are reused when the read loop retries with less room.

    A line feed always ends a cluster (UAX #29, GB4), and so does an ASCII character followed
    by another (only CR LF joins two ASCII characters): segmentation need not run from
    `start`. It runs from the last such position before the boundary asked for (`origin`), a
    line start or a pair of ASCII characters a few places back. Prose with some ASCII costs
    the segmentation of a few characters, a page of other text that of its last line.
    """

    def __init__(self, text: str, start: int) -> None:
        self.text = text
        self.start = start
        self._restart(start)

    def _restart(self, origin: int) -> None:
        self.origin = origin  # a boundary: `start`, or a line start after it
        self.ends: list[int] = []  # boundaries found, ascending, all > origin
        self.pos = origin  # the last boundary found (segmentation resumes here)
        self.known = origin  # every boundary in (origin, known] is in `ends`

    def last_boundary(self, stop: int) -> int | None:
        """The largest boundary `b` with `start < b <= stop`, or None."""
        origin = _ascii_pair_before(self.text, self.start, stop)
        if origin is None:
            origin = max(self.start, self.text.rfind("\n", self.start, stop) + 1)
        if not self.origin <= origin <= self.known:
            self._restart(origin)
        if stop > self.known:
            self._segment(stop)
        i = bisect_right(self.ends, stop)
        if i:
            return self.ends[i - 1]
        return self.origin if self.origin > self.start else None

    def _segment(self, stop: int) -> None:
        text, pos, size = self.text, self.pos, _SEGMENT_CHARS
        while pos < stop:
            # One character past `stop`, so the boundary at `stop` is decided with its
            # right-hand neighbour in view.
            until = min(len(text), stop + 1, pos + size)
            piece = text[pos:until]
            if piece.isascii() and "\r" not in piece:
                found = list(range(pos + 1, until + 1))
            else:
                found = list(accumulate(map(len, _GRAPHEME.findall(piece)), initial=pos))[1:]
            if until < len(text):
                found.pop()  # may continue past `until`
            found = found[: bisect_right(found, stop)]
            if found:
                self.ends.extend(found)
                pos, size = found[-1], _SEGMENT_CHARS
            elif until == min(len(text), stop + 1):
                break  # the next cluster ends beyond `stop`
            else:
                size *= 2
        self.pos, self.known = pos, stop


def _ascii_pair_before(text: str, start: int, stop: int) -> int | None:
    """The last `i` in `(start, stop]`, at most `_ASCII_LOOKBACK` back, between two ASCII
    characters other than CR LF: a cluster boundary whatever precedes it (UAX #29: no ASCII
    character extends, prepends or joins, and only GB3 holds two ASCII characters together).
    """
    for i in range(min(stop, len(text) - 1), max(start, stop - _ASCII_LOOKBACK), -1):
        before, after = text[i - 1], text[i]
        if before.isascii() and after.isascii() and (before != "\r" or after != "\n"):
            return i
    return None


def _fit_end(
    text: str,
    start: int,
    max_bytes: int,
    end: int,
    cost: Callable[[str], int],
    segmenter: _Segmenter,
) -> int:
    """`fit_end` with its arguments checked, and a segmenter that may be reused."""
    if max_bytes <= 0 or start == end:
        return start
    # Every character costs at least one byte: no run longer than `max_bytes` fits. Within
    # that, the longest run of code points that fits (C-speed scans of a few pieces), then its
    # last cluster boundary: every shorter run fits too.
    longest = _largest_fitting(text, start, min(end, start + max_bytes), max_bytes, cost)
    if longest in (start, len(text)):
        return longest  # nothing fits, or the whole rest (the end is always a boundary)
    boundary = segmenter.last_boundary(longest)
    # No boundary: the first cluster does not fit whole (too large, or it crosses `end`);
    # `longest` is then a code-point cut inside it.
    return longest if boundary is None else boundary


def fit_end(
    text: str,
    start: int,
    max_bytes: int,
    *,
    limit: int | None = None,
    escaped: bool = True,
) -> int:
    """End offset of the longest run of whole grapheme clusters from `start` within budget.

    Returns the largest `e` with `start <= e <= limit` (default `len(text)`) such that
    `text[start:e]` costs at most `max_bytes` (`escaped_len`, or `utf8_len` when `escaped` is
    false) and `e` is a cluster boundary of the whole `text`: a cluster that straddles `limit`
    is not taken. `start` must itself be a cluster boundary (0, or an offset this function
    returned); clusters are segmented from there.

    When no whole cluster fits (the first one is larger than the budget, or crosses `limit`),
    it falls back to the longest run of code points of that first cluster that fits, so a
    reader always progresses. It returns `start` only when not even one code point fits (or
    `start == limit`).

    Cost: only the characters that can fit (at most `max_bytes`) are measured and segmented;
    a 1 MB text with a 32 KB budget is read about 32 KB far, a handful of times.
    """
    end = len(text) if limit is None else limit
    if not 0 <= start <= end <= len(text):
        raise ValueError(f"need 0 <= start <= limit <= len(text), got {start}, {end}")
    return _fit_end(text, start, max_bytes, end, _cost_function(escaped), _Segmenter(text, start))


def cut_to_bytes(text: str, max_bytes: int, *, escaped: bool = True) -> str:
    """Longest prefix of `text` made of whole grapheme clusters within `max_bytes`.

    Bytes are `escaped_len` (what the text adds inside a rendered JSON string), or raw UTF-8
    when `escaped` is false. If the first cluster alone is too large, the prefix is cut on a
    code-point boundary inside it. The result is always a prefix of `text`.
    """
    return text[: fit_end(text, 0, max_bytes, escaped=escaped)]


# --- Search ---------------------------------------------------------------------------------


def _with_hints(envelope: Mapping[str, Any], hints: list[dict], truncated: bool) -> dict:
    """The response: `envelope` with `hints` and `truncated` set, keeping the key order.

    Keys the envelope already has keep their position; a missing `hints` goes just before
    `truncated` (the protocol's order), a missing `truncated` at the end.
    """
    response: dict[str, Any] = {}
    for key, value in envelope.items():
        if key == "truncated" and "hints" not in envelope:
            response["hints"] = hints
        response[key] = value
    response["hints"] = hints
    response["truncated"] = truncated
    return response


def _fair_shares(costs: Sequence[int], available: int) -> list[int]:
    """Max-min fair split of `available` bytes: short texts stay whole, long ones share alike.

    Sorted by cost, each text takes `min(cost, equal share of what is left)`; what a short
    text does not use goes to the longer ones. Deterministic (ties keep input order).
    """
    shares = [0] * len(costs)
    remaining = available
    order = sorted(range(len(costs)), key=lambda i: costs[i])
    for k, i in enumerate(order):
        share = remaining // (len(costs) - k)
        if costs[i] <= share:
            shares[i] = costs[i]
            remaining -= costs[i]
        else:
            for j in order[k:]:
                shares[j] = share
            break
    return shares


def _shrink(texts: Sequence[str], available: int) -> list[str]:
    """Cut `texts` so their escaped sizes sum to at most `available`, fairly, on clusters.

    Fair shares first; then the bytes the cluster boundaries left unused (and the rounding
    remainder) go back to the cut texts in rank order, so the first hint benefits first.
    """
    costs = [escaped_len(t) for t in texts]
    cut = [cut_to_bytes(t, s) for t, s in zip(texts, _fair_shares(costs, available), strict=True)]
    slack = available - sum(escaped_len(t) for t in cut)
    for i, text in enumerate(texts):
        if slack <= 0:
            break
        if cut[i] != text:
            used = escaped_len(cut[i])
            cut[i] = cut_to_bytes(text, used + slack)
            slack -= escaped_len(cut[i]) - used
    return cut


def fit_search_response(
    envelope: Mapping[str, Any],
    hints: Sequence[Mapping[str, Any]],
    max_bytes: int = SEARCH_MAX_BYTES,
    *,
    max_hints: int = SEARCH_MAX_RESULTS,
) -> tuple[dict, bool]:
    """The search (or on-demand delivery) response, shrunk to render in ≤ `max_bytes`.

    `envelope` is the response without hints: every other key, `truncated` included (its
    value is kept as a floor: `True` stays `True`). `hints` are the candidates in rank order,
    at most `max_hints` of them (more is a caller bug: `ValueError`), each a mapping with
    `ref`, `title`, `summary`, `revision`, `score`, `expires_at`; `title` and `summary` are
    the only fields ever cut.

    Order of sacrifice, as the protocol says: summaries, then titles, then whole hints from
    the end (the lowest ranked). Drops happen only when the hints' fixed fields alone
    (summary and title empty) do not fit; the kept hints then share the room left. Within a
    field, bytes are shared max-min fairly (`_fair_shares`): every hint keeps an excerpt
    rather than the best one keeping all of it. Cuts are on grapheme clusters, and a cut
    summary or title is a prefix of the original.

    Returns `(response, truncated)`; `response["truncated"]` is true when anything was cut
    or dropped. The result is rendered and checked: `BudgetError` if even the envelope with
    no hints does not fit.
    """
    if len(hints) > max_hints:
        raise ValueError(f"at most {max_hints} hints, got {len(hints)}")

    def skeleton(count: int) -> dict:
        # Every cuttable text empty; `truncated` false, the longer of the two literals.
        empty = [{**h, "title": "", "summary": ""} for h in hints[:count]]
        return _with_hints(envelope, empty, False)

    # Keep as many hints (from the top) as fit with empty texts: the size of a response is
    # its skeleton's size plus the escaped length of each text, exactly.
    kept = len(hints)
    while (base := len(render(skeleton(kept)))) > max_bytes:
        if kept == 0:
            raise BudgetError(f"the search envelope alone is {base} bytes > {max_bytes}")
        kept -= 1
    available = max_bytes - base
    titles = [h["title"] for h in hints[:kept]]
    summaries = [h["summary"] for h in hints[:kept]]
    title_bytes = sum(map(escaped_len, titles))
    if title_bytes + sum(map(escaped_len, summaries)) <= available:
        pass
    elif title_bytes <= available:
        summaries = _shrink(summaries, available - title_bytes)
    else:
        summaries = [""] * kept
        titles = _shrink(titles, available)

    fitted = [
        {**h, "title": t, "summary": s}
        for h, t, s in zip(hints[:kept], titles, summaries, strict=True)
    ]
    truncated = (
        bool(envelope.get("truncated"))
        or kept < len(hints)
        or any(
            f["title"] != h["title"] or f["summary"] != h["summary"]
            for f, h in zip(fitted, hints, strict=False)
        )
    )
    response = _with_hints(envelope, fitted, truncated)
    size = len(render(response))
    if size > max_bytes:  # unreachable if the arithmetic above is right; never send it
        raise BudgetError(f"search response is {size} bytes > {max_bytes}")
    return response, truncated


# --- Read -----------------------------------------------------------------------------------


def _with_content(envelope: Mapping[str, Any], content: str) -> dict:
    response = dict(envelope)  # keeps the key order; a missing `content` goes last
    response["content"] = content
    return response


def fit_read_page(
    envelope: Mapping[str, Any],
    body: str,
    start: int,
    end_limit: int,
    max_bytes: int,
    *,
    finalize: Callable[[int], Mapping[str, Any]] | None = None,
) -> tuple[dict, int]:
    """One read page: `envelope` plus `content = body[start:e]`, rendering in ≤ `max_bytes`.

    `e` is the largest offset ≤ `end_limit` on a grapheme-cluster boundary of `body` (a
    cluster straddling `end_limit` is left for later) such that the page fits; `start` must
    be a boundary (0 or a previous `e`). Only when not even one cluster fits is `e` cut inside
    the first cluster, on a code point. So when `start < end_limit`, `e > start` always, or
    `BudgetError` is raised (the envelope alone leaves no room for one character).

    Fields that depend on `e` (`next_cursor`, `truncated`, `budget_exhausted`, ...) are
    filled by `finalize(e)`, which returns the whole envelope for that `e` (its `content`, if
    any, is replaced). Without `finalize`, `envelope` is used as is. The contract for
    `finalize`: pure and deterministic for a given `e`. The loop sizes `e` with the room the
    current envelope leaves, renders `finalize(e)` with the content, and if that overshoots
    (e.g. a cursor appeared) shrinks the room by exactly the overshoot and retries; the room
    never grows, so the loop ends, in practice after one or two renders, and `e` is the
    largest that fits with the envelope it ends with. Passing an `envelope` sized like the
    likely result (a cursor-sized placeholder) saves the retry; a placeholder larger than
    the final envelope costs the page at most that difference.

    Returns `(response, e)`. Cost: proportional to the page (about `max_bytes` characters
    are segmented), not to the body.
    """
    if not 0 <= start <= end_limit <= len(body):
        raise ValueError(f"need 0 <= start <= end_limit <= len(body), got {start}, {end_limit}")
    current: Mapping[str, Any] = envelope
    room = max_bytes - len(render(_with_content(current, "")))
    segmenter = _Segmenter(body, start)
    while True:
        if room < 0:
            raise BudgetError(f"the read envelope alone exceeds {max_bytes} bytes")
        e = _fit_end(body, start, room, end_limit, escaped_len, segmenter)
        if e == start < end_limit:
            raise BudgetError(f"no room for one character of content in {max_bytes} bytes")
        if finalize is not None:
            current = finalize(e)
        response = _with_content(current, body[start:e])
        size = len(render(response))
        if size <= max_bytes:
            return response, e
        room -= size - max_bytes
