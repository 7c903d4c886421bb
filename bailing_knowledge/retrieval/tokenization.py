"""Text normalisation and the terms of the full-text index, for spaced and unspaced scripts.

PostgreSQL's text-search parser splits on spaces and punctuation, so a Chinese or Japanese
sentence becomes one giant "word" that no query ever matches. The terms are therefore
produced here, in Python, and PostgreSQL only receives them joined by spaces::

    to_tsvector('simple', ' '.join(lexical_terms(text)))

Rules, applied to the normalised text (see `normalize`: NFKC, case folding, and no
default-ignorable characters such as soft hyphens or zero-width joiners):

* **Spaced scripts** (Latin, Cyrillic, Greek, Arabic, Hebrew, Devanagari, Hangul, digits, …):
  a term is a maximal run of letters, digits and combining marks that starts with a letter or
  a digit (spacing marks that are not alphabetic, rare, separate terms as they do for
  PostgreSQL). Everything else separates terms, including hyphens, apostrophes, dots and
  underscores: ``covid-19`` gives ``covid`` and ``19``, ``don't`` gives ``don`` and ``t``,
  ``v1.2`` gives ``v1`` and ``2``. (PostgreSQL's parser would keep some of these whole and
  read ``-19`` as a negative number.) So a query for ``covid 19`` matches a document that
  says ``COVID-19``, and the other way round.
* **Unspaced scripts** (Han ideographs, Hiragana, Katakana and the prolonged sound mark ``ー``,
  Thai, Lao, Khmer, Myanmar): a run of such characters gives its overlapping character bigrams
  (``東京タワー`` → ``東京 京タ タワ ワー``); a run of one character gives that character. A
  "character" here is a base character with its combining marks, so no term starts with a mark.
  Hangul is written with spaces and is treated as a spaced script.
* Terms longer than `MAX_TERM_CHARS` characters are cut to that length (the same cut applies
  to queries, so such terms still match).

Every term is a single token for PostgreSQL's ``simple`` configuration: it holds no
separator the parser splits on, it never starts with a combining mark, and it is already lower
case, so ``to_tsvector('simple', ...)`` keeps each term exactly as given. The tests check this
round trip on a real server, for every character its C library classifies: the parser drops
letters newer than the library's Unicode tables (Unicode 15 scripts on Debian 12). The index
does not depend on it: `postings.encode_terms` writes its lexemes itself, not through the
parser. Terms contain no text-search query operators either, so they can also be joined into
a ``to_tsquery`` string.

A query term made of one character of an unspaced script (``京``) does not match documents
where that character only appears inside longer runs (indexed as ``東京``, ``京都``); the
query side can use prefix matching (``京:*``) for such terms.

No stopwords are removed from documents. Queries may drop `ENGLISH_STOPWORDS` on request;
very common terms are better handled where document frequencies are known (the SQL query).
The language-aware terms of `bailing_knowledge.retrieval.analysis` (stems, a language's
stopwords) are built on `segments` and `run_terms`, with the same rules for everything else.
"""

from __future__ import annotations

import unicodedata
from itertools import pairwise
from operator import add

import regex

#: Longest term kept, in characters; longer terms are cut (64 holds a SHA-256 in hex).
MAX_TERM_CHARS = 64

#: Upper bound on the distinct terms `lexical_query_terms` returns.
MAX_QUERY_TERMS = 64

# Contractions appear as the pieces the tokenizer cuts them into ("don't" -> "don", "t").
_STOPWORD_TEXT = """
    a about above after again against all also am an and any are as at be because been before
    being below between both but by can could d did do does doing don down during each few for
    from further had has have having he her here hers herself him himself his how i if in into
    is it its itself just ll m may me might more most must my myself no nor not now of off on
    once only or other our ours ourselves out over own per re s same shall she should so some
    such t than that the their theirs them themselves then there these they this those through
    to too under until up ve very via was we were what when where which while who whom why will
    with would you your yours yourself yourselves
"""
#: English function words. The hashing embedder leaves them out of its features (they carry
#: little meaning and crowd the vector); queries may drop them with
#: ``lexical_query_terms(..., stopwords=ENGLISH_STOPWORDS)``.
ENGLISH_STOPWORDS: frozenset[str] = frozenset(_STOPWORD_TEXT.split())

# Letters (and letter-like numerals such as U+3007) of the scripts written without spaces, plus
# the Katakana-Hiragana prolonged sound mark, whose script is "Common".
_UNSPACED = (
    r"[[[\p{L}\p{Nl}]&&[\p{sc=Han}\p{sc=Hiragana}\p{sc=Katakana}\p{sc=Thai}\p{sc=Lao}"
    r"\p{sc=Khmer}\p{sc=Myanmar}]]\u30fc]"
)
# Combining marks that continue a term. PostgreSQL's parser keeps a mark inside a word when
# it is alphabetic or has no width; a spacing mark that is neither (the Javanese pangkon)
# separates words there, so it does here.
_MARK = r"[\p{Mn}\p{Me}[\p{Mc}&&\p{Alphabetic}]]"
# A run of unspaced letters; combining marks may follow a letter, never lead.
_RUN = rf"{_UNSPACED}(?:{_UNSPACED}|{_MARK})*"
# A word of a spaced script: starts with a letter or digit; marks may follow.
_WORD = rf"[[\p{{L}}\p{{Nd}}]--{_UNSPACED}](?:[[\p{{L}}\p{{Nd}}]--{_UNSPACED}]|{_MARK})*"

# The definition: terms come from the matches of this pattern in the normalised text with
# default-ignorable characters removed, in order. It is slow on long texts, so the functions
# below first cut the text at separators with `str.translate` (fast for ASCII) and apply the
# pattern only to the pieces that need it; the tests check that both give the same result.
_TOKEN_RE = regex.compile(rf"({_RUN})|({_WORD})", regex.V1)
_RUN_FULL_RE = regex.compile(_RUN, regex.V1)
_TERM_CHAR_RE = regex.compile(rf"[\p{{L}}\p{{Nd}}]|{_MARK}|{_UNSPACED}", regex.V1)
_IGNORABLE_RE = regex.compile(r"\p{Default_Ignorable_Code_Point}")
_MARK_RE = regex.compile(r"\p{M}")
_CLUSTER_RE = regex.compile(r"\P{M}\p{M}*")


class _SeparatorTable(dict[int, str]):
    """A `str.translate` table: invisible characters go, separators become spaces.

    Filled on first sight of each character, by the same character classes as `_TOKEN_RE`.
    """

    def __missing__(self, code: int) -> str:
        char = chr(code)
        if _IGNORABLE_RE.match(char):
            value = ""
        elif _TERM_CHAR_RE.match(char):
            value = char
        else:
            value = " "
        self[code] = value
        return value


_SEPARATORS = _SeparatorTable()


def normalize(text: str) -> str:
    """Return `text` in the one form that both indexing and querying compare.

    Close to Unicode's NFKC_Casefold: NFKC folds compatibility forms (full-width Latin,
    half-width Katakana, ligatures, superscripts) into their ordinary characters;
    default-ignorable characters (soft hyphens, zero-width spaces and joiners, variation
    selectors) are removed, so ``hyphen\\u00adation`` is one word; case folding makes matching
    case-insensitive (``ß`` → ``ss``). A ``lower()`` after the fold undoes the few folds that
    produce upper case (Cherokee), so that PostgreSQL's own lower-casing leaves the result
    unchanged, and a last NFKC recomposes what the removals and folds leave decomposed. The
    result is stable: normalising twice changes nothing.
    """
    text = unicodedata.normalize("NFKC", text)
    if text.isascii():
        return text.lower()
    if _IGNORABLE_RE.search(text) is not None:
        text = _IGNORABLE_RE.sub("", text)
    return unicodedata.normalize("NFKC", text.casefold().lower())


def _pieces(token: str) -> list[tuple[str, str]]:
    """Split a non-ASCII token (no separators) into (run, "") and ("", word) pieces."""
    if _RUN_FULL_RE.fullmatch(token):
        return [(token, "")]
    return _TOKEN_RE.findall(token)


def split_words_and_runs(normalized: str) -> tuple[list[str], list[str]]:
    """Split normalised text into words of spaced scripts and runs of unspaced scripts.

    The words are the terms `lexical_terms` gives for spaced scripts (before the length cut);
    the runs are what the bigrams are cut from. The embedders need only these two bags.
    """
    tokens = normalized.translate(_SEPARATORS).split()
    if normalized.isascii():
        return tokens, []
    words: list[str] = []
    runs: list[str] = []
    for token in tokens:
        if token.isascii():
            words.append(token)
            continue
        for run, word in _pieces(token):
            if word:
                words.append(word)
            else:
                runs.append(run)
    return words, runs


def segments(normalized: str) -> list[tuple[str, str]]:
    """Split normalised text into its words and unspaced runs, in text order.

    Each item is a ``(run, word)`` pair with exactly one of the two non-empty. This is
    `split_words_and_runs` with the order kept, for analyses that transform the words (stem,
    drop stopwords) yet must give their terms in text order: `lexical_terms` is these pieces
    with each word cut to `MAX_TERM_CHARS` and each run replaced by its `run_terms`.
    """
    pieces: list[tuple[str, str]] = []
    append = pieces.append
    for token in normalized.translate(_SEPARATORS).split():
        if token.isascii():
            append(("", token))
        else:
            pieces.extend(_pieces(token))
    return pieces


def run_units(run: str) -> list[str] | str:
    """The characters of an unspaced run, each with its combining marks.

    Returns the run itself (a string indexes as characters) when it has no marks, which is
    the common case for Chinese and Japanese and saves building a list.
    """
    if _MARK_RE.search(run) is None:
        return run
    return _CLUSTER_RE.findall(run)


def run_terms(run: str) -> list[str]:
    """The terms of one unspaced run: its overlapping character bigrams, or its one character.

    These terms are the same whatever the language of the text: they are never stemmed.
    """
    units = run_units(run)
    if len(units) == 1:
        return [units[0][:MAX_TERM_CHARS]]
    if isinstance(units, str):
        return list(map(add, units, units[1:]))
    return [(a + b)[:MAX_TERM_CHARS] for a, b in pairwise(units)]


def _cut(word: str) -> str:
    return word if len(word) <= MAX_TERM_CHARS else word[:MAX_TERM_CHARS]


def lexical_terms(text: str) -> list[str]:
    """Return the terms of `text`, in order, with repetitions: what the full-text index stores.

    See the module docstring for the rules. The result is the same for a text and for its
    normalised form.
    """
    normalized = normalize(text)
    tokens = normalized.translate(_SEPARATORS).split()
    if normalized.isascii():
        if tokens and max(map(len, tokens)) > MAX_TERM_CHARS:
            return list(map(_cut, tokens))
        return tokens
    terms: list[str] = []
    append = terms.append
    extend = terms.extend
    for token in tokens:
        if token.isascii():
            append(_cut(token))
            continue
        for run, word in _pieces(token):
            if word:
                append(_cut(word))
            else:
                extend(run_terms(run))
    return terms


def lexical_text(text: str) -> str:
    """Return the terms of `text` joined by spaces: the input of ``to_tsvector('simple', ...)``."""
    return " ".join(lexical_terms(text))


def lexical_query_terms(
    text: str,
    *,
    max_terms: int = MAX_QUERY_TERMS,
    stopwords: frozenset[str] | set[str] = frozenset(),
) -> list[str]:
    """Return the distinct terms of a query, in first-seen order, at most `max_terms` of them.

    Terms in `stopwords` are dropped unless that would leave nothing (a query such as
    "the who" still searches for its words). The cap bounds the work of the lexical query
    whatever the agent sends.
    """
    terms = list(dict.fromkeys(lexical_terms(text)))
    if stopwords:
        kept = [term for term in terms if term not in stopwords]
        if kept:
            terms = kept
    return terms[:max_terms]
