"""The vector leg's statement: the chunks nearest the query by cosine distance, through HNSW.

`hybrid.HybridSearch` sends it (with the search's opening statements) and fuses its ranking
with the lexical legs'; visibility is in its WHERE clause, as in every leg.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from .. import constants
from ..conf import knowledge_settings
from .embedders import get_embedder
from .session import Statement
from .visibility import VISIBLE_SQL

# The nearest chunks are found by the HNSW index, which holds half-precision vectors: the
# ORDER BY is the indexed expression, `embedding::halfvec(384) <=> query::halfvec(384)`,
# written exactly so the planner can use the index. The distance returned (and compared with
# `max_distance`) is the exact one on the full-precision vectors; the outer query re-sorts
# the candidates by it.
VECTOR_INDEXED = f"""/* bk:vector */
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
"""  # noqa: S608

# Other dimensions: `{dimensions}` is written into the SQL (an int) so that an operator's
# partial index `USING hnsw ((embedding::halfvec(N)) halfvec_cosine_ops) WHERE
# embedding_dimensions = N` matches the ORDER BY expression; without one the search is exact
# (on half-precision vectors). The distance returned is, as above, the full-precision one.
VECTOR_OTHER = f"""/* bk:vector */
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
"""  # noqa: S608


@lru_cache(maxsize=8)
def _vector_format(dimensions: int) -> str:
    """The `%` format of a vector literal: one formatting call per query rather than one per
    component."""
    return "[" + ",".join(["%.7g"] * dimensions) + "]"


def vector_literal(vector: Sequence[float]) -> str:
    """pgvector's text form of `vector` (`[0.1234567,...]`), seven significant digits a
    component, as a statement binds it."""
    return _vector_format(len(vector)) % tuple(vector)


def vector_statement(query: str, embedder: str, params: dict[str, Any], limit: int) -> Statement:
    """The statement of the `limit` chunks nearest `query` as embedded by `embedder` (an
    alias; embedding may fail: `EmbedderError`), visible under `params` (the visibility's,
    for the knowledge bases searched)."""
    model = get_embedder(embedder)
    vector = model.embed_query(query)
    literal = vector_literal(vector)
    # Cosine distance is 1 - similarity: neighbours below the similarity floor are noise.
    max_distance = 1.0 - float(knowledge_settings.SEARCH_MIN_SIMILARITY)
    params = {**params, "vector": literal, "limit": limit, "max_distance": max_distance}
    if model.dimensions == constants.INDEXED_EMBEDDING_DIMENSIONS:
        return VECTOR_INDEXED, params
    return VECTOR_OTHER.format(dimensions=int(model.dimensions)), params
