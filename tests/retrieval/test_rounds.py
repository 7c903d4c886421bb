"""The statements of the lexical leg's rounds: which levels a round asks for, and how its
parameters reach PostgreSQL."""

from __future__ import annotations

import pytest
from django.db import connection
from hypothesis import given
from hypothesis import strategies as st

from bailing_knowledge.ingestion.documents import upsert_document
from bailing_knowledge.models import Chunk
from bailing_knowledge.retrieval import rounds, statistics
from bailing_knowledge.retrieval.arrays import id_array
from bailing_knowledge.retrieval.bm25 import Bm25, Scorer
from bailing_knowledge.retrieval.visibility import Visibility

pytestmark = pytest.mark.django_db


@given(st.lists(st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]))))
def test_array_literals_round_trip_through_postgresql(items):
    """The lexemes a round asks for go to PostgreSQL as one `text[]` literal, whatever
    quotes, backslashes, braces or commas the terms hold."""
    wanted = [(1.0, term, 7) for term in items]
    literal = rounds.round_params({}, wanted, id_array(), 10, False)["wanted"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::text[]", [literal])
        assert cursor.fetchone()[0] == [rounds.level_query(term, 7) for term in items]


@given(
    tops=st.lists(st.integers(-2, 99), min_size=1, max_size=6),
    dfs=st.lists(st.integers(1, 3 * rounds.FEW), min_size=6, max_size=6),
    floor=st.floats(0.0, 4.0, allow_nan=False),
    limit=st.sampled_from([0, 1, 7, rounds.FIRST_LEXEMES, rounds.ROUND_LEXEMES]),
)
def test_a_round_wants_every_level_over_the_floor_heaviest_first(tops, dfs, floor, limit):
    """The levels a round asks for, against their definition: every unread level whose bound
    reaches the floor (a term of few chunks: one lookup for all of them), heaviest first,
    ties in the order of the terms and then of the levels, the `limit` first of them."""
    terms = [f"t{index}" for index in range(len(tops))]
    idf = {term: 0.5 + index for index, term in enumerate(terms)}
    scorer = Scorer(Bm25(1.2, 0.75), 120.0, idf)
    stats = statistics.Statistics(
        chunks=10_000,
        average_length=120.0,
        df=dict(zip(terms, dfs, strict=False)),
        top=dict(zip(terms, tops, strict=False)),
    )
    frontier = dict(zip(terms, tops, strict=True))
    expected = sorted(
        (
            (scorer.bound(term, value), term, -1 if stats.df[term] <= rounds.FEW else value)
            for term in terms
            for value in range(frontier[term], -1, -1)
            if scorer.bound(term, value) >= floor
            and (stats.df[term] > rounds.FEW or value == frontier[term])
        ),
        key=lambda item: -item[0],
    )
    assert rounds.levels_wanted(scorer, stats, frontier, floor) == expected[: rounds.ROUND_LEXEMES]
    assert rounds.levels_wanted(scorer, stats, frontier, floor, limit) == expected[:limit]


def test_a_gated_round_counts_terms_only_where_the_bound_reaches_the_gate(kb):
    """A round's bound for a chunk is the level it was found at plus the reach of every
    other query term the chunk holds; below the gate its counts are left out (NULL), at or
    above it they are those an ungated round returns."""
    texts = {"a": "alpha beta", "b": "alpha", "c": "alpha gamma", "d": "beta gamma"}
    for key, text in texts.items():
        upsert_document(kb, f"{key}.md", "Doc", text)
    params = {**Visibility().params([kb.pk]), "terms": ["alpha", "beta"]}
    wanted = [(1.0, "alpha", -1)]  # every level of "alpha", bound 1.0
    reach = {"alpha": 1.0, "beta": 2.0}

    def counts(gate: float) -> dict[str, str | None]:
        sql, values = rounds.round_statement(params, wanted, id_array(), 10, False, reach, gate)
        assert (sql == rounds.ROUND) is (gate == 0)
        with connection.cursor() as cursor:
            cursor.execute(sql, values)
            rows = cursor.fetchall()
        keys = dict(Chunk.objects.values_list("pk", "document__source_key"))
        return {keys[row[0]][0]: row[2] for row in rows}

    every = counts(0.0)
    assert set(every) == {"a", "b", "c"}  # the chunks holding "alpha"
    assert all(every.values())
    # "a" holds beta: 1.0 + 2.0 reaches 3.0; "b" and "c" only reach 1.0.
    assert counts(3.0) == {"a": every["a"], "b": None, "c": None}
    assert counts(1.0) == every
    assert counts(3.0 + 1e-6) == {"a": None, "b": None, "c": None}
