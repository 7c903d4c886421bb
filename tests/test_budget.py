"""Byte budgets: exact costs, grapheme-safe cuts, search and read responses that fit.

DB-free: every function under test is pure.
"""

from __future__ import annotations

import json
import time
from itertools import accumulate

import pytest
import regex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.renderers import JSONRenderer

from bailing_knowledge import budget
from bailing_knowledge.budget import (
    BudgetError,
    cut_to_bytes,
    escaped_len,
    fit_end,
    fit_read_page,
    fit_search_response,
    render,
    utf8_len,
)
from bailing_knowledge.constants import SCHEMA_READ, SCHEMA_SEARCH, SEARCH_MAX_BYTES
from bailing_knowledge.renderers import AgentJSONRenderer

FAMILY = "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466"  # 👨‍👩‍👧‍👦: 25 bytes
THUMB = "\U0001f44d\U0001f3fd"  # 👍🏽: 8 bytes
E_ACUTE = "e\u0301"  # e + combining acute: 3 bytes
FR = "\U0001f1eb\U0001f1f7"  # 🇫🇷: 8 bytes
DE = "\U0001f1e9\U0001f1ea"  # 🇩🇪: 8 bytes

TRICKY = [
    "plain",
    "中文字",
    "\U0001f600",
    FAMILY,
    THUMB,
    E_ACUTE,
    FR + DE,
    'quote " and backslash \\',
    "\x00\x01\x08\x09\x0a\x0b\x0c\x0d\x1f\x7f",
    "line\u2028para\u2029end",
    "</script>&<>'",
]


def boundaries(text: str) -> list[int]:
    """Cluster boundaries of the whole text, as `regex` segments it from the start."""
    return [0, *(m.end() for m in regex.finditer(r"\X", text))]


# --- render and costs -------------------------------------------------------------------------


def test_render_is_drf_json_renderer_output():
    data = {"t": TRICKY, "n": 1, "f": 0.5, "b": True, "z": None, "nested": {"k\u2028": "v"}}
    assert render(data) == JSONRenderer().render(data)
    assert render(data) == AgentJSONRenderer().render(data)
    assert json.loads(render(data)) == data
    assert render({"s": 'a"\\\n\x01\x7f\u2028\U0001f600'}) == (
        b'{"s":"a\\"\\\\\\n\\u0001\x7f\\u2028\xf0\x9f\x98\x80"}'
    )


def test_render_ignores_client_indent():
    data = {"a": [1, 2], "b": "x"}
    sent = AgentJSONRenderer().render(data, "application/json; indent=8")
    assert sent == render(data) == b'{"a":[1,2],"b":"x"}'


def test_render_escapes_line_separators_like_drf():
    assert render("a\u2028b\u2029") == b'"a\\u2028b\\u2029"'


@pytest.mark.parametrize(
    ("text", "cost"),
    [
        ("", 0),
        ("abc", 3),
        ("中", 3),
        ("\U0001f600", 4),
        (FAMILY, 25),
        (THUMB, 8),
        (E_ACUTE, 3),
        (FR, 8),
        ('"', 2),
        ("\\", 2),
        ("\b\f\n\r\t", 10),
        ("\x00", 6),
        ("\x1f", 6),
        ("\x0b", 6),
        ("\x7f", 1),
        ("\u2028", 6),
        ("\u2029", 6),
        ("é", 2),
    ],
)
def test_escaped_len_hand_computed(text, cost):
    assert escaped_len(text) == cost
    assert len(render(text)) - 2 == cost


def test_utf8_len_counts_raw_bytes():
    assert utf8_len('a"\\\u2028\x00' + FAMILY) == 1 + 1 + 1 + 3 + 1 + 25


# Characters that stress JSON escaping and segmentation: lone ZWJ, lone combining mark and
# lone regional indicator make clusters depend on their neighbours.
PIECES = [
    "a",
    "Z",
    " ",
    "中",
    "文",
    "\U0001f600",
    FAMILY,
    THUMB,
    E_ACUTE,
    FR,
    DE,
    "\U0001f1eb",
    "\u200d",
    "\u0301",
    "\U0001f3fd",
    '"',
    "\\",
    "\n",
    "\t",
    "\r\n",
    "\r",
    "\x00",
    "\x1f",
    "\x7f",
    "\u2028",
    "\u2029",
    "\ufeff",
    "\u0e01\u0e33",
    "\u1100\u1161\u11a8",
]
# The oracle (`boundaries`) segments the whole text with `regex`, which is quadratic on long
# runs of regional indicators: 100 KB texts are built from pieces without them.
NO_RI = [p for p in PIECES if not any("\U0001f1e6" <= c <= "\U0001f1ff" for c in p)]
pieced = st.lists(st.sampled_from(PIECES), max_size=200).map("".join)
any_text = st.text(st.characters(codec="utf-8"), max_size=300)  # no lone surrogates
big = st.lists(st.sampled_from(NO_RI), min_size=1, max_size=6).map(
    lambda ps: ("".join(ps) * (100_000 // len("".join(ps)) + 1))[:100_000]
)
long_pieced = st.lists(st.sampled_from(NO_RI), min_size=1, max_size=100).map(
    lambda s: "".join(s) * 200
)
# One cluster larger than any page (a base with thousands of combining marks), then text.
giant_cluster = st.tuples(st.integers(1000, 40_000), pieced).map(
    lambda t: "e" + "\u0301" * t[0] + t[1]
)
texts = st.one_of(pieced, any_text, pieced.map(lambda s: s + "x" * 5000), big)


@settings(max_examples=300, deadline=None)
@given(st.one_of(pieced, any_text))
def test_escaped_len_equals_rendered_size(text):
    assert escaped_len(text) == len(render(text)) - 2
    assert escaped_len(text) == len(render({"k": text})) - len(render({"k": ""}))


@settings(max_examples=100, deadline=None)
@given(st.one_of(pieced, any_text))
def test_escaped_len_follows_an_ascii_renderer(text):
    # A host that forces ASCII output gets exact budgets too.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(budget._RENDERER, "ensure_ascii", True)
        assert render(text).isascii()
        assert escaped_len(text) == len(render(text)) - 2


# --- cutting ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "room", "expected"),
    [
        ("hello", 3, "hel"),
        ("hello", 0, ""),
        ("hello", 99, "hello"),
        ("héllo", 2, "h"),
        ("héllo", 3, "hé"),
        ("中文字", 7, "中文"),
        ("中文字", 2, ""),  # no code point of 3 bytes fits in 2
        ("\U0001f600\U0001f600", 7, "\U0001f600"),
        (FAMILY + "a", 25, FAMILY),
        ("a" + FAMILY, 25, "a"),  # the family is never split once something fits
        ("a" + FAMILY, 26, "a" + FAMILY),
        (THUMB + "x", 8, THUMB),
        ("x" + THUMB, 8, "x"),
        (E_ACUTE * 2, 5, E_ACUTE),
        ("a" + E_ACUTE, 2, "a"),
        (FR + DE, 12, FR),
        (FR + DE, 16, FR + DE),
        ("a\x00b", 6, "a"),
        ("a\x00b", 7, "a\x00"),
        ("\x00\x00", 6, "\x00"),
        ('a"b', 2, "a"),
        ('a"b', 3, 'a"'),
        ("a\\\\", 3, "a\\"),
        ("a\nb", 2, "a"),
        ("a\u2028b", 6, "a"),
        ("a\u2028b", 7, "a\u2028"),
    ],
)
def test_cut_to_bytes_hand_computed(text, room, expected):
    assert cut_to_bytes(text, room) == expected


@pytest.mark.parametrize(
    ("text", "room", "expected"),
    [
        # Only when the first cluster alone is too large: cut inside it, on code points.
        (FAMILY + "a", 24, FAMILY[:6]),  # 👨 ZWJ 👩 ZWJ 👧 ZWJ = 21 bytes
        (FAMILY, 4, FAMILY[:1]),
        (THUMB + "x", 7, THUMB[:1]),
        (FR, 7, FR[:1]),
        (E_ACUTE, 2, "e"),
        ("\U0001f600", 3, ""),
    ],
)
def test_cut_to_bytes_falls_back_to_code_points_inside_a_too_large_first_cluster(
    text, room, expected
):
    assert cut_to_bytes(text, room) == expected


def test_cut_to_bytes_raw_utf8():
    assert cut_to_bytes("a\u2028b", 4, escaped=False) == "a\u2028"
    assert cut_to_bytes('"""', 2, escaped=False) == '""'
    assert cut_to_bytes("a" + FAMILY, 25, escaped=False) == "a"


@settings(max_examples=300, deadline=None)
@given(pieced, st.data())
def test_largest_fitting_run_is_the_longest_within_room(text, data):
    start = data.draw(st.integers(0, len(text)), label="start")
    stop = data.draw(st.integers(start, len(text)), label="stop")
    room = data.draw(st.integers(0, 3 * (stop - start) + 10), label="room")
    for cost in (escaped_len, utf8_len):
        fitting = [e for e in range(start, stop + 1) if cost(text[start:e]) <= room]
        assert budget._largest_fitting(text, start, stop, room, cost) == max(fitting)


def test_fit_end_pages_forward_from_an_offset():
    text = "ab" + FAMILY + "cd"  # family spans [2, 9)
    assert fit_end(text, 0, 100) == len(text)
    assert fit_end(text, 2, 25) == 9
    assert fit_end(text, 2, 26) == 10
    assert fit_end(text, 9, 1) == 10
    assert fit_end(text, 0, 26) == 2  # "ab" + family is 27 bytes
    assert fit_end(text, 11, 5) == 11  # at the end: nothing left


def test_fit_end_never_takes_a_cluster_straddling_the_limit():
    text = "ab" + FAMILY + "cd"
    assert fit_end(text, 0, 100, limit=5) == 2
    assert fit_end(text, 0, 100, limit=9) == 9
    # Nothing whole before the limit: progress on a code point, within the limit.
    assert fit_end(text, 2, 100, limit=5) == 5
    assert fit_end(text, 2, 100, limit=2) == 2


def test_fit_end_rejects_bad_offsets():
    with pytest.raises(ValueError):
        fit_end("abc", 2, 10, limit=1)
    with pytest.raises(ValueError):
        fit_end("abc", 0, 10, limit=4)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=2000).map("".join), st.data())
def test_segmenter_agrees_with_whole_text_segmentation(text, data):
    bounds = boundaries(text)
    start = data.draw(st.sampled_from(bounds), label="start")
    segmenter = budget._Segmenter(text, start)
    stops = data.draw(st.lists(st.integers(start, len(text)), max_size=4), label="stops")
    for stop in stops:  # in any order: found boundaries are reused
        expected = [b for b in bounds if start < b <= stop]
        assert segmenter.last_boundary(stop) == (expected[-1] if expected else None)
    segmenter = budget._Segmenter(text, start)
    segmenter.last_boundary(len(text))
    # Segmented from `start`, or from a line start or two ASCII characters (not CR LF) after
    # it: every boundary from there on.
    origin = segmenter.origin
    pair = text[origin - 1 : origin + 1]
    assert origin == start or (
        origin > start
        and (pair[0] == "\n" or (pair.isascii() and len(pair) == 2 and pair != "\r\n"))
    )
    assert segmenter.ends == [b for b in bounds if b > origin]


def test_segmenter_starts_at_the_last_line_feed():
    line = FAMILY * 2000
    text = "\n".join([line] * 40)  # 40 lines of emoji families, 880 KB
    segmenter = budget._Segmenter(text, 0)
    stop = len(text) - 1000
    last_line = text.rfind("\n", 0, stop) + 1
    boundary = segmenter.last_boundary(stop)
    assert boundary == stop - (stop - last_line) % len(FAMILY)
    # Only the last line was segmented, not the 39 before it.
    assert segmenter.origin == last_line
    assert len(segmenter.ends) == (boundary - last_line) // len(FAMILY)
    # Asking for less room later goes back to the line it falls in.
    assert segmenter.last_boundary(len(FAMILY) * 3 + 1) == len(FAMILY) * 3
    assert segmenter.last_boundary(stop) == boundary
    assert segmenter.last_boundary(len(line) + 1) == len(line) + 1  # just after a line feed


def test_long_runs_of_regional_indicators_are_segmented_in_linear_time():
    body = "\U0001f1eb" * 250_000  # 1 MB of lone regional indicators: pairs from the start
    started = time.perf_counter()
    for start in (0, 2, 124_000, 249_000):
        response, e = fit_read_page(read_envelope(), body, start, len(body), 32768)
        assert (e - start) % 2 == 0 and e > start
        assert len(render(response)) <= 32768
    assert time.perf_counter() - started < 2.0  # whole-text `regex` takes minutes


@settings(max_examples=150, deadline=None)
@given(texts, st.integers(0, 5000))
def test_cut_to_bytes_properties(text, room):
    cut = cut_to_bytes(text, room)
    assert text.startswith(cut)
    assert escaped_len(cut) <= room
    bounds = boundaries(text)
    first = bounds[1] if len(bounds) > 1 else 0
    if len(cut) in bounds:
        # Maximal: the next whole cluster would not fit.
        nxt = next((b for b in bounds if b > len(cut)), None)
        if nxt is not None:
            assert escaped_len(text[:nxt]) > room
    else:
        # The fallback happens only inside a first cluster that does not fit whole.
        assert len(cut) < first
        assert escaped_len(text[:first]) > room
        assert escaped_len(text[: len(cut) + 1]) > room


# --- search -------------------------------------------------------------------------------------


def envelope(**extra) -> dict:
    return {
        "schema_version": SCHEMA_SEARCH,
        "route": "order-assistant",
        "knowledge_scope_revision": "ksr_" + "0" * 32,
        "status": "ok",
        "trust": "reference_only",
        "truncated": False,
        **extra,
    }


def hint(i: int = 0, title: str = "Title", summary: str = "Summary", ref: str = "") -> dict:
    return {
        "ref": ref or f"bkr1.{i:02d}" + "A" * 200,
        "title": title,
        "summary": summary,
        "revision": 3,
        "score": 0.8123,
        "expires_at": "2026-01-01T00:05:00Z",
    }


def test_search_response_that_fits_is_untouched():
    hints = [hint(i) for i in range(3)]
    response, truncated = fit_search_response(envelope(), hints)
    assert truncated is False
    assert response["truncated"] is False
    assert response["hints"] == hints
    assert list(response) == [*[k for k in envelope() if k != "truncated"], "hints", "truncated"]
    assert len(render(response)) <= SEARCH_MAX_BYTES


def test_search_response_keeps_key_order_and_existing_hints_slot():
    response, _ = fit_search_response(envelope(), [hint()])
    keys = list(response)
    assert keys.index("hints") == keys.index("truncated") - 1
    env = {"schema_version": SCHEMA_SEARCH, "hints": [], "status": "ok", "truncated": False}
    response, _ = fit_search_response(env, [hint()])
    assert list(response) == ["schema_version", "hints", "status", "truncated"]


def test_long_summaries_shrink_evenly_and_use_the_budget_exactly():
    hints = [hint(i, summary=chr(ord("a") + i) * 10_000) for i in range(3)]
    response, truncated = fit_search_response(envelope(), hints)
    size = len(render(response))
    # ASCII cuts are exact: the only slack is "true" being one byte shorter than "false".
    assert size == SEARCH_MAX_BYTES - 1
    assert truncated is True and response["truncated"] is True
    lengths = [len(h["summary"]) for h in response["hints"]]
    assert max(lengths) - min(lengths) <= 1
    for got, original in zip(response["hints"], hints, strict=True):
        assert original["summary"].startswith(got["summary"])
        assert got["title"] == original["title"]


def test_short_summary_stays_whole_and_its_share_goes_to_the_others():
    hints = [hint(0, summary="x" * 5000), hint(1, summary="short"), hint(2, summary="y" * 5000)]
    response, _ = fit_search_response(envelope(), hints)
    summaries = [h["summary"] for h in response["hints"]]
    assert summaries[1] == "short"
    assert abs(len(summaries[0]) - len(summaries[2])) <= 1
    assert len(render(response)) == SEARCH_MAX_BYTES - 1


def test_summaries_cut_on_grapheme_clusters():
    hints = [hint(i, summary=FAMILY * 1000) for i in range(3)]
    response, _ = fit_search_response(envelope(), hints)
    for h in response["hints"]:
        assert h["summary"]
        assert h["summary"] == FAMILY * (len(h["summary"]) // len(FAMILY))
    assert len(render(response)) <= SEARCH_MAX_BYTES


def test_titles_shrink_only_after_summaries_are_empty():
    hints = [hint(i, title="T" * 3000, summary="s" * 100) for i in range(3)]
    response, truncated = fit_search_response(envelope(), hints)
    assert truncated
    assert all(h["summary"] == "" for h in response["hints"])
    assert all(h["title"] and h["title"] != "T" * 3000 for h in response["hints"])
    assert len(render(response)) == SEARCH_MAX_BYTES - 1


def test_hints_dropped_from_the_end_only_when_their_fixed_fields_do_not_fit():
    hints = [hint(i, ref=f"r{i}" + "R" * 1500, summary="keep me") for i in range(3)]
    response, truncated = fit_search_response(envelope(), hints)
    assert truncated
    assert [h["ref"] for h in response["hints"]] == [hints[0]["ref"], hints[1]["ref"]]
    assert len(render(response)) <= SEARCH_MAX_BYTES


def test_no_hints_and_empty_search():
    response, truncated = fit_search_response(envelope(status="disabled"), [])
    assert response["hints"] == [] and truncated is False


def test_envelope_truncated_true_is_kept():
    response, truncated = fit_search_response(envelope(truncated=True), [hint()])
    assert truncated and response["truncated"] is True


def test_envelope_too_large_is_an_error():
    with pytest.raises(BudgetError):
        fit_search_response(envelope(route="r" * 5000), [hint()])


def test_more_hints_than_the_maximum_is_a_caller_bug():
    with pytest.raises(ValueError):
        fit_search_response(envelope(), [hint(i) for i in range(4)])


def test_search_fitting_is_deterministic_and_does_not_mutate_input():
    hints = [hint(i, summary='\u2028\x00"\\' * 3000) for i in range(3)]
    copy = [dict(h) for h in hints]
    first = fit_search_response(envelope(), hints)
    assert fit_search_response(envelope(), hints) == first
    assert hints == copy


hint_text = st.one_of(pieced, any_text, big)


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    st.lists(
        st.tuples(hint_text, hint_text, st.one_of(st.integers(0, 400), st.integers(1000, 2000))),
        max_size=3,
    ),
    st.booleans(),
)
def test_search_response_always_fits(candidates, run_bound):
    env = envelope(run_id="run_" + "x" * 26) if run_bound else envelope()
    hints = [hint(i, title=t, summary=s, ref="r" * n) for i, (t, s, n) in enumerate(candidates)]
    response, truncated = fit_search_response(env, hints)
    body = render(response)
    assert len(body) <= SEARCH_MAX_BYTES
    assert json.loads(body) == response
    assert len(response["hints"]) <= 3
    assert response["truncated"] is truncated
    for got, original in zip(response["hints"], hints, strict=False):
        assert original["summary"].startswith(got["summary"])
        assert original["title"].startswith(got["title"])
        assert {k: v for k, v in got.items() if k not in ("title", "summary")} == {
            k: v for k, v in original.items() if k not in ("title", "summary")
        }
    changed = response["hints"] != hints
    assert truncated == changed


# --- read ---------------------------------------------------------------------------------------


def read_envelope(**extra) -> dict:
    return {
        "schema_version": SCHEMA_READ,
        "route": "order-assistant",
        "knowledge_scope_revision": "ksr_" + "0" * 32,
        "ref": "bkr1." + "A" * 200,
        "revision": 7,
        "title": "Returns policy",
        "content": "",
        "trust": "reference_only",
        "next_cursor": None,
        "truncated": False,
        "budget_exhausted": False,
        "total_content_bytes": 0,
        "read_chain_max_bytes": 131072,
        **extra,
    }


def cursor_finalize(body: str, cursor_len: int = 180):
    """A finalize like the read service's: a cursor and `truncated` while text remains."""

    def finalize(e: int) -> dict:
        more = e < len(body)
        return read_envelope(
            next_cursor="bkc1." + "C" * cursor_len if more else None,
            truncated=more,
            total_content_bytes=utf8_len(body),
        )

    return finalize


def test_small_body_is_read_whole():
    body = "Hello " + FAMILY + " world\u2028"
    response, e = fit_read_page(read_envelope(), body, 0, len(body), 4096)
    assert e == len(body)
    assert response["content"] == body
    assert list(response) == list(read_envelope())


def test_ascii_page_fills_the_budget_exactly():
    body = "x" * 1_000_000
    response, e = fit_read_page(read_envelope(), body, 0, len(body), 16384)
    assert len(render(response)) == 16384
    assert response["content"] == body[:e]


def test_page_is_maximal_and_on_a_cluster_boundary():
    body = FAMILY * 10_000
    response, e = fit_read_page(read_envelope(), body, 0, len(body), 4096)
    assert e % len(FAMILY) == 0
    assert len(render(response)) <= 4096 < len(render(response)) + 25


def test_cluster_straddling_end_limit_is_left_for_later():
    body = "a" * 10 + FAMILY + "b" * 10  # family spans [10, 17)
    _, e = fit_read_page(read_envelope(), body, 0, 12, 4096)
    assert e == 10


def test_progress_inside_a_cluster_larger_than_the_page():
    body = "e" + "\u0301" * 20_000 + "tail"
    response, e = fit_read_page(read_envelope(), body, 0, len(body), 4096)
    assert 0 < e < 20_001
    assert response["content"] == body[:e]
    assert len(render(response)) <= 4096


def test_start_at_end_limit_reads_nothing():
    body = "abc"
    response, e = fit_read_page(read_envelope(), body, 2, 2, 4096)
    assert e == 2 and response["content"] == ""


def test_bad_offsets_are_rejected():
    with pytest.raises(ValueError):
        fit_read_page(read_envelope(), "abc", 3, 2, 4096)
    with pytest.raises(ValueError):
        fit_read_page(read_envelope(), "abc", 0, 4, 4096)


def test_envelope_too_large_for_any_content_is_an_error():
    with pytest.raises(BudgetError):
        fit_read_page(read_envelope(title="t" * 5000), "abc", 0, 3, 4096)
    # Room for the envelope and 3 bytes, but not for one 4-byte character.
    room = 4096 - len(render(read_envelope()))
    env = read_envelope(title="t" * (len("Returns policy") + room - 3))
    assert len(render(env)) == 4096 - 3
    with pytest.raises(BudgetError):
        fit_read_page(env, "\U0001f600", 0, 1, 4096)
    response, e = fit_read_page(env, "abc", 0, 3, 4096)
    assert e == 3 and len(render(response)) == 4096


def test_finalize_fields_are_accounted_for():
    body = "y" * 100_000
    finalize = cursor_finalize(body)
    response, e = fit_read_page(read_envelope(), body, 0, len(body), 4096, finalize=finalize)
    assert response["next_cursor"].startswith("bkc1.")
    assert response["truncated"] is True
    assert response == {**finalize(e), "content": body[:e]}
    assert len(render(response)) == 4096
    # Last page: the cursor disappears and the whole rest is returned.
    start = len(body) - 1000
    response, e = fit_read_page(read_envelope(), body, start, len(body), 4096, finalize=finalize)
    assert e == len(body) and response["next_cursor"] is None


def test_reading_a_chain_covers_the_body_exactly_once():
    body = ("Paragraph " + FAMILY + ' é\u2028"q" \\ \x01 中文 ' + FR + "\n") * 3000
    finalize = cursor_finalize(body)
    start, pieces = 0, []
    while start < len(body):
        response, e = fit_read_page(
            read_envelope(), body, start, len(body), 8192, finalize=finalize
        )
        assert len(render(response)) <= 8192
        assert e > start
        pieces.append(response["content"])
        start = e
    assert "".join(pieces) == body
    assert set(boundaries(body)) >= set(accumulate(map(len, pieces)))


def test_chain_window_in_raw_bytes_then_pages_within_it():
    # The read service bounds a chain in raw body bytes (131072), then pages inside it.
    body = ("ab" + FAMILY + "中") * 10_000  # 30 bytes, 10 characters per repetition
    end_limit = fit_end(body, 0, 131072, escaped=False)
    assert utf8_len(body[:end_limit]) <= 131072 < utf8_len(body[: end_limit + 10])
    assert end_limit in boundaries(body[: end_limit + 10])
    start = 0
    while start < end_limit:
        _, start = fit_read_page(read_envelope(), body, start, end_limit, 32768)
    assert start == end_limit


def test_read_page_on_a_1mb_body_is_fast():
    piece = "Lorem ipsum " + FAMILY + " 中文 " + THUMB + ' "q" \\ \n'
    body = piece * 30_000
    assert len(body.encode()) > 1_000_000
    finalize = cursor_finalize(body)
    started = time.perf_counter()
    for start in (0, len(piece) * 15_000, len(piece) * 29_000):
        response, e = fit_read_page(
            read_envelope(), body, start, len(body), 32768, finalize=finalize
        )
        assert len(render(response)) <= 32768 and e > start
    assert time.perf_counter() - started < 2.0  # generous: a page takes milliseconds


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    st.data(),
    st.one_of(big, long_pieced, giant_cluster, texts),
    st.integers(4096, 32768),
    st.booleans(),
)
def test_read_page_properties(data, body, max_bytes, with_finalize):
    bounds = boundaries(body)
    start = data.draw(st.sampled_from(bounds), label="start")
    end_limit = data.draw(
        st.one_of(st.just(len(body)), st.integers(start, len(body))), label="end_limit"
    )
    finalize = cursor_finalize(body) if with_finalize else None
    response, e = fit_read_page(
        read_envelope(), body, start, end_limit, max_bytes, finalize=finalize
    )
    rendered = render(response)
    assert len(rendered) <= max_bytes
    assert json.loads(rendered) == response
    assert response["content"] == body[start:e]
    assert start <= e <= end_limit
    if start < end_limit:
        assert e > start
    following = [b for b in bounds if b > start]
    first_end = following[0] if following else start
    if e not in bounds:
        # Inside a cluster only as a fallback: within the first cluster, which did not fit
        # whole (too large, or straddling end_limit).
        assert e < first_end
        if finalize is None:
            room = max_bytes - len(render({**response, "content": ""}))
            assert first_end > end_limit or escaped_len(body[start:first_end]) > room
    elif finalize is None:
        # Maximal: the next whole cluster within end_limit would not have fitted.
        nxt = next((b for b in following if b > e), None)
        if nxt is not None and nxt <= end_limit:
            over = {**read_envelope(), "content": body[start:nxt]}
            assert len(render(over)) > max_bytes
