"""Lexical terms: normalisation, words of spaced scripts, bigrams of unspaced scripts.

Most tests are pure; the `simple`-parser round trip runs on the real PostgreSQL server,
because the point of the terms is that PostgreSQL keeps each of them as one lexeme.
"""

from __future__ import annotations

import unicodedata
from itertools import pairwise

import pytest
from django.db import connection
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bailing_knowledge.retrieval import tokenization
from bailing_knowledge.retrieval.tokenization import (
    ENGLISH_STOPWORDS,
    MAX_QUERY_TERMS,
    MAX_TERM_CHARS,
    lexical_query_terms,
    lexical_terms,
    lexical_text,
    normalize,
    split_words_and_runs,
)

# Characters from the scripts and traps the tokenizer must handle, for generated texts.
ALPHABET = (
    "abcxyzABCXYZ0189 éÉßøœİıǰ"  # Latin, with folds that change length
    "αβγΣςΩ"  # Greek, final sigma
    "жЖщЁ"  # Cyrillic
    "中国人东京的是我們〇々"  # Han
    "ひらがなカタカナーｶﾀ"  # kana, prolonged sound mark, half-width
    "한국어"  # Hangul
    "ภาษาไทยก่"  # Thai, with a tone mark
    "हिन्दी"  # Devanagari with virama and vowel signs
    "مرحبا١٢"  # Arabic letters and digits
    "\u0301\u0308"  # combining marks that may land after anything
    "\u00ad\u200b\u200d\ufe0f"  # default-ignorable: soft hyphen, ZWSP, ZWJ, VS16
    "-_'.,;:!?@#&|()<>/\\*\"+=%$~`^[]{}"  # ASCII punctuation, including tsquery operators
    "，。、「」！？・…—–"  # CJK and typographic punctuation
    "😀👍🏽❤\t\n\u3000\u00a0"  # emoji, skin tone, tabs, newlines, wide and no-break spaces
    "ＡＢＣ１２３ﬁ²½"  # compatibility forms
)
texts = st.text(alphabet=ALPHABET, max_size=60)


def reference_terms(text: str) -> list[str]:
    """The rules of the module docstring, written the slow, obvious way."""
    normalized = normalize(text)
    terms: list[str] = []
    for run, word in tokenization._TOKEN_RE.findall(normalized):
        if word:
            terms.append(word[:MAX_TERM_CHARS])
            continue
        units = tokenization._CLUSTER_RE.findall(run)
        if len(units) == 1:
            terms.append(units[0][:MAX_TERM_CHARS])
        else:
            terms.extend((a + b)[:MAX_TERM_CHARS] for a, b in pairwise(units))
    return terms


# --- normalize ------------------------------------------------------------------------------


def test_normalize_folds_compatibility_forms_and_case():
    assert normalize("ＣＯＶＩＤ－１９") == "covid-19"
    assert normalize("Straße") == "strasse"
    assert normalize("ｶﾀｶﾅ") == "カタカナ"
    assert normalize("ﬁle²") == "file2"
    assert normalize("ΣΊΣΥΦΟΣ") == "σίσυφοσ"


def test_normalize_keeps_cherokee_lower_case_like_postgresql():
    # casefold() maps Cherokee to upper case; PostgreSQL lower-cases it again.
    assert normalize("Ꮳꮃꭹ") == "ꮳꮃꭹ"


@given(texts)
def test_normalize_is_idempotent(text):
    assert normalize(normalize(text)) == normalize(text)


# --- lexical_terms --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "terms"),
    [
        ("COVID-19 vaccines don't work?", ["covid", "19", "vaccines", "don", "t", "work"]),
        (
            "foo_bar v1.2.3 user@example.com",
            ["foo", "bar", "v1", "2", "3", "user", "example", "com"],
        ),
        ("Crème brûlée, PLEASE", ["crème", "brûlée", "please"]),
        ("Привет, мир", ["привет", "мир"]),
        ("hyphen\u00adation", ["hyphenation"]),
        ("", []),
        ("  ...!?  😀 ", []),
    ],
)
def test_lexical_terms_of_spaced_scripts_are_words(text, terms):
    assert lexical_terms(text) == terms


@pytest.mark.parametrize(
    ("text", "terms"),
    [
        ("我是中国人", ["我是", "是中", "中国", "国人"]),
        ("我", ["我"]),
        ("我，你。", ["我", "你"]),
        ("東京タワーへ行く", ["東京", "京タ", "タワ", "ワー", "ーへ", "へ行", "行く"]),
        ("ｶﾀｶﾅ", ["カタ", "タカ", "カナ"]),
        ("二〇二四年", ["二〇", "〇二", "二四", "四年"]),
    ],
)
def test_lexical_terms_of_unspaced_scripts_are_bigrams(text, terms):
    assert lexical_terms(text) == terms


def test_lexical_terms_split_mixed_scripts_at_script_boundaries():
    assert lexical_terms("iPhone15は最高！😀 OK") == ["iphone15", "は最", "最高", "ok"]
    assert lexical_terms("价格是100元") == ["价格", "格是", "100", "元"]


def test_hangul_is_a_spaced_script():
    assert lexical_terms("서울에서 만나요") == ["서울에서", "만나요"]


def test_thai_bigrams_keep_marks_with_their_letter():
    # ก่อน = ก + tone mark, อ, น: no term may start with the tone mark.
    assert lexical_terms("ก่อน") == ["ก่อ", "อน"]


def test_a_combining_mark_never_starts_a_term():
    assert lexical_terms("a \u0301b \u0301") == ["a", "b"]
    assert lexical_terms("x\u0331y") == ["x\u0331y"]


def test_long_terms_are_cut_to_the_same_prefix_in_documents_and_queries():
    long_word = "x" * 100
    assert lexical_terms(long_word) == ["x" * MAX_TERM_CHARS]
    assert lexical_query_terms(long_word + "y") == lexical_terms(long_word)


def test_lexical_text_joins_terms_with_spaces():
    assert lexical_text("Hello, 世界!") == "hello 世界"


def test_split_words_and_runs_separates_the_two_kinds():
    assert split_words_and_runs(normalize("Hello 世界 and 東京タワー")) == (
        ["hello", "and"],
        ["世界", "東京タワー"],
    )
    assert split_words_and_runs("plain ascii words") == (["plain", "ascii", "words"], [])


@given(texts)
@example("abc東京def ก่อน x\u0331y \u0331z 〇ー")
@example("Ǆemal İstanbul ǰ ΣΑΣ")
def test_lexical_terms_follow_the_reference_rules(text):
    assert lexical_terms(text) == reference_terms(text)


@given(texts)
def test_terms_are_non_empty_lower_case_and_without_whitespace(text):
    for term in lexical_terms(text):
        assert term
        assert len(term) <= MAX_TERM_CHARS
        assert not any(char.isspace() for char in term)
        assert term == term.lower()


@given(texts)
def test_a_term_read_again_is_itself(text):
    # So a query made of a document's term finds that term in the index.
    for term in lexical_terms(text):
        assert lexical_terms(term) == [term]


@given(texts)
def test_split_words_and_runs_matches_lexical_terms(text):
    normalized = normalize(text)
    words, runs = split_words_and_runs(normalized)
    pieces = tokenization._TOKEN_RE.findall(normalized)
    assert words == [word for _, word in pieces if word]
    assert runs == [run for run, _ in pieces if run]


# --- lexical_query_terms --------------------------------------------------------------------


def test_query_terms_are_distinct_in_first_seen_order():
    assert lexical_query_terms("Tea, green tea and TEA!") == ["tea", "green", "and"]


def test_query_terms_are_capped():
    text = " ".join(f"w{i}" for i in range(200))
    assert lexical_query_terms(text) == [f"w{i}" for i in range(MAX_QUERY_TERMS)]
    assert lexical_query_terms(text, max_terms=3) == ["w0", "w1", "w2"]


def test_query_stopwords_are_dropped_only_on_request_and_never_to_nothing():
    query = "What is the capital of France?"
    assert lexical_query_terms(query) == ["what", "is", "the", "capital", "of", "france"]
    assert lexical_query_terms(query, stopwords=ENGLISH_STOPWORDS) == ["capital", "france"]
    assert lexical_query_terms("The Who", stopwords=ENGLISH_STOPWORDS) == ["the", "who"]


# --- PostgreSQL's simple parser keeps every term ---------------------------------------------

SAMPLES = [
    "The quick brown fox jumps over the lazy dog; COVID-19 isn't over (v2.0).",
    "user@example.com https://example.com/a/b?c=d 3.14 -42 1e-10 0x1F foo_bar O'Reilly",
    "检索增强生成（RAG）结合了信息检索和文本生成。我们在2024年发布了第3版！",
    "東京タワーは、東京都港区芝公園にある総合電波塔です。ｶﾀｶﾅもＯＫ。",
    "Mixed 中文 and English 😀👍🏽 with emoji, «quotes», — dashes… and ❤️ hearts!",
    "서울에서 만나요. ภาษาไทยก่อน हिन्दी मरहबा مرحبا Ꮳꮃꭹ Straße ǰ İstanbul",
    "a & b | !c <-> d:* (e) 'f' \"g\" \\h",
]


def simple_parser_lexemes(terms: list[str]) -> list[str]:
    """What `to_tsvector('simple', ...)` stores, in position order."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT lexeme, positions FROM unnest(to_tsvector('simple', %s))",
            [" ".join(terms)],
        )
        by_position = {
            position: lexeme for lexeme, positions in cursor.fetchall() for position in positions
        }
    return [by_position[position] for position in sorted(by_position)]


@pytest.mark.django_db
@pytest.mark.parametrize("text", SAMPLES)
def test_simple_parser_keeps_every_term_as_one_lexeme(text):
    terms = lexical_terms(text)
    assert terms
    assert simple_parser_lexemes(terms) == terms


@pytest.mark.django_db
@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(texts)
def test_simple_parser_keeps_generated_terms(text):
    terms = lexical_terms(text)
    assert simple_parser_lexemes(terms) == terms


def every_character() -> list[str]:
    return [
        chr(code)
        for code in range(0x110000)
        if unicodedata.category(chr(code)) not in ("Cs", "Co", "Cn")
    ]


LETTERS_AND_DIGITS = ("Lu", "Ll", "Lt", "Lm", "Lo", "Nd")


def unknown_to_the_server(characters: list[str]) -> set[str]:
    """The letters and digits of Python's Unicode database that the server's C library does not
    classify: characters assigned in a newer Unicode version than its tables (Python 3.13 knows
    Unicode 15.1, Debian 12's C library 14.0, as Python 3.11 does). The parser drops such a
    character whole, so the round trip cannot hold for it; the index never goes through the
    parser (`postings.encode_terms` writes its lexemes itself)."""
    candidates = [char for char in characters if unicodedata.category(char) in LETTERS_AND_DIGITS]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c FROM unnest(%s::text[]) AS c WHERE to_tsvector('simple', c) = ''::tsvector",
            [candidates],
        )
        return {char for (char,) in cursor.fetchall()}


def parser_failures(texts: list[str]) -> list[str]:
    """The last character of each text whose terms the parser does not keep as given, checked
    a thousand texts to a query."""
    failures = []
    for start in range(0, len(texts), 1000):
        batch = texts[start : start + 1000]
        terms = [term for text in batch for term in lexical_terms(text)]
        if simple_parser_lexemes(terms) != terms:
            failures.extend(
                f"U+{ord(text[-1]):04X}"
                for text in batch
                if simple_parser_lexemes(lexical_terms(text)) != lexical_terms(text)
            )
    return failures


@pytest.mark.django_db
def test_simple_parser_keeps_the_terms_of_every_character():
    characters = every_character()
    unknown = unknown_to_the_server(characters)
    assert len(unknown) < len(characters) // 20, "the server must know nearly every letter"
    assert parser_failures([char for char in characters if char not in unknown]) == []


@pytest.mark.django_db
def test_simple_parser_keeps_the_terms_of_every_mark_after_a_letter_digit_and_ideograph():
    characters = every_character()
    if unknown_to_the_server(characters):
        # Marks added since the server's tables split words there; Python cannot name them.
        pytest.skip("Python's Unicode database is newer than the server's C library")
    marks = [char for char in characters if unicodedata.category(char).startswith("M")]
    assert parser_failures([f"{base}{mark}" for base in "a0东" for mark in marks]) == []
