"""Hybrid retrieval in SQL: pgvector cosine over HNSW and BM25 lexical search, fused by rank.

Visibility is part of every leg's WHERE clause — KB in the route's scope and enabled, KB
tenant binding, the document ready at the chunk's revision, per-document audience and role
restrictions — so a hidden document never takes a candidate slot, a rank or a score.

The lexical leg (`lexical.LexicalLeg`, one per language of the KBs searched) finds the exact
BM25 top-k without scoring every matching chunk; the vector leg runs once per embedder.
Each leg runs under a statement timeout; a leg that times out aborts the transaction, and the
legs left run in a new one, so a slow or failing leg degrades the answer to `partial`
instead of failing it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg.errors
from django.db import DatabaseError, connection, transaction

from .. import constants
from ..conf import knowledge_settings
from ..models import KnowledgeBase
from .embedders import EmbedderError, get_embedder
from .lexical import LexicalLeg
from .session import configure_search, search_transaction
from .visibility import (
    VISIBLE_SQL,
    Visibility,
    group_knowledge_bases,
    searchable_knowledge_bases,
)

__all__ = ["Hit", "HybridSearch", "SearchResult", "Visibility", "searchable_knowledge_bases"]

logger = logging.getLogger("bailing_knowledge")

# Measured on NFCorpus and CMRC 2018 (docs/performance.md): 10 beats the customary 60 on both.
RRF_K = 10

# The nearest chunks are found by the HNSW index, which holds half-precision vectors: the
# ORDER BY is the indexed expression, `embedding::halfvec(384) <=> query::halfvec(384)`,
# written exactly so the planner can use the index. The distance returned (and compared with
# `max_distance`) is the exact one on the full-precision vectors; the outer query re-sorts
# the candidates by it.
_VECTOR_INDEXED = f"""/* bk:vector */
WITH nearest AS MATERIALIZED (
    SELECT c.id, c.document_id,
           c.embedding::vector({constants.INDEXED_EMBEDDING_DIMENSIONS})
             <=> %(vector)s::vector({constants.INDEXED_EMBEDDING_DIMENSIONS}) AS distance
    FROM bailing_knowledge_chunk c, bailing_knowledge_document d
    WHERE c.embedding_dimensions = {constants.INDEXED_EMBEDDING_DIMENSIONS} AND {VISIBLE_SQL}
    ORDER BY c.embedding::halfvec({constants.INDEXED_EMBEDDING_DIMENSIONS})
             <=> %(vector)s::halfvec({constants.INDEXED_EMBEDDING_DIMENSIONS})
    LIMIT %(limit)s
)
SELECT id, distance, document_id FROM nearest WHERE distance <= %(max_distance)s
ORDER BY distance, id
"""

# Other dimensions: `{dimensions}` is written into the SQL (an int) so that an operator's
# partial index `USING hnsw ((embedding::halfvec(N)) halfvec_cosine_ops) WHERE
# embedding_dimensions = N` matches the ORDER BY expression; without one the search is exact
# (on half-precision vectors). The distance returned is, as above, the full-precision one.
_VECTOR_OTHER = f"""/* bk:vector */
WITH nearest AS MATERIALIZED (
    SELECT c.id, c.document_id,
           c.embedding::vector({{dimensions}}) <=> %(vector)s::vector({{dimensions}}) AS distance
    FROM bailing_knowledge_chunk c, bailing_knowledge_document d
    WHERE c.embedding_dimensions = {{dimensions}} AND {VISIBLE_SQL}
    ORDER BY c.embedding::halfvec({{dimensions}}) <=> %(vector)s::halfvec({{dimensions}})
    LIMIT %(limit)s
)
SELECT id, distance, document_id FROM nearest WHERE distance <= %(max_distance)s
ORDER BY distance, id
"""

# The hits that will be returned, checked against the document as it is now: ready, at the
# chunk's revision, in scope, and the chunk's text still the body's at its offsets
# (PostgreSQL's substr counts characters, as Python does). Stale chunks are not returned.
_FETCH = """/* bk:fetch */
SELECT c.id, c.document_id, c.knowledge_base_id, c.revision, c."start", c."end", c."text",
       d.title, d.content_hash
FROM bailing_knowledge_chunk c
JOIN bailing_knowledge_document d ON d.id = c.document_id
WHERE c.id = ANY(%(ids)s)
  AND d.status = 'ready' AND c.revision = d.revision
  AND d.knowledge_base_id = ANY(%(kbs)s)
  AND substr(d.body, c."start" + 1, c."end" - c."start") = c."text"
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


class _LegTimedOut(Exception):
    """A leg's statement timed out: its transaction can run nothing more."""


def _is_timeout(exc: DatabaseError) -> bool:
    return isinstance(exc.__cause__, psycopg.errors.QueryCanceled)


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
        and chunks of at most `max_documents` documents."""
        if not self.kbs:
            return self.result
        legs: list[tuple[Callable[..., list[int]], tuple[Any, ...], float]] = []
        if self.use_lexical:
            for language, group in group_knowledge_bases(self.kbs, "language"):
                legs.append((self._lexical, (group, language), 1.0))
        if self.use_vector:
            for embedder_alias, group in group_knowledge_bases(self.kbs, "embedder"):
                args = ([kb.pk for kb in group], embedder_alias)
                legs.append((self._vector, args, fusion_weight(embedder_alias)))
        rankings: list[tuple[float, list[int]]] = []
        while True:
            with search_transaction():
                with connection.cursor() as cursor:
                    configure_search(cursor)
                while legs:
                    leg, args, weight = legs.pop(0)
                    try:
                        ranking = self._leg(leg, *args)
                    except _LegTimedOut:
                        # The transaction is aborted: the legs left run in a new one.
                        transaction.set_rollback(True)
                        break
                    if ranking is not None:
                        rankings.append((weight, ranking))
                else:
                    scores = self._fuse(rankings)
                    self.result.hits = self._select(
                        scores, max_hits, min_score, per_document, max_documents or max_hits
                    )
                    return self.result

    def _leg(self, leg, *args) -> list[int] | None:  # type: ignore[no-untyped-def]
        """Run one leg; an embedder failure marks it failed, and so does a timeout, which
        also aborts the transaction (`_LegTimedOut`).

        No savepoint per leg: a timeout is rare and costs a new transaction, where two
        savepoints cost four round trips on every search."""
        try:
            ranking = leg(*args)
        except EmbedderError:
            logger.warning("Embedder failed; searching lexically only", exc_info=True)
            self.result.legs_failed += 1
            return None
        except DatabaseError as exc:
            if not _is_timeout(exc):
                raise
            logger.warning("A search leg timed out")
            self.result.legs_failed += 1
            raise _LegTimedOut from exc
        self.result.legs_ok += 1
        return ranking

    def _lexical(self, kbs: list[KnowledgeBase], language: str) -> list[int]:
        leg = LexicalLeg(self.query, kbs, self.visibility, language)
        with connection.cursor() as cursor:
            ranking = [chunk_id for chunk_id, _ in leg.ranking(self.candidates, cursor)]
        self.documents.update((chunk_id, leg.documents[chunk_id]) for chunk_id in ranking)
        return ranking

    def _vector(self, kb_ids: list[int], embedder_alias: str) -> list[int]:
        embedder = get_embedder(embedder_alias)
        vector = embedder.embed_query(self.query)
        literal = "[" + ",".join(f"{x:.7g}" for x in vector) + "]"
        # Cosine distance is 1 - similarity: neighbours below the similarity floor are noise.
        max_distance = 1.0 - float(knowledge_settings.SEARCH_MIN_SIMILARITY)
        params = {
            **self.visibility.params(kb_ids),
            "vector": literal,
            "limit": self.candidates,
            "max_distance": max_distance,
        }
        if embedder.dimensions == constants.INDEXED_EMBEDDING_DIMENSIONS:
            sql = _VECTOR_INDEXED
        else:
            sql = _VECTOR_OTHER.format(dimensions=int(embedder.dimensions))
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
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
        scores: dict[int, float],
        max_hits: int,
        min_score: float,
        per_document: int,
        max_documents: int,
    ) -> list[Hit]:
        """The best chunks within the per-document and document limits, above `min_score`,
        each validated against the current body."""
        ranked = sorted(
            (item for item in scores.items() if item[1] >= min_score),
            key=lambda item: (-item[1], item[0]),
        )
        if not ranked or max_hits <= 0:
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
        kb_ids = [kb.pk for kb in self.kbs]
        hits: list[Hit] = []
        # Fetch and validate in small batches until enough hits survive (nearly always one).
        for offset in range(0, len(allowed), max_hits):
            batch = allowed[offset : offset + max_hits]
            with connection.cursor() as cursor:
                cursor.execute(_FETCH, {"ids": [chunk_id for chunk_id, _ in batch], "kbs": kb_ids})
                rows = {row[0]: row for row in cursor.fetchall()}
            hits.extend(
                Hit(*rows[chunk_id], score=round(score, 4))
                for chunk_id, score in batch
                if chunk_id in rows
            )
            self.result.stale += len(batch) - len(rows)
            if len(hits) >= max_hits:
                break
        return hits[:max_hits]
