"""Language-aware index terms: Snowball stems and stopwords on top of the lexical terms.

A knowledge base has a language (`KnowledgeBase.language`, one of `LANGUAGES`). Its documents
and the queries against it are turned into terms by the same analysis, so that "running",
"runs" and "run" meet on one term in English, and "Häuser" and "Haus" in German:

* The text is normalised and split as `tokenization.lexical_terms` does (see that module):
  words of spaced scripts, and runs of unspaced scripts (Chinese, Japanese, Thai, ...).
* A word that is in the language's stopword list (compared in normalised form, before
  stemming) gives no term. Any other word gives its stem by the language's Snowball stemmer;
  a word made only of digits is kept as it is. Every term is then cut to `MAX_TERM_CHARS`.
* Runs give their character bigrams (`tokenization.run_terms`), whatever the language: they
  are never stemmed nor dropped.
* ``"simple"`` stems nothing and drops nothing: its terms are exactly `lexical_terms`.

A term is never empty and holds no whitespace and no ``|``, so callers may join terms with
either. Stems are remembered per language (the vocabulary of a knowledge base is bounded, and
a repeated word then costs one dict look-up); stopword lists are read once, on first use.

The stems come from the installed Snowball stemmers (the ``snowballstemmer`` package, or the
faster ``PyStemmer`` when it is installed). A new Snowball release may stem a few words
differently, so after upgrading either package, re-index knowledge bases whose language is
not ``simple``, or some queries will miss documents indexed with the old stems.

The stopword lists are the Snowball project's (BSD-3-Clause), as PostgreSQL ships them; they
live in the ``stopwords`` folder beside this module. Languages without a list drop nothing.
"""

from __future__ import annotations

import threading
from importlib.resources import files
from typing import Any

import snowballstemmer
from django.core.exceptions import ValidationError

from .tokenization import (
    MAX_QUERY_TERMS,
    MAX_TERM_CHARS,
    lexical_terms,
    normalize,
    run_terms,
    segments,
    split_words_and_runs,
)

#: The language that neither stems nor drops stopwords.
SIMPLE = "simple"

#: The language of new knowledge bases.
DEFAULT_LANGUAGE = "english"

# Stemmers that snowballstemmer lists beside a better one for the same language: "porter" is
# the original 1980 English algorithm, which "english" (Porter2) revises; "dutch_porter" is the
# Dutch algorithm before Snowball 3.0, kept upstream for compatibility. Offering them would
# only let a knowledge base pick the weaker stemmer of a language it can already choose.
_ALTERNATIVE_STEMMERS = frozenset({"porter", "dutch_porter"})

# Words whose term each language remembers, before it forgets them all and starts again.
_TERM_CACHE_SIZE = 200_000


def _languages() -> dict[str, str]:
    labels = {
        code: code.replace("_", " ").title()
        for code in snowballstemmer.algorithms()
        if code not in _ALTERNATIVE_STEMMERS
    }
    labels[SIMPLE] = "No stemming or stopwords"
    return dict(sorted(labels.items(), key=lambda item: item[1]))


#: The languages a knowledge base may have: code -> label, sorted by label.
LANGUAGES: dict[str, str] = _languages()


def check_language(language: str) -> None:
    """Raise a `ValidationError` on the ``language`` field unless `language` is supported."""
    if language not in LANGUAGES:
        supported = ", ".join(sorted(LANGUAGES))
        raise ValidationError(
            {"language": f"Unknown language {language!r} (supported: {supported})."}
        )


def stopwords(language: str) -> frozenset[str]:
    """The stopwords of `language`, normalised: the words that give no term."""
    return _analyzer(language).stopwords


def document_terms(text: str, language: str) -> list[str]:
    """Return the index terms of `text` in `language`, in order, with repetitions.

    Raises `ValidationError` for an unknown language, as `check_language` does.
    """
    if language == SIMPLE:
        return lexical_terms(text)
    analyzer = _analyzer(language)
    normalized = normalize(text)
    if normalized.isascii():
        words, _ = split_words_and_runs(normalized)
        return analyzer.word_terms(words)
    known = analyzer.terms
    terms: list[str] = []
    for run, word in segments(normalized):
        if run:
            terms.extend(run_terms(run))
            continue
        term = known.get(word)
        if term is None:
            term = analyzer.analyze(word)
        if term:
            terms.append(term)
    return terms


def query_terms(text: str, language: str, *, max_terms: int = MAX_QUERY_TERMS) -> list[str]:
    """Return the distinct terms of a query, in first-seen order, at most `max_terms` of them.

    The analysis is exactly that of `document_terms`, so each query term equals the document
    term it should match. A query made only of stopwords ("the who" in English) gives no
    terms at all: documents do not index stopwords, so there would be nothing to match.
    """
    return list(dict.fromkeys(document_terms(text, language)))[:max_terms]


class _Analyzer:
    """The stopwords of one language and the terms of the words seen so far."""

    def __init__(self, language: str) -> None:
        self.language = language
        self.stopwords = _load_stopwords(language)
        # word -> term; "" for a stopword. Plain dict operations are atomic, so threads share
        # it; two threads analysing the same new word both store the same term.
        self.terms: dict[str, str] = {}

    def word_terms(self, words: list[str]) -> list[str]:
        """The terms of words of spaced scripts, in order, stopwords left out."""
        found = list(map(self.terms.get, words))
        if None in found:
            for i, term in enumerate(found):
                if term is None:
                    found[i] = self.analyze(words[i])
        return list(filter(None, found))

    def analyze(self, word: str) -> str:
        """The term of one normalised word ("" for a stopword), remembered for next time."""
        if word in self.stopwords:
            term = ""
        elif word.isdecimal():
            term = word[:MAX_TERM_CHARS]
        else:
            stem = _stem(self.language, word)
            # A stemmer only removes or rewrites letters; keep the word should one ever
            # return something that is not a term.
            if not stem or "|" in stem or stem.split() != [stem]:
                stem = word
            term = stem[:MAX_TERM_CHARS]
        if len(self.terms) >= _TERM_CACHE_SIZE:
            self.terms.clear()
        self.terms[word] = term
        return term


_analyzers: dict[str, _Analyzer] = {}
_analyzers_lock = threading.Lock()


def _analyzer(language: str) -> _Analyzer:
    analyzer = _analyzers.get(language)
    if analyzer is None:
        check_language(language)
        with _analyzers_lock:
            analyzer = _analyzers.get(language)
            if analyzer is None:
                analyzer = _analyzers[language] = _Analyzer(language)
    return analyzer


def _load_stopwords(language: str) -> frozenset[str]:
    """Read the packaged list of `language`; entries are normalised and split like text."""
    path = files(__package__) / "stopwords" / f"{language}.txt"
    if language == SIMPLE or not path.is_file():
        return frozenset()
    words: set[str] = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        # An entry such as Hungarian "ill." counts as the word it gives ("ill").
        entry_words, entry_runs = split_words_and_runs(normalize(entry))
        if len(entry_words) == 1 and not entry_runs:
            words.add(entry_words[0])
    return frozenset(words)


# Snowball stemmers keep their working state on the object, so each thread gets its own.
_local = threading.local()


def _stem(language: str, word: str) -> str:
    stemmers: dict[str, Any] | None = getattr(_local, "stemmers", None)
    if stemmers is None:
        stemmers = _local.stemmers = {}
    stemmer = stemmers.get(language)
    if stemmer is None:
        stemmer = stemmers[language] = snowballstemmer.stemmer(language)
    return stemmer.stemWord(word)
