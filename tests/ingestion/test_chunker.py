"""The chunker: hand-checked examples, then properties that must hold for any text.

DB-free: `chunk_spans` is a pure function of a string and three integers.
"""

from __future__ import annotations

import itertools
import time

import pytest
import regex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bailing_knowledge.ingestion.chunker import (
    DEFAULT_OVERLAP_CHARS,
    DEFAULT_TARGET_CHARS,
    Span,
    chunk_spans,
    default_max_chars,
)

GRAPHEME = regex.compile(r"\X")
FAMILY = "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466"  # 7 code points


def texts(body: str, spans: list[Span]) -> list[str]:
    return [body[span.start : span.end] for span in spans]


def grapheme_boundaries(body: str) -> set[int]:
    return {0} | {match.end() for match in GRAPHEME.finditer(body)}


# --- Parameters -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"target_chars": 49}, "target_chars must be at least 50"),
        ({"target_chars": 100, "overlap_chars": 50}, "less than half of target_chars"),
        ({"overlap_chars": -1}, "overlap_chars must be at least 0"),
        ({"target_chars": 100, "overlap_chars": 0, "max_chars": 99}, "must be at least target"),
        ({"target_chars": 100.0}, "target_chars must be an integer"),
        ({"overlap_chars": True}, "overlap_chars must be an integer"),
        ({"max_chars": "2000"}, "max_chars must be an integer or None"),
    ],
)
def test_parameters_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        chunk_spans("text", **kwargs)


def test_defaults():
    assert (DEFAULT_TARGET_CHARS, DEFAULT_OVERLAP_CHARS) == (1000, 150)
    assert default_max_chars(1000) == 1250


# --- Small bodies ---------------------------------------------------------------------------


@pytest.mark.parametrize("body", ["", " ", "\n\n\t \u3000\xa0\u2028"])
def test_blank_bodies_have_no_chunks(body):
    assert chunk_spans(body) == []


def test_a_short_body_is_one_chunk_without_surrounding_whitespace():
    body = "\n\n  Hello, world.  \n"
    assert chunk_spans(body) == [Span(4, 17)]
    assert texts(body, chunk_spans(body)) == ["Hello, world."]


# --- Sections -------------------------------------------------------------------------------


def test_each_heading_starts_a_chunk_and_headings_stick_to_their_content():
    body = (
        "Preface line.\n\n"
        "# Guide\n\n"
        "## Install\n\n"
        "Run pip.\n\n"
        "## Use\n"
        "Import it.\n\n"
        "Setext heading\n"
        "--------------\n\n"
        "Text under it.\n"
    )
    spans = chunk_spans(body)
    assert texts(body, spans) == [
        "Preface line.",
        "# Guide\n\n## Install\n\nRun pip.",  # a bare heading never makes a chunk of its own
        "## Use\nImport it.",
        "Setext heading\n--------------\n\nText under it.",
    ]
    assert [span.heading for span in spans] == ["", "Install", "Use", "Setext heading"]


def test_headings_in_code_fences_do_not_cut():
    body = "# Setup\n\n```sh\n# install it\npip install x\n```\n\nDone.\n"
    assert texts(body, chunk_spans(body)) == [body.strip()]


# --- Boundaries by preference ---------------------------------------------------------------


def test_paragraph_breaks_are_preferred():
    paragraphs = [f"Paragraph {i} has a first sentence. And a second one." for i in range(6)]
    body = "\n\n".join(paragraphs)
    spans = chunk_spans(body, target_chars=120, overlap_chars=0)
    assert texts(body, spans) == ["\n\n".join(paragraphs[i : i + 2]) for i in (0, 2, 4)]


def test_english_sentences_are_kept_whole():
    body = " ".join(f"Sentence number {i} is here." for i in range(30))
    spans = chunk_spans(body, target_chars=100, overlap_chars=0)
    chunks = texts(body, spans)
    assert len(chunks) > 5
    for chunk in chunks:
        assert chunk.startswith("Sentence number ") and chunk.endswith(" is here.")
        assert len(chunk) <= 125
    assert " ".join(chunks) == body  # no overlap: the chunks tile the body


def test_overlap_starts_at_a_sentence_start():
    body = " ".join(f"Sentence number {i} is here." for i in range(30))
    spans = chunk_spans(body, target_chars=100, overlap_chars=30)
    assert texts(body, spans)[:2] == [
        "Sentence number 0 is here. Sentence number 1 is here. Sentence number 2 is here.",
        "Sentence number 2 is here. Sentence number 3 is here. Sentence number 4 is here.",
    ]
    for before, after in itertools.pairwise(spans):
        assert after.start < before.end  # they overlap...
        assert before.end - after.start <= 30  # ...by at most overlap_chars
        assert body[after.start : after.end].startswith("Sentence number ")


def test_overlap_falls_back_to_a_word_start():
    body = " ".join(f"word{i:03d}" for i in range(100))  # no sentences, only words
    spans = chunk_spans(body, target_chars=100, overlap_chars=20)
    for before, after in itertools.pairwise(spans):
        assert 0 < before.end - after.start <= 20
        assert body[after.start - 1] == " " and body[after.start] == "w"


def test_chinese_sentences_end_at_the_ideographic_full_stop():
    body = "".join(f"这是第{i}句话。" for i in range(30))  # no spaces anywhere
    spans = chunk_spans(body, target_chars=50, overlap_chars=10)
    chunks = texts(body, spans)
    assert chunks[0] == "".join(f"这是第{i}句话。" for i in range(7))
    assert chunks[1].startswith("这是第6句话。")  # the overlap is the last whole sentence
    for chunk in chunks:
        assert chunk.startswith("这是第") and chunk.endswith("句话。")
        assert len(chunk) <= default_max_chars(50)


def test_full_width_question_and_exclamation_marks_end_sentences():
    body = "你好吗？" * 10 + "太好了！" * 10 + "真的；" * 10
    for chunk in texts(body, chunk_spans(body, target_chars=50, overlap_chars=0)):
        assert chunk[-1] in "？！；"


def test_a_word_longer_than_a_chunk_is_cut_at_the_target():
    body = "x" * 5000
    spans = chunk_spans(body)
    assert [(span.start, span.end) for span in spans] == [
        (0, 1000),
        (850, 1850),
        (1700, 2700),
        (2550, 3550),
        (3400, 4275),  # the last two are balanced instead of a full one and a sliver
        (4125, 5000),
    ]


def test_hard_cuts_never_split_an_emoji_zwj_sequence():
    body = FAMILY * 40
    spans = chunk_spans(body, target_chars=50, overlap_chars=10)
    assert len(spans) > 3
    for span in spans:
        assert span.start % 7 == 0 and span.end % 7 == 0
        assert body[span.start : span.end] == FAMILY * ((span.end - span.start) // 7)


def test_hard_cuts_never_split_combining_sequences():
    body = "e\u0301\u0323" * 200
    for span in chunk_spans(body, target_chars=50, overlap_chars=10):
        assert span.start % 3 == 0 and span.end % 3 == 0


def test_a_grapheme_cluster_longer_than_max_chars_is_a_chunk_of_its_own():
    cluster = "a" + "\u0301" * 300
    body = "Intro text here.\n\n" + cluster + " tail words here"
    assert texts(body, chunk_spans(body, target_chars=50, overlap_chars=10)) == [
        "Intro text here.",
        cluster,
        "tail words here",
    ]


def test_cuts_are_deterministic():
    body = "Lorem ipsum dolor sit amet. " * 500
    assert chunk_spans(body) == chunk_spans(body)


# --- Properties -----------------------------------------------------------------------------

ATOMS = [
    *"ab Z.!?,;:-#\n\t\r",
    "\n\n",
    "# ",
    "\n## ",
    "```\n",
    "\u3000",
    "\xa0",
    "\x1c",
    "\u2028",
    *"中文字。！？；…」",
    "\u0301",
    "\u200d",
    "\U0001f468",
    "\U0001f1eb",
    "\U0001f1f7",
    FAMILY,
    "\u0915\u094d\u0937",  # a Devanagari conjunct: one cluster of three code points
    "\u0600",  # a prepended concatenation mark
    "\u1100\u1161\u11a8",  # Hangul jamo
    "\uac00",
]
atoms = (
    st.sampled_from(ATOMS)
    | st.integers(1, 80).map(lambda k: "o" + "\u0308" * k)  # long combining sequences
    | st.integers(1, 40).map(lambda k: "x" * k)
)
bodies = st.lists(atoms, max_size=150).map("".join) | st.text(max_size=400)


@st.composite
def parameters(draw):
    target = draw(st.integers(50, 200))
    overlap = draw(st.integers(0, (target - 1) // 2))
    max_chars = draw(st.none() | st.integers(target, 2 * target))
    return target, overlap, max_chars


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies, params=parameters())
def test_properties(body, params):
    target, overlap, max_chars = params
    spans = chunk_spans(body, target_chars=target, overlap_chars=overlap, max_chars=max_chars)
    limit = default_max_chars(target) if max_chars is None else max_chars
    clusters = [match.end() - match.start() for match in GRAPHEME.finditer(body)]
    longest = max(clusters, default=0)
    boundaries = grapheme_boundaries(body)
    covered = bytearray(len(body))
    previous = None
    for span in spans:
        assert 0 <= span.start < span.end <= len(body)
        text = body[span.start : span.end]
        assert text.strip() == text and not text.isspace()  # not empty, trimmed
        assert len(text) <= max(limit, longest)
        if previous is not None:  # sorted, strictly progressing
            assert span.start > previous.start and span.end > previous.end
        previous = span
        for cut in (span.start, span.end):
            # Wherever a cut falls between two non-whitespace characters, it is a grapheme
            # boundary: hard cuts never split a cluster.
            if 0 < cut < len(body) and not body[cut - 1].isspace() and not body[cut].isspace():
                assert cut in boundaries, (cut, body[cut - 3 : cut + 3])
        covered[span.start : span.end] = b"\x01" * (span.end - span.start)
    for index, char in enumerate(body):
        if not char.isspace():
            assert covered[index], (index, char)
    assert spans == chunk_spans(
        body, target_chars=target, overlap_chars=overlap, max_chars=max_chars
    )


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from(["Word ", "Satz. ", "字", "。", "\n\n", "# H\n"]), max_size=2000))
def test_overlap_is_bounded(parts):
    body = "".join(parts)
    spans = chunk_spans(body, target_chars=100, overlap_chars=20)
    for before, after in itertools.pairwise(spans):
        assert before.end - after.start <= 20


# --- Cost -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "unit",
    [
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit. Sed do eiusmod tempor.\n\n",
        "这是一个用来测试分块速度的中文句子。没有空格，只有标点！",
        "x",  # one 1 MB "word": every cut is a hard cut
    ],
)
def test_one_megabyte_is_chunked_quickly(unit):
    body = (unit * (1_000_000 // len(unit) + 1))[:1_000_000]
    started = time.perf_counter()
    spans = chunk_spans(body)
    elapsed = time.perf_counter() - started
    assert len(spans) >= 800
    # Measured at about 0.1 s; the bound only catches an accidental quadratic algorithm.
    assert elapsed < 5, elapsed
