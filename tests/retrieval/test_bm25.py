"""BM25 arithmetic of the lexical leg that needs no database: which combinations of terms
can still rank."""

from __future__ import annotations

import itertools
import math

from hypothesis import given
from hypothesis import strategies as st

from bailing_knowledge.retrieval import bm25


@given(
    bounds=st.dictionaries(
        st.sampled_from("abcdefgh"), st.floats(0.01, 5.0, allow_nan=False), min_size=1
    ),
    kth=st.floats(0.01, 12.0, allow_nan=False),
)
def test_the_combinations_cover_every_set_of_terms_that_could_rank(bounds, kth):
    """Each set of terms whose bounds reach `kth` holds a combination, and each combination
    is minimal: so reading the chunks holding one misses no chunk that could rank."""
    combinations = bm25.reaching_combinations(bounds, kth)
    terms = sorted(bounds)
    # What "reaching" means there: within the rounding margin, on the side of reading more.
    kth *= 1 - bm25.SLACK
    if max(bounds.values()) >= kth or math.fsum(bounds.values()) < kth:
        assert combinations is None
        return
    if combinations is None:  # more than MAX_COMBINATIONS: levels are read on instead
        return
    found = [set(group) for group in combinations]
    for size in range(1, len(terms) + 1):
        for subset in itertools.combinations(terms, size):
            if math.fsum(bounds[t] for t in subset) >= kth * (1 + 1e-12):
                assert any(group <= set(subset) for group in found), subset
    for group in found:
        assert math.fsum(bounds[t] for t in group) >= kth * (1 - 1e-12)
        assert all(math.fsum(bounds[t] for t in group - {t}) < kth * (1 + 1e-12) for t in group)


@given(
    k1=st.floats(0.0, 3.0, allow_nan=False),
    b=st.floats(0.0, 1.0, allow_nan=False),
    average_length=st.floats(1.0, 5000.0, allow_nan=False),
    idf=st.floats(0.01, 12.0, allow_nan=False),
)
def test_a_terms_bound_never_grows_as_its_level_falls(k1, b, average_length, idf):
    """What lets a round's planning stop at a term's first level under the floor."""
    scorer = bm25.Scorer(bm25.Bm25(k1, b), average_length, {"t": idf})
    bounds = scorer.bounds("t")
    assert all(lower <= higher for lower, higher in itertools.pairwise(bounds))
    assert bounds == [scorer.bound("t", value) for value in range(len(bounds))]
