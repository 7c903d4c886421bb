"""What a process remembers of term statistics to plan a search's first round."""

from __future__ import annotations

import pytest

from bailing_knowledge.retrieval import statistics
from bailing_knowledge.retrieval.statistics import Statistics, forget, recall, remember


@pytest.fixture(autouse=True)
def afresh():
    forget()
    yield
    forget()


def _stats(**df_top: tuple[int, int]) -> Statistics:
    return Statistics(
        chunks=100,
        average_length=42.5,
        df={term: df for term, (df, _) in df_top.items()},
        top={term: top for term, (_, top) in df_top.items()},
    )


def test_what_was_read_of_every_term_is_recalled_absent_terms_included():
    remember([1, 2], ["refund", "parcel", "zzz"], _stats(refund=(7, 80), parcel=(3, 60)))
    assert recall([1, 2], ["parcel", "zzz"]) == Statistics(
        chunks=100, average_length=42.5, df={"parcel": 3}, top={"parcel": 60}
    )


def test_nothing_is_recalled_for_a_term_never_read_or_other_knowledge_bases():
    remember([1, 2], ["refund"], _stats(refund=(7, 80)))
    assert recall([1, 2], ["refund", "parcel"]) is None
    assert recall([1], ["refund"]) is None
    assert recall([2, 1], ["refund"]) is not None  # a set of knowledge bases, in any order


def test_a_later_read_replaces_an_earlier_one():
    remember([1], ["refund"], _stats(refund=(7, 80)))
    remember([1], ["refund"], _stats(refund=(9, 85)))
    assert recall([1], ["refund"]).top == {"refund": 85}


def test_past_its_size_the_process_starts_afresh(monkeypatch):
    monkeypatch.setattr(statistics, "REMEMBERED", 4)
    remember([1], ["a", "b"], _stats(a=(1, 1), b=(1, 1)))  # 3 entries with the totals
    remember([2], ["c"], _stats(c=(1, 1)))  # 5: over, but the check comes first
    remember([3], ["d"], _stats(d=(1, 1)))  # starts afresh
    assert recall([1], ["a"]) is None and recall([3], ["d"]) is not None
