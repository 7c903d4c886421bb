"""The vector leg's statement: which SQL an embedder's size gets, and what it is sent with."""

from __future__ import annotations

import pytest

from bailing_knowledge import constants
from bailing_knowledge.retrieval.embedders import get_embedder
from bailing_knowledge.retrieval.vector import VECTOR_INDEXED, VECTOR_OTHER, vector_statement

HASHING = "bailing_knowledge.retrieval.embedders.HashingEmbedder"


@pytest.fixture
def embedders(settings):
    settings.BAILING_KNOWLEDGE = {
        "EMBEDDERS": {
            "default": {"BACKEND": HASHING},
            "small": {"BACKEND": HASHING, "OPTIONS": {"DIMENSIONS": 64}},
        },
        "SEARCH_MIN_SIMILARITY": 0.25,
    }


@pytest.mark.parametrize(("alias", "dimensions"), [("default", 384), ("small", 64)])
def test_the_statement_fits_the_embedders_size(embedders, alias, dimensions):
    """The shipped index's size gets its statement; another size has its own written in, so
    that an operator's partial index on that size can match it."""
    visibility = {"kbs": [7], "audience": "staff", "roles": ["a"]}
    sql, params = vector_statement("refund for a broken charger", alias, visibility, 40)
    if dimensions == constants.INDEXED_EMBEDDING_DIMENSIONS:
        assert sql == VECTOR_INDEXED
    else:
        assert sql == VECTOR_OTHER.format(dimensions=dimensions)
        assert f"halfvec({dimensions})" in sql and "{dimensions}" not in sql
    assert params["limit"] == 40
    assert params["max_distance"] == pytest.approx(0.75)  # 1 - the similarity floor
    assert {key: params[key] for key in visibility} == visibility
    # The query's embedding, to seven significant digits.
    sent = [float(x) for x in params["vector"][1:-1].split(",")]
    expected = get_embedder(alias).embed_query("refund for a broken charger")
    assert len(sent) == dimensions
    assert sent == pytest.approx(expected, rel=1e-6, abs=1e-12)
