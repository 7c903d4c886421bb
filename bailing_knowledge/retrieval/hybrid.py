"""Hybrid retrieval in SQL: pgvector cosine over HNSW and BM25 lexical search, fused by rank.

Visibility is part of every leg's WHERE clause — KB in the route's scope and enabled, KB
tenant binding, the document ready at the chunk's revision, per-document audience and role
restrictions — so a hidden document never takes a candidate slot, a rank or a score. The
lexical legs' document checks may wait for the fetch (`HybridSearch.run`): a hidden chunk
among their leaders then makes the search run again, checking as it reads.

The lexical leg (`lexical.LexicalLeg`, one per language of the KBs searched) finds the exact
BM25 top-k without scoring every matching chunk; the vector leg runs once per embedder.
Each leg runs under a statement timeout; a leg that times out aborts the transaction, and the
legs left run in a new one, so a slow or failing leg degrades the answer to `partial`
instead of failing it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg.errors
from django.db import DatabaseError

from ..conf import knowledge_settings
from ..models import KnowledgeBase
from .analysis import LANGUAGES
from .arrays import id_array
from .embedders import EmbedderError, get_embedder
from .lexical import STREAM_ROWS, LexicalLeg
from .session import (
    SearchTransaction,
    Statement,
    configure_statement,
    early_parts,
    search_transaction,
)
from .vector import vector_statement
from .visibility import (
    Visibility,
    group_knowledge_bases,
    searchable_knowledge_bases,
)

__all__ = ["Hit", "HybridSearch", "SearchResult", "Visibility", "searchable_knowledge_bases"]

logger = logging.getLogger("bailing_knowledge")

# Measured on NFCorpus and CMRC 2018 (docs/performance.md): 10 beats the customary 60 on both.
RRF_K = 10

# The hits that will be returned, checked against the document as it is now: ready, at the
# chunk's revision, in scope, and the chunk's text still the body's at its offsets. Stale
# chunks are not returned. A function of migration 0013, whose plan the connection keeps:
# planned on every search, the statement cost about as much to plan as to run.
_FETCH = """/* bk:fetch */
SELECT * FROM bailing_knowledge_fetch_hits(%(ids)s::bigint[], %(kbs)s::bigint[])
"""


@dataclass(frozen=True)
class Hit:
    chunk_id: int
    document_id: int
    knowledge_base_id: int
    revision: int
    start: int
    end: int
    text: str
    title: str
    content_hash: str
    score: float


@dataclass
class SearchResult:
    hits: list[Hit] = field(default_factory=list)
    legs_ok: int = 0
    legs_failed: int = 0
    #: Hits dropped because their document changed under them; the search runs in one
    #: snapshot, so only a chunk whose text no longer matches its body gets here.
    stale: int = 0

    @property
    def status(self) -> str:
        if self.legs_failed == 0 and not self.stale:
            return "ok"
        return "partial" if self.legs_ok else "unavailable"


def fusion_weight(alias: str) -> float:
    """A vector leg's weight in the fusion, relative to the lexical leg's 1.0: the embedder's
    own, which `FUSION_WEIGHT` in its settings entry replaces (validated when it is built)."""
    return get_embedder(alias).fusion_weight


@dataclass
class _Leg:
    """One ranking to fuse: the lexical leg of one language, or the vector leg of one
    embedder over its knowledge bases."""

    weight: float
    kb_ids: list[int] = field(default_factory=list)
    embedder: str = ""
    lexical: LexicalLeg | None = None


@dataclass
class _Opening:
    """A search's opening statements, and whose answer each one is."""

    statements: list[Statement]
    #: Each leg's first statement's place.
    answer_of: dict[int, int] = field(default_factory=dict)
    #: Each place's leg and the place among that leg's own statements.
    owner: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: The vector leg sent with them, if any.
    first_vector: int | None = None


def _is_timeout(exc: DatabaseError) -> bool:
    return isinstance(exc.__cause__, psycopg.errors.QueryCanceled)


class _HiddenLeader(Exception):
    """A chunk among a lexical leg's leaders turned out hidden when its check was deferred."""


#: How long, in seconds, searches of the same knowledge bases by the same principal check
#: documents as they read once a deferred check found a hidden leader; and how many such
#: searches a process remembers (past it, it forgets them all). Dict operations are atomic:
#: threads share it without a lock.
HIDDEN_MEMORY_SECONDS = 600.0
HIDDEN_MEMORY_SIZE = 4096
_hidden_met: dict[tuple[tuple[int, ...], Visibility], float] = {}


def _hidden_key(
    kbs: Sequence[KnowledgeBase], visibility: Visibility
) -> tuple[tuple[int, ...], Visibility]:
    return tuple(sorted(kb.pk for kb in kbs)), visibility


def _defers(key: tuple[tuple[int, ...], Visibility]) -> bool:
    """Whether the lexical legs may leave their document checks to the fetch: not while a
    recent search with `key` met a hidden leader (it would run twice again)."""
    return _hidden_met.get(key, 0.0) <= time.monotonic()


def _remember_hidden(key: tuple[tuple[int, ...], Visibility]) -> None:
    if len(_hidden_met) >= HIDDEN_MEMORY_SIZE:
        _hidden_met.clear()
    _hidden_met[key] = time.monotonic() + HIDDEN_MEMORY_SECONDS


def forget_hidden_leaders() -> None:
    """Forget which searches met hidden leaders (tests; a process's own state otherwise)."""
    _hidden_met.clear()


class HybridSearch:
    """One search over a set of KBs; call `run()` inside nothing: it opens its transaction."""

    def __init__(
        self,
        query: str,
        kbs: Sequence[KnowledgeBase],
        visibility: Visibility,
        *,
        use_vector: bool = True,
        use_lexical: bool = True,
    ) -> None:
        self.query = query
        self.kbs = list(kbs)
        self.visibility = visibility
        self.use_vector = use_vector
        self.use_lexical = use_lexical
        self.candidates = int(knowledge_settings.SEARCH_CANDIDATES)
        self.result = SearchResult()
        # The document of every candidate, as the legs found it: selection needs no query.
        self.documents: dict[int, int] = {}

    def run(
        self,
        *,
        max_hits: int,
        min_score: float = 0.0,
        per_document: int = 1,
        max_documents: int | None = None,
    ) -> SearchResult:
        """Fused, validated hits, best first: at most `per_document` chunks of any document
        and chunks of at most `max_documents` documents.

        The lexical legs first run with their document checks deferred: the chunks they
        would rank are checked with the fetch, in its round trip, instead of as they are
        read (a third of a first round's server time) and in statements of their own. If
        one of them turns out hidden, the search runs again checking as it reads, and so do
        the same principal's searches of these knowledge bases for a while
        (`HIDDEN_MEMORY_SECONDS`): a hidden chunk never takes a rank either way."""
        if not self.kbs:
            return self.result
        key = _hidden_key(self.kbs, self.visibility)
        deferred = self._defers(key)
        while True:
            try:
                return self._attempt(
                    deferred, max_hits, min_score, per_document, max_documents or max_hits
                )
            except _HiddenLeader:
                _remember_hidden(key)
                deferred = False
                self.result = SearchResult()
                self.documents = {}

    def _defers(self, key: tuple[tuple[int, ...], Visibility]) -> bool:
        """Whether its lexical legs leave their document checks to the fetch (`run`)."""
        return self.use_lexical and _defers(key)

    def early_statements(self, cursor: Any) -> Iterator[list[str]] | None:
        """The statements this search would send first, as it would send them, for sending
        ahead of it (`session.early_parts`), in groups each ready to leave as soon as it
        is composed: the vector leg's first, so that the server runs it while the lexical
        legs' are composed. None where its legs would not all open (an unsupported
        language), which `run` reports, and where an embedder does not embed queries ahead
        (`BaseEmbedder.embeds_ahead`); a failing embedder ends the groups early."""
        if not self.kbs:
            return None
        deferred = self._defers(_hidden_key(self.kbs, self.visibility))
        legs = self._legs(deferred, quiet=True)
        if legs is None or not all(
            get_embedder(leg.embedder).embeds_ahead for leg in legs if leg.lexical is None
        ):
            return None  # its query would be embedded twice, the first time before the token
        return self._early_groups(cursor, legs)

    def _early_groups(self, cursor: Any, legs: list[_Leg]) -> Iterator[list[str]]:
        plan = _Opening([configure_statement()])
        composed = 0
        try:
            for _ in self._composing(plan, legs, list(range(len(legs))), True):
                yield early_parts(cursor, plan.statements[composed:], first=not composed)
                composed = len(plan.statements)
        except EmbedderError:
            return  # what was sent is not what the search sends: it is discarded
        yield early_parts(cursor, plan.statements[composed:], first=not composed)

    def _legs(self, deferred: bool, *, quiet: bool = False) -> list[_Leg] | None:
        """The legs to run (None, when `quiet`, where a language is not supported)."""
        legs: list[_Leg] = []
        if self.use_lexical:
            for language, group in group_knowledge_bases(self.kbs, "language"):
                if language not in LANGUAGES:
                    if quiet:
                        return None
                    # Stored without validation, or a stemmer the installed packages lack:
                    # that leg fails (`partial`), the other legs still answer.
                    logger.error(
                        "Knowledge bases %s have the unsupported language %r; their "
                        "lexical leg is skipped (set a supported language: it re-indexes them)",
                        ", ".join(kb.slug for kb in group),
                        language,
                    )
                    self.result.legs_failed += 1
                    continue
                lexical = LexicalLeg(self.query, group, self.visibility, language)
                lexical.deferred = deferred
                legs.append(_Leg(1.0, lexical=lexical))
        if self.use_vector:
            for embedder_alias, group in group_knowledge_bases(self.kbs, "embedder"):
                legs.append(
                    _Leg(fusion_weight(embedder_alias), [kb.pk for kb in group], embedder_alias)
                )
        return legs

    def _attempt(
        self,
        deferred: bool,
        max_hits: int,
        min_score: float,
        per_document: int,
        max_documents: int,
    ) -> SearchResult:
        legs = self._legs(deferred) or []
        # Each leg's ranking, by the leg's place in `legs`: fused in that order.
        rankings: dict[int, tuple[float, list[int]]] = {}
        pending = list(range(len(legs)))
        while True:
            with search_transaction() as tx, tx.db.cursor() as cursor:
                if not self._run_legs(tx, cursor, legs, pending, rankings):
                    # A timeout aborted the transaction: the legs left run in a new one.
                    tx.rollback()
                    continue
                scores = self._fuse([rankings[index] for index in sorted(rankings)])
                lexical_legs = [legs[index].lexical for index in rankings]
                self.result.hits = self._select(
                    tx,
                    cursor,
                    scores,
                    max_hits,
                    min_score,
                    per_document,
                    max_documents,
                    [leg for leg in lexical_legs if leg is not None and leg.deferred],
                )
                return self.result

    def _run_legs(
        self,
        tx: SearchTransaction,
        cursor: Any,
        legs: list[_Leg],
        pending: list[int],
        rankings: dict[int, tuple[float, list[int]]],
    ) -> bool:
        """Run the `pending` legs in `tx`, moving each one done into `rankings`; False when
        a statement timed out, which fails its leg and aborts the transaction.

        The opening statements travel together, in one round trip: the transaction's
        settings, the first vector leg, every lexical leg's term statistics, and last each
        lexical leg's first round when the process can plan it (`LexicalLeg.opening`): the
        server sends a query string's answers together at its end, but the rows of its last
        statement as it finds them, so they are scored while it reads on. An embedder
        failure fails its leg only. No savepoint per leg: a timeout is rare and costs a new
        transaction, where savepoints would cost two round trips per leg on every search."""
        plan = self._opening(legs, pending)
        opening, answer_of, owner = plan.statements, plan.answer_of, plan.owner
        first_vector = plan.first_vector

        def lexical_at(place: int) -> LexicalLeg | None:
            return legs[owner[place][0]].lexical if place in owner else None

        # A lexical leg takes its statistics and its first round as they are read.
        def arrived(place: int, answer: Any) -> None:
            if (lexical := lexical_at(place)) is not None:
                lexical.opened(owner[place][1], answer)

        def part(place: int, rows: list[tuple[Any, ...]]) -> None:
            if (lexical := lexical_at(place)) is not None:
                lexical.opened_part(owner[place][1], rows)

        try:
            answers = tx.run(cursor, opening, arrived=arrived, part=part, batch=STREAM_ROWS)
        except DatabaseError as exc:
            self._timed_out(exc, self._blamed(tx, owner), pending)
            return False
        if first_vector is not None:
            self._done(
                first_vector,
                legs,
                self._vector_ranking(answers[answer_of[first_vector]]),
                pending,
                rankings,
            )
        for index in list(pending):
            leg = legs[index]
            try:
                if leg.lexical is not None:
                    statistics = answers[answer_of[index]] if index in answer_of else None
                    ranking = self._lexical(leg.lexical, cursor, statistics)
                else:
                    ranking = self._vector(cursor, leg)
            except EmbedderError:
                self._embedder_failed(index, pending)
                continue
            except DatabaseError as exc:
                self._timed_out(exc, [index], pending)
                return False
            self._done(index, legs, ranking, pending, rankings)
        return True

    def _opening(self, legs: list[_Leg], pending: list[int], *, quiet: bool = False) -> _Opening:
        """The opening statements of the `pending` legs (`_run_legs`): the transaction's
        settings, the first vector leg whose embedder answers (the others failing their
        legs; raising `EmbedderError` instead when `quiet`), every lexical leg's term
        statistics, then each lexical leg's first round."""
        plan = _Opening([configure_statement()])
        for _ in self._composing(plan, legs, pending, quiet):
            pass
        return plan

    def _composing(
        self, plan: _Opening, legs: list[_Leg], pending: list[int], quiet: bool
    ) -> Iterator[None]:
        """Add the opening statements to `plan` (`_opening`), pausing once the vector leg's
        is in: what comes before can leave for the server while the rest is composed
        (`early_statements`), and the server runs the vector leg meanwhile."""

        def add(index: int, own: int, statement: Statement) -> None:
            plan.answer_of.setdefault(index, len(plan.statements))
            plan.owner[len(plan.statements)] = (index, own)
            plan.statements.append(statement)

        for index in [i for i in pending if legs[i].lexical is None]:
            try:
                statement = self._vector_statement(legs[index])
            except EmbedderError:
                if quiet:
                    raise
                self._embedder_failed(index, pending)
                continue
            plan.first_vector = index
            add(index, 0, statement)
            break
        yield
        rounds: list[tuple[int, int, Statement]] = []
        for index in pending:
            lexical = legs[index].lexical
            if lexical is None:
                continue
            for own, statement in enumerate(lexical.opening(self.candidates)):
                if own:
                    rounds.append((index, own, statement))
                else:
                    add(index, own, statement)
        for index, own, statement in rounds:
            add(index, own, statement)

    def _done(
        self,
        index: int,
        legs: list[_Leg],
        ranking: list[int],
        pending: list[int],
        rankings: dict[int, tuple[float, list[int]]],
    ) -> None:
        rankings[index] = (legs[index].weight, ranking)
        self.result.legs_ok += 1
        pending.remove(index)

    @staticmethod
    def _blamed(tx: SearchTransaction, owner: dict[int, tuple[int, int]]) -> list[int]:
        """The leg a failed opening batch fails: the one whose statement failed (the answers
        are read one by one, so it is known). None (an empty list) when the settings
        statement itself failed."""
        failed = tx.answered
        return [owner[failed][0]] if failed is not None and failed in owner else []

    def _embedder_failed(self, index: int, pending: list[int]) -> None:
        logger.warning("Embedder failed; searching lexically only", exc_info=True)
        self.result.legs_failed += 1
        pending.remove(index)

    def _timed_out(self, exc: DatabaseError, legs: list[int], pending: list[int]) -> None:
        """Fail `legs` after a statement timeout; any other database error propagates, and
        so does a timeout that fails no leg (the search could only try the same again)."""
        if not legs or not _is_timeout(exc):
            raise exc
        logger.warning("A search leg timed out")
        self.result.legs_failed += len(legs)
        for index in legs:
            pending.remove(index)

    def _lexical(
        self, leg: LexicalLeg, cursor: Any, statistics: list[tuple[Any, ...]] | None
    ) -> list[int]:
        ranking = [chunk_id for chunk_id, _ in leg.ranking(self.candidates, cursor, statistics)]
        self.documents.update((chunk_id, leg.documents[chunk_id]) for chunk_id in ranking)
        return ranking

    def _vector_statement(self, leg: _Leg) -> Statement:
        """The vector leg's statement: the query embedded by the leg's embedder (which may
        fail: `EmbedderError`)."""
        return vector_statement(
            self.query, leg.embedder, self.visibility.params(leg.kb_ids), self.candidates
        )

    def _vector(self, cursor: Any, leg: _Leg) -> list[int]:
        cursor.execute(*self._vector_statement(leg))
        return self._vector_ranking(cursor.fetchall())

    def _vector_ranking(self, rows: list[tuple[Any, ...]]) -> list[int]:
        self.documents.update((chunk_id, document_id) for chunk_id, _, document_id in rows)
        return [row[0] for row in rows]

    @staticmethod
    def _fuse(rankings: list[tuple[float, list[int]]]) -> dict[int, float]:
        """Weighted reciprocal rank fusion, scaled so that first place in every leg is 1.0."""
        if not rankings:
            return {}
        best = sum(weight for weight, _ in rankings) / (RRF_K + 1)
        scores: dict[int, float] = {}
        for weight, ranking in rankings:
            for rank, chunk_id in enumerate(ranking, start=1):
                scores[chunk_id] = scores.get(chunk_id, 0.0) + weight / (RRF_K + rank)
        return {chunk_id: score / best for chunk_id, score in scores.items()}

    def _select(
        self,
        tx: SearchTransaction,
        cursor: Any,
        scores: dict[int, float],
        max_hits: int,
        min_score: float,
        per_document: int,
        max_documents: int,
        deferred: list[LexicalLeg],
    ) -> list[Hit]:
        """The best chunks within the per-document and document limits, above `min_score`,
        each validated against the current body. The first fetch carries the checks the
        `deferred` lexical legs left (`_HiddenLeader` if a chunk they ranked is hidden)."""
        checks = [(leg, statement) for leg in deferred if (statement := leg.verification())]

        def fetched(statements: list[Statement], last: bool) -> Any:
            answers = tx.run(cursor, [*statements, *(s for _, s in checks)], last=last)
            verdicts = answers[len(statements) :]
            if not all(leg.verified(a) for (leg, _), a in zip(checks, verdicts, strict=True)):
                raise _HiddenLeader
            checks.clear()
            return answers[0] if statements else None

        ranked = sorted(
            (item for item in scores.items() if item[1] >= min_score),
            key=lambda item: (-item[1], item[0]),
        )
        if not ranked or max_hits <= 0:
            if checks:
                fetched([], last=True)
            return []
        allowed: list[tuple[int, float]] = []
        per_doc: dict[int, int] = {}
        for chunk_id, score in ranked:
            document_id = self.documents[chunk_id]
            taken = per_doc.get(document_id, 0)
            if taken >= per_document or (not taken and len(per_doc) >= max_documents):
                continue
            per_doc[document_id] = taken + 1
            allowed.append((chunk_id, score))
        kb_ids = id_array(kb.pk for kb in self.kbs)
        hits: list[Hit] = []
        # Fetch and validate in small batches until enough hits survive (nearly always one);
        # the transaction ends with the last batch there can be.
        for offset in range(0, len(allowed), max_hits):
            batch = allowed[offset : offset + max_hits]
            fetch = (_FETCH, {"ids": id_array(chunk_id for chunk_id, _ in batch), "kbs": kb_ids})
            last = offset + max_hits >= len(allowed)
            rows = {row[0]: row for row in fetched([fetch], last) or ()}
            hits.extend(
                Hit(*rows[chunk_id], score=round(score, 4))
                for chunk_id, score in batch
                if chunk_id in rows
            )
            self.result.stale += len(batch) - len(rows)
            if len(hits) >= max_hits:
                break
        return hits[:max_hits]
