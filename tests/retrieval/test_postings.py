"""The lexical index's entries: levels that order a term's postings, and the encoded
columns PostgreSQL reads back."""

from __future__ import annotations

import pytest
from django.db import connection
from hypothesis import given
from hypothesis import strategies as st

from bailing_knowledge.retrieval.analysis import document_terms
from bailing_knowledge.retrieval.postings import LEVELS, MAX_TF, encode_terms, level


def test_levels_rise_with_frequency_and_fall_with_length():
    assert level(2, 100) > level(1, 100)
    assert level(1, 50) > level(1, 400)
    assert 0 <= level(1, 10**6) <= level(256, 1) <= LEVELS - 1


@pytest.mark.django_db
def test_encoded_terms_round_trip_through_postgresql():
    terms = document_terms("Refunds: refunds are paid in 30 days — 退款政策", "english")
    encoded = encode_terms(terms)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT array_length(tsvector_to_array(%s::tsvector), 1), "
            "(SELECT sum(array_length(positions, 1)) FROM unnest(%s::tsvector))",
            [encoded.levels, encoded.terms],
        )
        distinct, total = cursor.fetchone()
    assert distinct == len(set(terms))
    assert total == encoded.length == len(terms)


@pytest.mark.django_db
def test_terms_with_quotes_and_backslashes_are_encoded_as_themselves():
    # The analysis never yields them, but the encoding must not depend on it.
    terms = ["it's", "back\\slash", "''", "plain", "plain"]
    encoded = encode_terms(terms)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT array_agg(lexeme) FROM unnest(%s::tsvector)"
            " UNION ALL SELECT array_agg(lexeme || ':' || array_length(positions, 1))"
            " FROM unnest(%s::tsvector)",
            [encoded.levels, encoded.terms],
        )
        (levels,), (counts,) = cursor.fetchall()
    assert set(levels) == {f"{t}|{level(terms.count(t), 5):02d}" for t in terms}
    assert set(counts) == {f"{t}:{terms.count(t)}" for t in terms}


@given(
    tf=st.integers(1, MAX_TF - 50),
    extra=st.integers(0, 10**6),
    more=st.integers(1, 50),
)
def test_a_level_never_falls_as_a_term_grows_denser(tf, extra, more):
    """More occurrences of the term (the chunk growing with them), or the same in a shorter
    chunk, never lower its level: the leg's bounds read levels from the top on that promise."""
    length = tf + extra  # a chunk holds at least its term's occurrences
    assert 0 <= level(tf, length) <= LEVELS - 1
    assert level(tf, length + more) <= level(tf, length)
    assert level(tf + more, length + more) >= level(tf, length)
