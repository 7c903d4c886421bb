"""Language-aware index terms: stems, stopwords, and everything else as the lexical terms."""

from __future__ import annotations

import threading
from importlib.resources import files

import pytest
import snowballstemmer
from django.core.exceptions import ValidationError
from hypothesis import given, settings
from hypothesis import strategies as st

from bailing_knowledge.retrieval import analysis
from bailing_knowledge.retrieval.analysis import (
    DEFAULT_LANGUAGE,
    LANGUAGES,
    check_language,
    document_terms,
    query_terms,
    stopwords,
)
from bailing_knowledge.retrieval.tokenization import (
    MAX_TERM_CHARS,
    lexical_terms,
    normalize,
    run_terms,
    segments,
    split_words_and_runs,
)

STOPWORD_LISTS = sorted(
    entry.name.removesuffix(".txt")
    for entry in (files(analysis.__package__) / "stopwords").iterdir()
    if entry.name.endswith(".txt")
)
languages = st.sampled_from(sorted(LANGUAGES))
# Arbitrary Unicode, plus text drawn from the scripts and separators the analysis cares about.
texts = st.text() | st.text(
    alphabet="abcdefgh runingsäöüßéèçñ Häuser 東京タワー 中文 ภาษา -|'.\u0301\u00ad\t\n0123456789"
)

# --- languages --------------------------------------------------------------------------------


def test_languages_are_the_snowball_stemmers_and_simple():
    assert DEFAULT_LANGUAGE == "english"
    assert LANGUAGES["simple"] == "No stemming or stopwords"
    assert LANGUAGES["english"] == "English"
    assert LANGUAGES["german"] == "German"
    # The superseded English and Dutch algorithms are not offered beside their successors.
    stemmers = set(snowballstemmer.algorithms()) - {"porter", "dutch_porter"}
    assert set(LANGUAGES) == stemmers | {"simple"}
    labels = list(LANGUAGES.values())
    assert labels == sorted(labels)


@pytest.mark.parametrize("language", sorted(LANGUAGES))
def test_check_language_accepts_every_language(language):
    check_language(language)


@pytest.mark.parametrize("language", ["xx", "", "English", "porter", "dutch_porter", " english"])
def test_check_language_rejects_unknown_codes(language):
    with pytest.raises(ValidationError) as caught:
        check_language(language)
    (message,) = caught.value.message_dict["language"]
    assert message.startswith(f"Unknown language {language!r} (supported: arabic, ")
    assert "english" in message and "simple" in message


def test_analysis_rejects_an_unknown_language():
    with pytest.raises(ValidationError, match="Unknown language 'klingon'"):
        document_terms("qapla", "klingon")
    with pytest.raises(ValidationError, match="Unknown language 'klingon'"):
        query_terms("qapla", "klingon")


# --- stemming ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("language", "words"),
    [
        ("english", ["run", "running", "runs", "Run"]),
        ("english", ["connection", "connections", "connected", "connecting"]),
        ("german", ["Haus", "Häuser", "Hauses", "HÄUSER"]),
        ("german", ["Straße", "Strasse", "Straßen"]),
        ("french", ["cheval", "chevaux"]),
        ("french", ["continuel", "continuellement", "continuelle"]),
        ("spanish", ["canción", "canciones"]),
        ("russian", ["книга", "книги", "книгу"]),
    ],
)
def test_inflected_forms_meet_on_one_term(language, words):
    terms = {tuple(document_terms(word, language)) for word in words}
    assert len(terms) == 1
    (term,) = terms.pop()
    assert term


def test_english_sentence():
    text = "The runners were running, and it runs: COVID-19 cases in 2024 don't stop!"
    assert document_terms(text, "english") == [
        "runner",
        "run",
        "run",
        "covid",
        "19",
        "case",
        "2024",
        "stop",
    ]


def test_digits_only_words_are_kept_unstemmed(monkeypatch):
    stemmed: list[str] = []
    real = analysis._stem

    def spy(language: str, word: str) -> str:
        stemmed.append(word)
        return real(language, word)

    monkeypatch.setattr(analysis, "_analyzers", {})
    monkeypatch.setattr(analysis, "_stem", spy)
    assert document_terms("1990 ١٢٣ 1990s", "english") == ["1990", "١٢٣", "1990s"]
    assert stemmed == ["1990s"]


def test_long_words_are_cut_after_stemming():
    word = "x" * 70 + "ing"
    (term,) = document_terms(word, "english")
    assert term == "x" * MAX_TERM_CHARS
    assert query_terms(word, "english") == [term]


# --- stopwords --------------------------------------------------------------------------------


def test_documents_drop_stopwords_before_stemming():
    # "doing" and "having" are on the English list; "does" is too, "doe" (its stem) is not.
    assert document_terms("What are they doing with the having of does?", "english") == []
    assert document_terms("Does the doe run?", "english") == ["doe", "run"]


def test_queries_drop_stopwords_and_may_be_left_empty():
    assert query_terms("How do I return the parcels?", "english") == ["return", "parcel"]
    # A query of stopwords only matches nothing, since documents never index stopwords.
    assert query_terms("the who", "english") == []
    assert query_terms("the who", "simple") == ["the", "who"]


def test_german_stopwords_are_normalised_when_loaded():
    assert "dass" in stopwords("german")
    assert "daß" not in stopwords("german")
    assert document_terms("Daß die Häuser, dass das Haus", "german") == ["haus", "haus"]


@pytest.mark.parametrize("language", STOPWORD_LISTS)
def test_every_stopword_list_loads_normalised_words(language):
    assert language in LANGUAGES
    words = stopwords(language)
    assert len(words) > 40
    for word in words:
        assert split_words_and_runs(normalize(word)) == ([word], [])
    # The header is a comment, not words.
    assert not words & {"#", "snowball", "stopwords", "bsd"}


def test_shipped_lists_carry_their_licence():
    folder = files(analysis.__package__) / "stopwords"
    assert "BSD" not in "".join(stopwords("english"))
    assert "Snowball" in (folder / "LICENSE").read_text(encoding="utf-8")
    for language in STOPWORD_LISTS:
        header = (folder / f"{language}.txt").read_text(encoding="utf-8").splitlines()[:3]
        assert all(line.startswith("#") for line in header)
        assert "BSD-3-Clause" in " ".join(header)


def test_languages_without_a_list_drop_nothing():
    assert stopwords("simple") == frozenset()
    assert stopwords("czech") == frozenset()
    assert "a" in document_terms("a b", "czech")


# --- unspaced scripts and "simple" ------------------------------------------------------------


@pytest.mark.parametrize("language", sorted(LANGUAGES))
def test_bigrams_of_unspaced_scripts_are_the_same_in_every_language(language):
    text = "東京タワーの高さ ภาษาไทย 中"
    assert document_terms(text, language) == lexical_terms(text)
    assert query_terms(text, language) == list(dict.fromkeys(lexical_terms(text)))


def test_words_and_bigrams_keep_their_order():
    terms = document_terms("Running 東京 runs タワー", "english")
    assert terms == ["run", "東京", "run", "タワ", "ワー"]


@given(texts)
def test_simple_is_the_lexical_terms(text):
    assert document_terms(text, "simple") == lexical_terms(text)


@given(texts)
def test_segments_and_run_terms_rebuild_the_lexical_terms(text):
    terms: list[str] = []
    for run, word in segments(normalize(text)):
        assert bool(run) != bool(word)
        terms.extend(run_terms(run) if run else [word[:MAX_TERM_CHARS]])
    assert terms == lexical_terms(text)


# --- properties -------------------------------------------------------------------------------


@settings(max_examples=300)
@given(texts, languages)
def test_terms_are_non_empty_without_bars_or_whitespace(text, language):
    for term in document_terms(text, language):
        assert term
        assert "|" not in term
        assert term.split() == [term]
        assert len(term) <= MAX_TERM_CHARS


@settings(max_examples=300)
@given(texts, languages)
def test_every_query_term_is_a_document_term(text, language):
    assert set(query_terms(text, language)) <= set(document_terms(text, language))


@given(texts, languages)
def test_a_word_of_a_document_queried_alone_finds_its_terms(text, language):
    found = set(document_terms(text, language))
    for word in split_words_and_runs(normalize(text))[0]:
        assert set(query_terms(word, language)) <= found


@given(st.lists(st.text(alphabet="abcdefghijklmnop", min_size=1, max_size=6)), languages)
def test_query_terms_are_distinct_in_first_seen_order(words, language):
    text = " ".join(words)
    terms = query_terms(text, language)
    assert terms == list(dict.fromkeys(document_terms(text, language)))
    assert query_terms(text, language, max_terms=2) == terms[:2]


# --- caching ----------------------------------------------------------------------------------


def test_the_term_cache_is_capped_and_gives_the_same_terms(monkeypatch):
    text = "Runners running in the connected connections of every runner"
    expected = document_terms(text, "english")
    monkeypatch.setattr(analysis, "_analyzers", {})
    monkeypatch.setattr(analysis, "_TERM_CACHE_SIZE", 3)
    assert document_terms(text, "english") == expected
    assert document_terms(text, "english") == expected
    assert len(analysis._analyzer("english").terms) <= 3


def test_threads_analyse_concurrently_with_the_same_result(monkeypatch):
    monkeypatch.setattr(analysis, "_analyzers", {})
    texts = [f"Runners {i} running connections Häuser des Hauses {i * 7}" for i in range(200)]
    expected = [document_terms(text, "german") for text in texts]
    monkeypatch.setattr(analysis, "_analyzers", {})
    results: dict[int, list[list[str]]] = {}
    start = threading.Barrier(4)

    def work(n: int) -> None:
        start.wait()
        results[n] = [document_terms(text, "german") for text in texts]

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(result == expected for result in results.values())
