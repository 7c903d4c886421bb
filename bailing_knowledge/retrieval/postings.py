"""How a chunk's terms are written into the lexical index: its levels and lexemes.

A chunk's `search_vector` holds one lexeme per distinct term,
``<term>|<level>``, and its GIN index therefore lists, for every term and level, the chunks
whose weight for that term falls in that level; `lexical_terms` (not indexed) holds each term
with positions ``1..tf``, from which a chunk found is scored exactly. The level (00-99)
places the term's saturation ``κ = tf / (tf + k1₀ · (1 - b₀ + b₀ · dl / L₀))`` on a
logarithmic scale (about 6 % per level), computed with fixed reference constants, so a
chunk's lexemes never depend on statistics that change as other documents come and go.

The lexical leg (`lexical`) reads these entries; ingestion writes them (`encode_terms`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from .analysis import document_terms

#: Levels of a posting's weight, and the span of ln(κ) they cover (κ from e^-6 to 1).
LEVELS = 100
LEVEL_SPAN = 6.0
#: Reference constants of the levels: BM25's k1 and b (the defaults), and a typical chunk
#: length in terms. Scores use the configured values; these only order the postings. They
#: are part of the index format (`INDEX_FORMAT`): chunks indexed with other constants need
#: `knowledge_base reindex-lexical`.
INDEX_FORMAT = 1
REFERENCE_K1 = 1.2
REFERENCE_B = 0.5
REFERENCE_LENGTH = 100.0
#: A tsvector keeps at most 256 positions per lexeme: `tf` is counted up to that.
MAX_TF = 256

SEPARATOR = "|"

_POSITIONS = ["", *(",".join(map(str, range(1, n + 1))) for n in range(1, MAX_TF + 1))]


def reference_parts() -> tuple[float, float]:
    """k1₀ · (1 - b₀) and k1₀ · b₀ / L₀: the saturation's denominator is their sum with tf,
    the second times the chunk's length."""
    return REFERENCE_K1 * (1 - REFERENCE_B), REFERENCE_K1 * REFERENCE_B / REFERENCE_LENGTH


@lru_cache(maxsize=65536)
def level(tf: int, length: int) -> int:
    """The level of a term occurring `tf` times in a chunk of `length` terms."""
    a0, b0 = reference_parts()
    kappa = tf / (tf + a0 + b0 * length)
    return max(0, min(LEVELS - 1, int((math.log(kappa) + LEVEL_SPAN) * LEVELS / LEVEL_SPAN)))


def level_ceiling(value: int) -> float:
    """The largest κ a posting of level `value` can have."""
    if value >= LEVELS - 1:
        return 1.0
    return math.exp((value + 1) * LEVEL_SPAN / LEVELS - LEVEL_SPAN)


# q(L) = 1/κ_max(L) - 1: a posting of level L has (k1₀ · (1 - b₀ + b₀ · dl / L₀)) / tf ≥ q(L).
LEVEL_Q = [1.0 / level_ceiling(value) - 1.0 for value in range(LEVELS)]


def lexeme(term: str, value: int) -> str:
    """The index entry of `term` at level `value`."""
    return f"{term}{SEPARATOR}{value:02d}"


def quoted(text: str) -> str:
    """`text` as one quoted lexeme of a tsvector or tsquery literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


@dataclass(frozen=True)
class EncodedTerms:
    """A chunk's lexical columns: `search_vector`, `lexical_terms` (as tsvector literals)
    and `lexical_length`."""

    levels: str
    terms: str
    length: int


class _Opened(dict[str, str]):
    """term -> its quoted form without the closing quote (`quoted` minus its last `'`): a
    term's lexemes are that plus `|NN'`, since the separator and digits need no escaping.
    Terms recur from chunk to chunk, so each is escaped once per process (bounded)."""

    def __missing__(self, term: str) -> str:
        if len(self) >= 1 << 16:
            self.clear()
        opened = self[term] = quoted(term)[:-1]
        return opened


_opened = _Opened()


def encode_terms(terms: Sequence[str]) -> EncodedTerms:
    """The lexical columns of a chunk indexed under `terms` (in order, with repetitions)."""
    length = len(terms)
    counts = [(_opened[term], min(tf, MAX_TF)) for term, tf in Counter(terms).items()]
    return EncodedTerms(
        " ".join(f"{term}{SEPARATOR}{level(tf, length):02d}'" for term, tf in counts),
        " ".join(f"{term}':{_POSITIONS[tf]}" for term, tf in counts),
        length,
    )


def chunk_terms(text: str, title_terms: Sequence[str], language: str) -> list[str]:
    """The terms a chunk is indexed under: its own text's, then its document title's."""
    return [*document_terms(text, language), *title_terms]
