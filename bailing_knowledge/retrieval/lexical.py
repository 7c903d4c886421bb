"""The lexical leg: BM25 over impact-levelled postings, top-k without scoring every match.

Scoring is Lucene's BM25 at chunk level::

    score(c) = Σ_t idf(t) · (k1 + 1) · tf / (tf + k1 · (1 - b + b · dl / avgdl))
    idf(t)   = ln(1 + (N - df + 0.5) / (df + 0.5))

with `N`, `df` and `avgdl` taken over the knowledge bases searched (the `LexiconTerm` rows,
kept exact by triggers on the chunk table), `tf` the term's count in the chunk and `dl` the
chunk's length in terms. A chunk's terms are those of its text and of its document's title,
analysed in the knowledge base's language (`analysis.document_terms`).

**Index layout** (`postings`): each chunk is listed in the GIN index under ``<term>|<level>``
lexemes, the level a logarithmic bucket of the term's weight in that chunk.

**Query.** Levels are read from the top down, all query terms at once, one statement per
round (the threshold algorithm): each chunk found is scored exactly from its own lexemes
(their positions give `tf`) and its length; the chunks not found yet can score at most the
sum, over the terms, of the bound of the highest level not read yet. Reading stops when the
`EXACT_RANKS`-th best score (or the `limit`-th, if fewer) times `SEARCH_LEXICAL_PRUNING`
exceeds that bound: at 1.0 those first ranks are exactly an exhaustive BM25's; above it, no
chunk left out scores more than that factor times the last of them (the bound is loose, so
nearly all top 10s stay exact). The cost follows how deep the answer lies, not how many
chunks contain a term. Before a chunk counts among the best, its document is checked
(ready, at the chunk's revision, audience and roles), so a hidden chunk never takes a rank
or decides when reading stops: by the statement that reads it when the round reads few
chunks (`CHECKED_ROWS`: the first round, or one the budget cuts short) and in the closing
round, which reads few (65 at the median at 100k, 647 at most); else, in a statement of its
own, for the chunks that would rank only (`rounds.VISIBLE`). A leg with `deferred` checks none
itself (but in the closing round): it notes every chunk that was a leader at a decision
(`unverified`) and hands the caller a statement to check them with its own (`verification`).
Its rounds after the first also leave out the term counts of the chunks that cannot reach
its leaders (`_gate`, `rounds.gated_round`): most of such a round's rows.

**First round.** When the process has read the statistics of every query term before
(`statistics.recall`), the first round is planned from those and sent with the search's
opening statements, last (`opening`): it costs no round trip of its own, and its rows are
scored as they arrive, while the server reads on (`opened_part`, `opened`). The plan
decides only what that round reads: scores
and bounds use the statistics read in the search's snapshot, and a term whose top level
has risen since the plan's figures keeps all its levels unread (`_Early.trusted`).

**Closing round.** That bound assumes an unread chunk holds every term at its highest unread
level, which a query of several terms rarely meets: its top chunks hold some of the terms,
not all. Once no single term's bound reaches the proven score, a chunk can only beat it by
holding one of the smallest combinations of terms whose bounds together reach it; one last
statement reads the unread chunks holding any of those combinations (an OR of ANDs, which the
GIN index answers by intersecting posting lists) and the proof is complete, unless the read
budget runs out first. The intersection costs what the posting lists are long, so the round
is taken only while they are short (`COMBINED_POSTINGS`); otherwise levels are read on.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction

from ..conf import knowledge_settings
from ..models import KnowledgeBase
from ..statements import Answer
from . import rounds
from .analysis import query_terms
from .arrays import id_array, text_array
from .bm25 import SLACK, Bm25, Leaders, Scorer, level_floor, reaching_combinations, top
from .session import Statement, configure_search, stream_rows
from .statistics import Statistics, recall, remember
from .visibility import Visibility, group_knowledge_bases

#: Longest query the leg analyses, in terms.
MAX_QUERY_TERMS = 32
#: Guard: rounds per search. The other guard, chunks read per search, is the setting
#: `SEARCH_LEXICAL_READ_BUDGET`. Past either the answer is the best found, not proven exact.
MAX_ROUNDS = 12
#: Chunks the first round reads, and how much larger each next round may be: a round reads
#: the heaviest unread levels of all terms together, in order of their bounds, so what a
#: search reads follows how deep its answer lies, not how many chunks hold its terms. At
#: 100k NFCorpus chunks a first round of 200 instead of 100 proves the median test query at
#: once: 3 statements instead of 5, for 200 chunks read instead of 204. A query the first
#: round does not prove usually needs far more, and each round costs a statement and a
#: visibility check, so the second may read ten times as much (up to the budget). With a
#: budget of 2,000, against four times, the leg's p95 at 100k fell from 17.7 to 14.9 ms,
#: common-term queries' median from 17.5 to 14.9 ms, and the median at 1M from 16.0 to
#: 13.7 ms, for 7 % more chunks read on average and the same exact top 10s (alternating runs
#: of the same queries). A second round that fills the budget leaves none for the closing
#: round: 46 test queries at 100k end unproven against 41 with four times, for the same 315
#: exact top 10s of 323.
FIRST_ROUND = 200
GROWTH = 10
#: The ranks reading stops for (`SEARCH_LEXICAL_PRUNING` loosens the stop): a search uses
#: the first ranks (3 hints at most; fusion weighs rank 1 five times rank 40), the rest are
#: the best found.
EXACT_RANKS = 10
#: Postings (summed over the terms of the combinations) past which the closing round is not
#: tried: the GIN index intersects whole posting lists, so its cost follows their length.
#: Counted over every knowledge base: the index lists all of their chunks.
COMBINED_POSTINGS = 10_000
#: Rounds of up to this many chunks (the first one) check their documents in the statement
#: itself, a lookup per row: cheaper than a statement of its own for a few hundred rows.
#: Larger rounds check only the chunks that would rank, in a statement of their own
#: (`rounds.VISIBLE`); the closing round always checks its rows, which are few.
CHECKED_ROWS = FIRST_ROUND
#: Rows scored at a time while a round's answer still arrives (`session.stream_rows`, and
#: `statements.run_each` for a first round sent with the opening statements): the scoring
#: overlaps the server's reading. Against waiting for the whole answer (alternating
#: per query, the 323 NFCorpus test queries), the leg's p95 fell from 13.3 to 11.3 ms at 1M
#: chunks and from 11.8 to 10.0 ms at 100k, its median from 7.3 to 6.4 ms at 1M, with the
#: same top 10s; batches of 100 or 200 rows did as well as 50.
STREAM_ROWS = 50
# --------------------------------------------------------------------------------------------
# The leg


class LexicalLeg:
    """BM25 top-k over knowledge bases of one language, for one query."""

    def __init__(
        self,
        query: str,
        kbs: Sequence[KnowledgeBase],
        visibility: Visibility,
        language: str,
        bm25: Bm25 | None = None,
    ) -> None:
        self.kb_ids = [kb.pk for kb in kbs]
        self.visibility = visibility
        self.terms = query_terms(query, language, max_terms=MAX_QUERY_TERMS)
        self.bm25 = bm25 or Bm25.from_settings()
        #: What the last `ranking` did: rounds run, chunks read, and whether the read budget
        #: ended it before its top-k was proven exact (benchmarks report them).
        self.rounds = 0
        self.chunks_read = 0
        self.truncated = False
        #: Whether a closing round over combinations of terms ended it.
        self.combined = False
        #: Chunks it read whose term counts a round left out, as unable to rank (`_gate`).
        self.unscored = 0
        #: The document of each chunk scored.
        self.documents: dict[int, int] = {}
        #: Leave the document check of the chunks that would rank to the caller
        #: (`verification`): rounds read without it, and no statement of its own runs.
        self.deferred = False
        #: With `deferred`: every chunk that was among the leaders when reading went on or
        #: stopped, not checked yet. All visible, the ranking is the one checking as it
        #: reads would give, since every decision saw the same leaders.
        self.unverified: set[int] = set()
        # Set by `opening` and `opened`: the ranking's state once its statistics are in,
        # the first round sent with them, and the limit they were sent for.
        self._opened: _Progress | None = None
        self._early: _Early | None = None
        self._limit = 0

    def opening(self, limit: int) -> list[Statement]:
        """The statements `ranking(limit)` begins with, for a caller that sends them along
        with others and hands their answers to `opened` as they arrive: the term statistics
        and, when earlier searches of this process read those of every term
        (`statistics.recall`), the first round, planned from them, to be sent last: it then
        costs no round trip of its own, and its rows come as the server finds them
        (`opened_part`). Empty when the query has no terms."""
        self._opened = None
        self._early = None
        self._limit = limit
        if not self.terms or not self.kb_ids or limit <= 0:
            return []
        statements = [Statistics.statement(self.kb_ids, self.terms)]
        planned = recall(self.kb_ids, self.terms)
        idf = self._idf(planned) if planned is not None else None
        if planned is not None and idf:
            frontier = {term: planned.top[term] for term in idf}
            wanted = rounds.levels_wanted(
                self._scorer(planned, idf), planned, frontier, 0.0, rounds.FIRST_LEXEMES
            )
            size = min(FIRST_ROUND, int(knowledge_settings.SEARCH_LEXICAL_READ_BUDGET))
            if wanted and size > 0:
                self._early = _Early(wanted, frontier, size)
                params = {**self.visibility.params(self.kb_ids), "terms": text_array(self.terms)}
                round_params = rounds.round_params(
                    params, wanted, id_array(), size, self._checks(size)
                )
                statements.append((rounds.ROUND, round_params))
        return statements

    def opened(self, place: int, answer: Answer) -> None:
        """Take the answer of the `opening` statement at `place`: the statistics first, then
        the first round's rows, scored now unless they were as they came (`opened_part`)."""
        if place == 0:
            self._opened = self._start(self._limit, Statistics.from_rows(answer or ()))
            return
        progress, early = self._opened, self._early
        if progress is None or early is None:
            return  # no term of the query is in the knowledge bases
        if early.read is None:  # no part of it came before (`opened_part`)
            self._take_early(progress, early, answer or [])
        progress.early = early

    def opened_part(self, place: int, rows: Sequence[tuple[Any, ...]]) -> None:
        """Take a batch of the first round's rows as it arrives, before its whole answer
        (`opened`): they are scored while the server reads on."""
        progress, early = self._opened, self._early
        if place == 1 and progress is not None and early is not None:
            self._take_early(progress, early, rows)

    def _take_early(
        self, progress: _Progress, early: _Early, rows: Sequence[tuple[Any, ...]]
    ) -> None:
        if early.read is None:
            self.rounds += 1
            early.read = rounds.Read()
        if rows:
            self._consume(early.read, rows, progress.scorer, progress.scores, progress.leaders)

    def _idf(self, stats: Statistics) -> dict[str, float] | None:
        if not stats.chunks or not stats.df:
            return None
        n = stats.chunks
        return {
            term: math.log(1 + (n - df + 0.5) / (df + 0.5))
            for term in self.terms
            if (df := stats.df.get(term))
        }

    def _prepare(
        self, cursor: Any, statistics: Iterable[tuple[Any, ...]] | None = None
    ) -> tuple[Statistics, dict[str, float]] | None:
        if not self.terms or not self.kb_ids:
            return None
        if statistics is None:
            stats = Statistics.load(cursor, self.kb_ids, self.terms)
        else:
            stats = Statistics.from_rows(statistics)
        remember(self.kb_ids, self.terms, stats)
        idf = self._idf(stats)
        return None if idf is None else (stats, idf)

    def _scorer(self, stats: Statistics, idf: dict[str, float]) -> Scorer:
        return Scorer(self.bm25, stats.average_length or 1.0, idf)

    def _start(self, limit: int, stats: Statistics) -> _Progress | None:
        """A ranking's state before its first round (None: nothing to rank)."""
        self.rounds = self.chunks_read = self.unscored = 0
        self.truncated = self.combined = False
        self._visible: set[int] = set()
        self._hidden: set[int] = set()
        # Chunks a round found that cannot reach the leaders, left unscored (`_gate`).
        self._passed: set[int] = set()
        self._revisions: dict[int, int] = {}
        # Chunks `_admit` checks at once, past the leaders, once it has met hidden ones.
        self._check_batch = 0
        self.unverified = set()
        remember(self.kb_ids, self.terms, stats)
        idf = self._idf(stats)
        if idf is None or limit <= 0:
            return None
        return _Progress(
            limit=limit,
            stats=stats,
            scorer=self._scorer(stats, idf),
            # The next level to read of each term, from its highest one down; -1: all read.
            frontier={term: stats.top[term] for term in idf},
            leaders=Leaders(limit),
        )

    def ranking(
        self,
        limit: int,
        cursor: Any = None,
        statistics: Iterable[tuple[Any, ...]] | None = None,
    ) -> list[tuple[int, float]]:
        """The best `limit` visible chunks, (id, score), best first: BM25 top-k, the first
        ranks exact or within `SEARCH_LEXICAL_PRUNING` of it.

        `statistics`: the rows of the statistics statement, if the caller has run it; a
        ranking whose `opening` statements were answered (`opened`) goes on from them."""
        if cursor is None:
            with transaction.atomic(), connection.cursor() as own:
                configure_search(own)
                return self.ranking(limit, own, statistics)
        progress, self._opened = self._opened, None
        if progress is None or progress.limit != limit:
            if not self.terms or not self.kb_ids:
                return []
            if statistics is None:
                stats = Statistics.load(cursor, self.kb_ids, self.terms)
            else:
                stats = Statistics.from_rows(statistics)
            progress = self._start(limit, stats)
            if progress is None:
                return []
        scorer, frontier, scores, leaders = (
            progress.scorer,
            progress.frontier,
            progress.scores,
            progress.leaders,
        )
        terms = list(frontier)
        # Reading stops once no unread chunk can score more than `pruning` times the
        # `proven`-th score (1.0: those ranks are exact); what is read next is chosen as for
        # the exact proof. The ranks after them are the best found by then.
        proven = min(limit, EXACT_RANKS)
        pruning = float(knowledge_settings.SEARCH_LEXICAL_PRUNING)
        params = {**self.visibility.params(self.kb_ids), "terms": text_array(terms)}
        # Chunks this search may still read; past them, the best found (not proven exact).
        budget = int(knowledge_settings.SEARCH_LEXICAL_READ_BUDGET)
        size = FIRST_ROUND
        floor = 0.0  # levels bounded below this cannot change the proven ranks
        hidden = 0  # chunks found hidden so far: refunded to the budget
        early, progress.early = progress.early, None
        while True:
            # The terms whose levels the round's plan read from their highest one down.
            trusted: Iterable[str] = frontier
            if early is not None and early.read is not None:
                wanted, read, size = early.wanted, early.read, early.size
                trusted = early.trusted(frontier)
                early = None
            else:
                wanted = rounds.levels_wanted(
                    scorer,
                    progress.stats,
                    frontier,
                    floor,
                    rounds.ROUND_LEXEMES if self.rounds else rounds.FIRST_LEXEMES,
                )
                if not wanted:
                    break
                self.rounds += 1
                size = min(size, budget)
                read = self._read(
                    cursor,
                    *rounds.round_statement(
                        params,
                        wanted,
                        id_array(scores, self._hidden, self._passed),
                        size,
                        self._checks(size),
                        scorer.reach(frontier),
                        self._gate(leaders, progress.limit),
                    ),
                    scorer,
                    scores,
                    leaders,
                )
            self._admit(cursor, scores, leaders, params)
            # Hidden chunks do not spend the budget: a principal who sees few of the
            # matches would otherwise get the best of none. Their reading is bounded by
            # the rounds (`MAX_ROUNDS`), each of at most the budget.
            budget -= read.rows - (len(self._hidden) - hidden)
            hidden = len(self._hidden)
            # The levels before the one the last row came from are read whole; from there
            # on (all of them, if rows came out of order) they stay unread.
            done = len(wanted) if read.rows < size else (read.last - 1 if read.in_order else 0)
            for _, term, value in wanted[:done]:
                if term in trusted or (value < 0 and term in frontier):
                    frontier[term] = min(frontier[term], value - 1)  # -1 read whole: -2
            remaining = sum(scorer.bound(t, frontier[t]) for t in terms)
            kth = leaders.score(proven)  # 0 while fewer chunks are known
            if remaining == 0 or (kth > 0 and kth * pruning > remaining * (1 + SLACK)):
                break
            if budget <= 0 or self.rounds >= MAX_ROUNDS:
                # Out of budget: the best found so far (an approximation, rarely different).
                self.truncated = True
                break
            unread = scorer.reach(frontier)
            combinations = reaching_combinations(unread, kth)
            if combinations and self._few_postings(cursor, progress.stats, combinations):
                # No term can reach the proven ranks on its own: the chunks that still can
                # hold one of these combinations; read them all and the proof is complete.
                self._close(cursor, scorer, combinations, scores, leaders, params, budget)
                break
            size *= GROWTH
            floor = level_floor(list(unread.values()), kth)
        self.unscored = len(self._passed - scores.keys())
        self.chunks_read = len(scores) + self.unscored + len(self._hidden)
        return leaders.ranking()

    def _few_postings(
        self, cursor: Any, stats: Statistics, combinations: list[tuple[str, ...]]
    ) -> bool:
        """The combinations' terms have posting lists short enough to intersect: counted over
        the knowledge bases searched first (known), then over all of them (one statement)."""
        terms = sorted(set(itertools.chain(*combinations)))
        if sum(stats.df[term] for term in terms) > COMBINED_POSTINGS:
            return False
        cursor.execute(rounds.ALL_POSTINGS, {"terms": text_array(terms)})
        return int(cursor.fetchone()[0]) <= COMBINED_POSTINGS

    def _close(
        self,
        cursor: Any,
        scorer: Scorer,
        combinations: list[tuple[str, ...]],
        scores: dict[int, float],
        leaders: Leaders,
        params: dict,
        budget: int,
    ) -> None:
        """The closing round: every unread chunk holding one of `combinations`, scored."""
        self.rounds += 1
        tsquery = " | ".join(
            "(" + " & ".join(rounds.level_query(term, -1) for term in group) + ")"
            for group in combinations
        )
        read = self._read(
            cursor,
            rounds.COMBINED,
            {
                **params,
                "combined": tsquery,
                "seen": id_array(scores, self._hidden, self._passed),
                "budget": budget,
            },
            scorer,
            scores,
            leaders,
        )
        self._admit(cursor, scores, leaders, params)
        self.truncated = read.rows >= budget
        self.combined = True

    def _read(
        self,
        cursor: Any,
        sql: str,
        params: dict,
        scorer: Scorer,
        scores: dict[int, float],
        leaders: Leaders,
    ) -> rounds.Read:
        """Run a round's statement, scoring its rows batch by batch as they arrive."""
        read = rounds.Read()

        def consume(rows: Sequence[tuple[Any, ...]]) -> None:
            self._consume(read, rows, scorer, scores, leaders)

        stream_rows(cursor, sql, params, consume, STREAM_ROWS)
        return read

    def _consume(
        self,
        read: rounds.Read,
        rows: Sequence[tuple[Any, ...]],
        scorer: Scorer,
        scores: dict[int, float],
        leaders: Leaders,
    ) -> None:
        """Score a batch of a round's rows, noting where in the lexemes asked for they end."""
        read.in_order = read.in_order and read.last <= rows[0][3] and rounds.in_order(rows)
        read.rows += len(rows)
        read.last = rows[-1][3]
        self._take(rows, scorer, scores, leaders)

    def _take(
        self,
        rows: list[tuple[Any, ...]],
        scorer: Scorer,
        scores: dict[int, float],
        leaders: Leaders,
    ) -> None:
        """Score the chunks of a statement's rows, each once (a round finds a chunk through
        each of its terms), and offer them to the leaders; a chunk the statement found
        hidden is only remembered as such."""
        hidden = self._hidden
        for chunk_id, length, vector, _, document_id, revision, visible in rows:
            if chunk_id in scores or chunk_id in hidden:
                continue
            if visible is not None:
                if not visible:
                    hidden.add(chunk_id)
                    continue
                self._visible.add(chunk_id)
            if vector is None:  # the round left its counts out: it cannot rank (`_gate`)
                self._passed.add(chunk_id)
                continue
            self.documents[chunk_id] = document_id
            self._revisions[chunk_id] = revision
            scores[chunk_id] = score = scorer.score(vector, length)
            leaders.offer(chunk_id, score)

    def _gate(self, leaders: Leaders, limit: int) -> float:
        """The bound under which a round may leave a chunk's term counts out (0: none).

        A chunk whose bound is below the `limit`-th score cannot join the leaders, and
        scores only rise: whatever it holds, it never ranks. Left unscored, it is seen all
        the same (no later round reads it, so no later bound has to allow for the levels
        it was found at). With checks deferred only: a leg that checks as it reads drops a
        hidden leader, and the scores it ranks by may then fall."""
        if not self.deferred:
            return 0.0
        return leaders.score(limit) * (1 - SLACK)

    def _checks(self, size: int) -> bool:
        """Whether a round of `size` chunks checks each one's document as it reads it."""
        return not self.deferred and size <= CHECKED_ROWS

    def _admit(self, cursor: Any, scores: dict[int, float], leaders: Leaders, params: dict) -> None:
        """Check the chunks that would rank against their documents (ready, current
        revision, audience and roles); hidden ones leave `scores` before they count.
        `deferred`: only note them for the caller's check (`verification`)."""
        if self.deferred:
            self.unverified.update(i for i in leaders.ids() if i not in self._visible)
            return
        while True:
            unchecked = [i for i in leaders.ids() if i not in self._visible]
            if not unchecked:
                return
            if self._check_batch > len(unchecked):
                # Hidden leaders were met: check the next best chunks too, in batches that
                # grow, so that many hidden ones cost few statements.
                unchecked = [
                    chunk_id
                    for chunk_id, _ in top(
                        ((i, s) for i, s in scores.items() if i not in self._visible),
                        self._check_batch,
                    )
                ]
            cursor.execute(rounds.VISIBLE, {**params, "ids": id_array(unchecked)})
            visible = {row[0] for row in cursor.fetchall()}
            self._visible |= visible
            hidden = [chunk_id for chunk_id in unchecked if chunk_id not in visible]
            for chunk_id in hidden:
                del scores[chunk_id]
                self._hidden.add(chunk_id)
            if hidden:
                leaders.rebuild(scores)
                self._check_batch = 2 * max(self._check_batch, len(unchecked))

    def verification(self) -> Statement | None:
        """The statement that checks the documents of `unverified` (None: nothing to check),
        for the caller to send with its own; its answer goes to `verified`. It looks up
        their documents only: a round returns each chunk's document and revision."""
        if not self.unverified:
            return None
        documents = {self.documents[chunk_id] for chunk_id in self.unverified}
        return rounds.ADMITTED, {**self.visibility.params(()), "ids": id_array(documents)}

    def verified(self, answer: Answer) -> bool:
        """Whether every chunk `verification` asked about is visible: its document admits
        the principal and is at the chunk's revision."""
        current = dict(answer or ())
        return all(
            current.get(self.documents[chunk_id]) == self._revisions[chunk_id]
            for chunk_id in self.unverified
        )

    def exhaustive(self, limit: int, cursor: Any = None) -> list[tuple[int, float]]:
        """Every visible chunk holding a query term, scored: the reference `ranking` meets."""
        if cursor is None:
            with transaction.atomic(), connection.cursor() as own:
                configure_search(own)
                return self.exhaustive(limit, own)
        prepared = self._prepare(cursor)
        if prepared is None or limit <= 0:
            return []
        stats, idf = prepared
        scorer = self._scorer(stats, idf)
        cursor.execute(
            rounds.EVERY,
            {
                **self.visibility.params(self.kb_ids),
                "terms": text_array(idf),
                "tsquery": " | ".join(rounds.level_query(term, -1) for term in idf),
            },
        )
        scores = {row[0]: scorer.score(row[2], row[1]) for row in cursor.fetchall()}
        return top(scores.items(), limit)


@dataclass
class _Early:
    """A first round planned from remembered statistics (`LexicalLeg.opening`): the lexemes
    asked for, the level each term's plan began at, its size, and what it read."""

    wanted: list[tuple[float, str, int]]
    began: dict[str, int]
    size: int
    read: rounds.Read | None = None

    def trusted(self, frontier: dict[str, int]) -> set[str]:
        """The terms whose levels the plan read from their highest one down: it began at
        or above the top level the search's own statistics give (a term whose top level
        has risen since keeps all its levels unread; what was read of it still counts)."""
        return {term for term, top in frontier.items() if self.began.get(term, -1) >= top}


@dataclass
class _Progress:
    """Where a ranking stands between its rounds."""

    limit: int
    stats: Statistics
    scorer: Scorer
    frontier: dict[str, int]
    leaders: Leaders
    scores: dict[int, float] = field(default_factory=dict)
    #: The first round, answered with the statistics (`LexicalLeg.opened`).
    early: _Early | None = None


# --------------------------------------------------------------------------------------------
# Entry points for tests and benchmarks


def _ranked(
    query: str, kbs: Sequence[KnowledgeBase], visibility: Visibility, limit: int, how: str
) -> list[tuple[int, float]]:
    found: list[tuple[int, float]] = []
    for language, group in group_knowledge_bases(kbs, "language"):
        found += getattr(LexicalLeg(query, group, visibility, language), how)(limit)
    return top(found, limit)


def lexical_ranking(
    query: str, kbs: Sequence[KnowledgeBase], visibility: Visibility, limit: int
) -> list[tuple[int, float]]:
    """The lexical leg as a search runs it, (chunk id, score) best first."""
    return _ranked(query, kbs, visibility, limit, "ranking")


def exhaustive_ranking(
    query: str, kbs: Sequence[KnowledgeBase], visibility: Visibility, limit: int
) -> list[tuple[int, float]]:
    """Exact BM25 over every visible matching chunk: the reference of `lexical_ranking`."""
    return _ranked(query, kbs, visibility, limit, "exhaustive")
