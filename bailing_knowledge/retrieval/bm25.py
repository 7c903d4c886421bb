"""BM25 arithmetic for the lexical leg: exact scores from a chunk's term counts, bounds of
what unread levels can add, the leaders kept as rows arrive, and the combinations of terms
through which an unread chunk could still rank.

No SQL here: `lexical` reads the index and hands rows and statistics to these.
"""

from __future__ import annotations

import heapq
import itertools
import math
from bisect import insort
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from ..conf import knowledge_settings
from .postings import LEVEL_Q, reference_parts

#: Most term combinations one closing round asks for (past it, levels are read on).
MAX_COMBINATIONS = 64
#: Scores and bounds are float sums added in different orders: comparisons between them keep
#: this relative margin, on the side of reading more.
SLACK = 1e-9


@dataclass(frozen=True)
class Bm25:
    """The configured BM25 parameters (`SEARCH_BM25_K1`, `SEARCH_BM25_B`)."""

    k1: float
    b: float

    @classmethod
    def from_settings(cls) -> Bm25:
        settings = knowledge_settings
        return cls(float(settings.SEARCH_BM25_K1), float(settings.SEARCH_BM25_B))


@lru_cache(maxsize=64)
def _level_divisors(rho: float) -> tuple[float, ...]:
    """`1 + rho · q` of each level: a bound is the term's top weight over it. One `rho` per
    set of knowledge bases searched, until their average length moves."""
    return tuple(1 + rho * q for q in LEVEL_Q)


class Scorer:
    """Exact BM25 contributions, and upper bounds of what an unread level can contribute."""

    def __init__(self, bm25: Bm25, average_length: float, idf: dict[str, float]) -> None:
        self.k1 = bm25.k1
        self.idf = idf
        self.a = bm25.k1 * (1 - bm25.b)
        self.b = bm25.k1 * bm25.b / average_length
        a0, b0 = reference_parts()
        # K / tf ≥ rho · K₀ / tf for every chunk length (K and K₀ are affine in dl).
        self.rho = min(self.a / a0 if a0 else math.inf, self.b / b0 if b0 else math.inf)
        self._divisors = _level_divisors(self.rho)
        self._bounds: dict[str, list[float]] = {}
        self._parsed: dict[str, list[tuple[float, int]]] = {}

    def bound(self, term: str, value: int) -> float:
        """What a chunk can score for `term` at level `value` (0 below level 0)."""
        return self.bounds(term)[value] if value >= 0 else 0.0

    def bounds(self, term: str) -> list[float]:
        """`bound` of every level of `term`, by level: never larger at a lower level.
        Worked out when first asked for, with the same arithmetic as ever."""
        bounds = self._bounds.get(term)
        if bounds is None:
            top = self.idf[term] * (self.k1 + 1)
            bounds = self._bounds[term] = [top / divisor for divisor in self._divisors]
        return bounds

    def reach(self, frontier: dict[str, int]) -> dict[str, float]:
        """For each term with levels left to read (`frontier`: the highest unread one, -1 or
        lower when none), the most a chunk not read yet can score for it."""
        return {term: self.bound(term, value) for term, value in frontier.items() if value >= 0}

    def score(self, vector: str, length: int) -> float:
        """BM25 of a chunk from the text of its filtered terms (`'term':1A,2A ...`).

        Each text is parsed once per query: most chunks hold the query's terms once or
        twice, so the same few texts come back again and again, with other lengths."""
        terms = self._parsed.get(vector)
        if terms is None:
            terms = self._parsed[vector] = self._parse(vector)
        norm = self.a + self.b * length
        total = 0.0
        for weight, tf in terms:
            total += weight * tf / (tf + norm)
        return total

    def _parse(self, vector: str) -> list[tuple[float, int]]:
        """(idf · (k1 + 1), tf) of each query term in the text."""
        terms = []
        for item in vector.split():
            text, _, positions = item.rpartition(":")
            weight = self.idf.get(text[1:-1])
            if weight is not None:
                terms.append((weight * (self.k1 + 1), positions.count(",") + 1))
        return terms


class Leaders:
    """The `size` best of the scores found so far, best first, ties by id: kept as rows
    arrive (most score below the last leader: one comparison), rebuilt only when a leader
    turns out hidden."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: list[tuple[float, int]] = []  # (-score, id), ascending

    def offer(self, chunk_id: int, score: float) -> None:
        item = (-score, chunk_id)
        if len(self._items) < self.size:
            insort(self._items, item)
        elif item < self._items[-1]:
            insort(self._items, item)
            self._items.pop()

    def rebuild(self, scores: dict[int, float]) -> None:
        self._items = heapq.nsmallest(self.size, ((-s, i) for i, s in scores.items()))

    def ids(self) -> list[int]:
        return [chunk_id for _, chunk_id in self._items]

    def score(self, rank: int) -> float:
        """The score at `rank` (from 1), or 0 while fewer chunks are known."""
        return -self._items[rank - 1][0] if len(self._items) >= rank else 0.0

    def ranking(self) -> list[tuple[int, float]]:
        return [(chunk_id, -negated) for negated, chunk_id in self._items]


def top(items: Iterable[tuple[int, float]], limit: int) -> list[tuple[int, float]]:
    """The `limit` best (id, score), best first, ties by id."""
    return [(i, -s) for s, i in heapq.nsmallest(limit, ((-s, i) for i, s in items))]


def reaching_combinations(bounds: dict[str, float], kth: float) -> list[tuple[str, ...]] | None:
    """The smallest sets of terms whose unread bounds together reach `kth`: an unread chunk
    can beat the proven ranks only if it holds one of them. None while a single term
    reaches it (its levels are read first) or when there would be too many."""
    items = sorted(((bound, term) for term, bound in bounds.items() if bound > 0), reverse=True)
    kth *= 1 - SLACK  # a sum that might reach it, given the rounding, counts as reaching it
    if kth <= 0 or not items or items[0][0] >= kth:
        return None
    suffix = [*itertools.accumulate(bound for bound, _ in reversed(items))][::-1]
    suffix.append(0.0)
    found: list[tuple[str, ...]] = []

    def extend(start: int, chosen: tuple[str, ...], total: float) -> bool:
        for index in range(start, len(items)):
            if total + suffix[index] < kth:
                return True
            bound, term = items[index]
            if total + bound >= kth:
                found.append((*chosen, term))
                if len(found) > MAX_COMBINATIONS:
                    return False
            elif not extend(index + 1, (*chosen, term), total + bound):
                return False
        return True

    return found if extend(0, (), 0.0) and found else None


def level_floor(bounds: list[float], kth: float) -> float:
    """The lowest bound a level may have and still matter: with every level above it read,
    no unread chunk could beat the `kth` score (the largest t with Σ min(bound, t) ≤ kth)."""
    if kth <= 0 or not bounds:
        return 0.0
    ordered = sorted(bounds)
    below = 0.0
    for index, bound in enumerate(ordered):
        t = (kth - below) / (len(ordered) - index)
        if t <= bound:
            return max(t, 0.0)
        below += bound
    return ordered[-1]
