"""What BM25 needs of the knowledge bases searched, and what a process remembers of it.

A search reads its terms' statistics (`Statistics`) in its own snapshot, and scores with
them alone. What the process saw of the same terms in earlier searches (`remember`,
`recall`) is only a plan: it lets the lexical leg send its first round with its statistics,
in the same round trip, instead of waiting for them. A remembered figure that has since
changed costs a plan that reads other levels first, never a different ranking (`lexical`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .arrays import id_array, text_array

# The totals of a knowledge base live in its lexicon row with the empty term.
TOTALS = ""

#: Entries (a term of a set of knowledge bases) a process remembers, about 250 bytes each
#: (8 MB in all); past it, it starts afresh.
REMEMBERED = 32_768

# Per term over the KBs: chunks, summed length, highest level. A function of migration
# 0013, whose plan the connection keeps (planning the statement cost as much as running it).
_STATISTICS = """/* bk:lexicon */
SELECT * FROM bailing_knowledge_term_statistics(%(kbs)s::bigint[], %(terms)s::text[])
"""


@dataclass(frozen=True)
class Statistics:
    """What BM25 needs of the knowledge bases searched, for the terms of one query."""

    chunks: int
    average_length: float
    df: dict[str, int]
    top: dict[str, int]

    @staticmethod
    def statement(kb_ids: Sequence[int], terms: Sequence[str]) -> tuple[str, dict[str, Any]]:
        """The statement whose rows `from_rows` reads."""
        return _STATISTICS, {"kbs": id_array(kb_ids), "terms": text_array([TOTALS, *terms])}

    @classmethod
    def load(cls, cursor: Any, kb_ids: Sequence[int], terms: Sequence[str]) -> Statistics:
        cursor.execute(*cls.statement(kb_ids, terms))
        return cls.from_rows(cursor.fetchall())

    @classmethod
    def from_rows(cls, answer: Iterable[tuple[Any, ...]]) -> Statistics:
        """From the rows of `statement`, which a search may send along with others."""
        rows = {term: (int(n), int(total), int(top)) for term, n, total, top in answer}
        chunks, total, _ = rows.pop(TOTALS, (0, 0, 0))
        return cls(
            chunks=chunks,
            average_length=total / chunks if chunks else 0.0,
            df={term: n for term, (n, _, _) in rows.items() if n > 0},
            top={term: top for term, (n, _, top) in rows.items() if n > 0},
        )


# (knowledge base ids, term) -> (chunks, top level); the totals under TOTALS, as
# (chunks, average length). Dict operations are atomic: threads share it without a lock,
# which only guards starting afresh.
_remembered: dict[tuple[tuple[int, ...], str], tuple[int, float]] = {}
_forgetting = threading.Lock()


def remember(kb_ids: Sequence[int], terms: Iterable[str], stats: Statistics) -> None:
    """Keep what a search read of `terms` (those missing from `stats` as absent)."""
    if len(_remembered) >= REMEMBERED:
        with _forgetting:
            if len(_remembered) >= REMEMBERED:
                _remembered.clear()
    kbs = tuple(sorted(kb_ids))
    _remembered[kbs, TOTALS] = (stats.chunks, stats.average_length)
    for term in terms:
        _remembered[kbs, term] = (stats.df.get(term, 0), stats.top.get(term, 0))


def recall(kb_ids: Sequence[int], terms: Iterable[str]) -> Statistics | None:
    """The statistics earlier searches read of every one of `terms`, or None if some were
    never read here."""
    kbs = tuple(sorted(kb_ids))
    totals = _remembered.get((kbs, TOTALS))
    if totals is None:
        return None
    df: dict[str, int] = {}
    top: dict[str, int] = {}
    for term in terms:
        known = _remembered.get((kbs, term))
        if known is None:
            return None
        if known[0]:
            df[term], top[term] = int(known[0]), int(known[1])
    return Statistics(chunks=int(totals[0]), average_length=totals[1], df=df, top=top)


def forget() -> None:
    """Start afresh (tests)."""
    _remembered.clear()
