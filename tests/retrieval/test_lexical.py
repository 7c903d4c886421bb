"""The BM25 lexical leg: exact scores, exact top-k without reading every match, its plan."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
from django.db import connection, transaction
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from bailing_knowledge import services
from bailing_knowledge.ingestion.documents import (
    DocumentInput,
    delete_document,
    upsert_document,
    upsert_documents,
)
from bailing_knowledge.models import Chunk, Document
from bailing_knowledge.retrieval import lexical, rounds, session, statistics
from bailing_knowledge.retrieval.lexical import (
    STREAM_ROWS,
    Bm25,
    LexicalLeg,
    exhaustive_ranking,
    lexical_ranking,
)
from bailing_knowledge.retrieval.session import configure_search
from bailing_knowledge.retrieval.visibility import Visibility

pytestmark = pytest.mark.django_db

# Word frequencies shaped like text: a few very common words, many rare ones.
VOCABULARY = [f"w{i:03d}" for i in range(300)]
WEIGHTS = [1 / (rank + 1) for rank in range(len(VOCABULARY))]


def _random_corpus(kb, documents: int, seed: int) -> None:
    rng = random.Random(seed)

    def inputs():
        for number in range(documents):
            words = rng.choices(VOCABULARY, WEIGHTS, k=rng.randint(20, 400))
            yield DocumentInput(f"d{number}.md", f"Doc {number}", " ".join(words))

    for result in upsert_documents(kb, inputs()):
        assert result.outcome == "created", result


def _random_query(rng: random.Random) -> str:
    return " ".join(rng.choices(VOCABULARY, WEIGHTS, k=rng.randint(1, 6)))


@pytest.fixture(autouse=True)
def exact_proof(settings):
    """The tests here check the exact proof (`SEARCH_LEXICAL_PRUNING` 1.0, which a test that
    sets `BAILING_KNOWLEDGE` itself must keep); stopping early is tested on its own."""
    settings.BAILING_KNOWLEDGE = {"SEARCH_LEXICAL_PRUNING": 1.0}


def test_scores_are_lucene_bm25_over_the_chunk_and_its_title(kb, settings):
    settings.BAILING_KNOWLEDGE = {"SEARCH_BM25_K1": 1.2, "SEARCH_BM25_B": 0.75}
    texts = {"a.md": "alpha alpha beta", "b.md": "beta gamma", "c.md": "gamma gamma gamma delta"}
    for key, text in texts.items():
        upsert_document(kb, key, "Zeta", text)
    # Each document is one chunk, indexed under its text and its title ("zeta").
    terms = {key: [*text.split(), "zeta"] for key, text in texts.items()}
    n = len(terms)
    average = sum(map(len, terms.values())) / n

    def bm25(key: str, query: list[str]) -> float:
        counts = Counter(terms[key])
        total = 0.0
        for term in query:
            df = sum(term in t for t in terms.values())
            if not counts[term]:
                continue
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            tf = counts[term]
            total += idf * 2.2 * tf / (tf + 1.2 * (0.25 + 0.75 * len(terms[key]) / average))
        return total

    ranking = lexical_ranking("gamma beta", [kb], Visibility(), 10)
    keys = dict(Chunk.objects.values_list("pk", "document__source_key"))
    expected = sorted(texts, key=lambda key: -bm25(key, ["gamma", "beta"]))
    assert [keys[chunk_id] for chunk_id, _ in ranking] == expected
    for chunk_id, score in ranking:
        assert score == pytest.approx(bm25(keys[chunk_id], ["gamma", "beta"]))


def test_queries_are_stemmed_like_documents(kb):
    upsert_document(kb, "run.md", "Exercise", "She runs every morning before work.")
    upsert_document(kb, "other.md", "Cooking", "Boil the pasta for ten minutes.")
    ranking = lexical_ranking("running", [kb], Visibility(), 5)
    assert len(ranking) == 1
    assert Chunk.objects.get(pk=ranking[0][0]).document.source_key == "run.md"
    assert lexical_ranking("the of and", [kb], Visibility(), 5) == []


@pytest.mark.parametrize("limit", [1, 3, 10, 40])
def test_the_top_ranks_equal_an_exhaustive_bm25(kb, limit):
    """The first `EXACT_RANKS` are proven; later ones are the best found, scored exactly."""
    _random_corpus(kb, 60, seed=7)
    rng = random.Random(limit)
    proven = min(limit, lexical.EXACT_RANKS)
    for _ in range(40):
        query = _random_query(rng)
        leg = LexicalLeg(query, [kb], Visibility(), kb.language)
        found = leg.ranking(limit)
        expected = LexicalLeg(query, [kb], Visibility(), kb.language).exhaustive(10**6)
        top = expected[:proven]
        assert [score for _, score in found[:proven]] == pytest.approx([s for _, s in top])
        assert [chunk for chunk, _ in found[:proven]] == [chunk for chunk, _ in top], query
        exact = dict(expected)
        assert min(proven, len(expected)) <= len(found) <= limit
        for chunk_id, score in found:
            assert score == pytest.approx(exact[chunk_id])


def test_every_rank_is_exact_when_all_are_proven(kb, monkeypatch):
    monkeypatch.setattr(lexical, "EXACT_RANKS", 40)
    _random_corpus(kb, 60, seed=8)
    rng = random.Random(3)
    for _ in range(20):
        query = _random_query(rng)
        found = LexicalLeg(query, [kb], Visibility(), kb.language).ranking(40)
        expected = LexicalLeg(query, [kb], Visibility(), kb.language).exhaustive(40)
        assert [chunk for chunk, _ in found] == [chunk for chunk, _ in expected], query


def test_a_common_term_is_not_read_whole(kb, monkeypatch):
    """The first ranks of a term found everywhere come without reading every match."""
    monkeypatch.setattr(rounds, "FEW", 50)  # "common" at this corpus' scale
    rng = random.Random(2)

    def inputs():
        for number in range(500):
            repeat = 12 if number % 100 == 0 else 1
            words = ["common"] * repeat + rng.choices(VOCABULARY, k=60)
            yield DocumentInput(f"d{number}.md", f"Doc {number}", " ".join(words))

    for result in upsert_documents(kb, inputs()):
        assert result.outcome == "created"
    leg = LexicalLeg("common", [kb], Visibility(), kb.language)
    found = leg.ranking(3)
    expected = LexicalLeg("common", [kb], Visibility(), kb.language).exhaustive(3)
    assert found == expected
    assert leg.chunks_read <= lexical.FIRST_ROUND < 500, leg.chunks_read


@pytest.mark.parametrize("pruning", [1.5, 3.0])
def test_pruning_stops_early_and_misses_nothing_beyond_its_factor(
    kb, settings, monkeypatch, pruning
):
    """Stopping once no unread chunk can score more than `pruning` times the 10th score: what
    is found is scored exactly, no chunk left out of the first 10 scores more than that, and
    no search reads more than the exact proof."""
    monkeypatch.setattr(rounds, "FEW", 5)  # levels read one by one at this corpus' scale
    monkeypatch.setattr(lexical, "FIRST_ROUND", 20)
    monkeypatch.setattr(lexical, "CHECKED_ROWS", 20)
    _random_corpus(kb, 150, seed=9)
    rng = random.Random(11)
    earlier = 0
    for _ in range(40):
        query = _random_query(rng)
        settings.BAILING_KNOWLEDGE = {"SEARCH_LEXICAL_PRUNING": 1.0}
        proof = LexicalLeg(query, [kb], Visibility(), kb.language)
        proof.ranking(10)
        settings.BAILING_KNOWLEDGE = {"SEARCH_LEXICAL_PRUNING": pruning}
        leg = LexicalLeg(query, [kb], Visibility(), kb.language)
        found = leg.ranking(10)
        expected = LexicalLeg(query, [kb], Visibility(), kb.language).exhaustive(10**6)
        exact = dict(expected)
        for chunk_id, score in found:
            assert score == pytest.approx(exact[chunk_id])
        assert not leg.truncated
        if len(found) < 10:  # no 10th score to stop on: everything was read
            assert [c for c, _ in found] == [c for c, _ in expected[:10]], query
        else:
            limit = found[-1][1] * pruning * (1 + 1e-9)
            kept = {chunk_id for chunk_id, _ in found}
            assert all(score <= limit for c, score in expected if c not in kept), query
        assert leg.chunks_read <= proof.chunks_read, query
        earlier += leg.chunks_read < proof.chunks_read
    assert earlier >= 5, earlier


def test_the_read_budget_bounds_the_work_and_keeps_the_best_found(kb, settings):
    _random_corpus(kb, 80, seed=4)
    query = " ".join(VOCABULARY[:6])
    unbounded = LexicalLeg(query, [kb], Visibility(), kb.language)
    unbounded.ranking(10)
    assert unbounded.chunks_read > 15 and not unbounded.truncated
    settings.BAILING_KNOWLEDGE = {"SEARCH_LEXICAL_PRUNING": 1.0, "SEARCH_LEXICAL_READ_BUDGET": 15}
    leg = LexicalLeg(query, [kb], Visibility(), kb.language)
    found = leg.ranking(10)
    assert leg.truncated
    assert leg.chunks_read <= 15
    assert len(found) == 10
    # What it found is scored exactly, as the exhaustive BM25 scores it.
    exact = dict(LexicalLeg(query, [kb], Visibility(), kb.language).exhaustive(10**6))
    for chunk_id, score in found:
        assert score == pytest.approx(exact[chunk_id])


def test_other_bm25_parameters_keep_the_top_k_exact(kb):
    """Levels are ordered with fixed reference constants; other k1 and b stay exact."""
    _random_corpus(kb, 40, seed=11)
    rng = random.Random(5)
    for k1, b in [(0.9, 0.4), (2.0, 1.0), (0.5, 0.0)]:
        for _ in range(10):
            query = _random_query(rng)
            bm25 = Bm25(k1, b)
            found = LexicalLeg(query, [kb], Visibility(), kb.language, bm25).ranking(10)
            expected = LexicalLeg(query, [kb], Visibility(), kb.language, bm25).exhaustive(10)
            assert [c for c, _ in found] == [c for c, _ in expected], (k1, b, query)


def _hide_staff(how: str) -> Visibility:
    """Hide the `staff-*` documents from the returned principal: by audience, or as the
    search sees a document that is not ready, or one whose chunks are of an older revision."""
    staff = Document.objects.filter(source_key__startswith="staff-")
    if how == "audience":
        return Visibility(audience="customer")
    if how == "not-ready":
        staff.update(status="failed")
    else:
        staff.update(revision=F("revision") + 1)
    return Visibility()


@pytest.mark.parametrize("how", ["audience", "not-ready", "stale-revision"])
@pytest.mark.parametrize(
    ("checked_rows", "checked_apart"),
    [(200, False), (0, True)],
    ids=["rows-checked-by-the-round", "leaders-checked-apart"],
)
def test_hidden_chunks_never_count_towards_the_proven_ranks(
    kb, monkeypatch, how, checked_rows, checked_apart
):
    """Many hidden chunks that would outrank every visible one: the visible top still comes
    out, exactly, and no hidden chunk is returned, whether the round checks its rows'
    documents itself (no statement of its own) or a statement of its own checks the
    leaders'."""
    monkeypatch.setattr(lexical, "EXACT_RANKS", 3)
    monkeypatch.setattr(lexical, "CHECKED_ROWS", checked_rows)
    for number in range(30):
        upsert_document(
            kb, f"staff-{number}.md", "Staff", "refund " * 20, metadata={"audiences": ["staff"]}
        )
    for number in range(5):
        upsert_document(kb, f"public-{number}.md", "Public", "refund policy " * (number + 1))
    keys = dict(Chunk.objects.values_list("pk", "document__source_key"))
    visibility = _hide_staff(how)
    with CaptureQueriesContext(connection) as queries:
        leg = LexicalLeg("refund", [kb], visibility, kb.language)
        found = leg.ranking(3)
    expected = LexicalLeg("refund", [kb], visibility, kb.language).exhaustive(3)
    assert found == expected
    assert len(found) == 3
    assert all(keys[chunk_id].startswith("public-") for chunk_id, _ in found)
    assert leg.rounds == 1
    assert leg.chunks_read == len(keys)  # the hidden ones too: none is read twice
    marker = rounds.VISIBLE.split("WHERE")[0].strip()
    assert any(marker in query["sql"] for query in queries.captured_queries) is checked_apart


@pytest.mark.parametrize(
    "checked_rows", [200, 0], ids=["rows-checked-by-the-round", "leaders-checked-apart"]
)
def test_hidden_chunks_do_not_spend_the_read_budget(kb, monkeypatch, settings, checked_rows):
    """More hidden chunks than the read budget, each outscoring the one visible match: the
    visible one is still found, and the search ends proven, not cut short. Reading hidden
    chunks costs rounds (at most `MAX_ROUNDS`), not the budget the visible ones are read by;
    a check that meets hidden leaders checks the next ones in growing batches."""
    monkeypatch.setattr(lexical, "CHECKED_ROWS", checked_rows)
    settings.BAILING_KNOWLEDGE = {"SEARCH_LEXICAL_PRUNING": 1.0, "SEARCH_LEXICAL_READ_BUDGET": 20}
    for number in range(90):
        upsert_document(
            kb, f"staff-{number}.md", "Staff", "refund " * 20, metadata={"audiences": ["staff"]}
        )
    upsert_document(kb, "public.md", "Public", "refund policy and a few other words " * 3)
    keys = dict(Chunk.objects.values_list("pk", "document__source_key"))
    visibility = Visibility(audience="customer")
    with CaptureQueriesContext(connection) as queries:
        leg = LexicalLeg("refund", [kb], visibility, kb.language)
        found = leg.ranking(3)
    assert [keys[chunk_id] for chunk_id, _ in found] == ["public.md"]
    assert found == LexicalLeg("refund", [kb], visibility, kb.language).exhaustive(3)
    assert not leg.truncated
    checks = [
        q for q in queries.captured_queries if rounds.VISIBLE.split("WHERE")[0].strip() in q["sql"]
    ]
    assert len(checks) <= 8, len(checks)  # 90 hidden leaders, 3 at a time, would take 30


@pytest.mark.parametrize("how", ["audience", "not-ready", "stale-revision"])
def test_a_deferred_check_leaves_every_ranked_chunk_to_the_callers_check(kb, monkeypatch, how):
    """With its checks deferred, the leg looks no document up, in its rounds or apart, and
    hands the caller a check of every chunk it ranked, which hidden leaders fail."""
    monkeypatch.setattr(lexical, "EXACT_RANKS", 3)
    for number in range(30):
        upsert_document(
            kb, f"staff-{number}.md", "Staff", "refund " * 20, metadata={"audiences": ["staff"]}
        )
    for number in range(5):
        upsert_document(kb, f"public-{number}.md", "Public", "refund policy " * (number + 1))
    visibility = _hide_staff(how)
    with CaptureQueriesContext(connection) as queries:
        leg = LexicalLeg("refund", [kb], visibility, kb.language)
        leg.deferred = True
        found = leg.ranking(3)
    marker = rounds.VISIBLE.split("WHERE")[0].strip()
    assert not any(marker in query["sql"] for query in queries.captured_queries)
    assert {chunk_id for chunk_id, _ in found} <= leg.unverified
    sql, params = leg.verification()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        assert not leg.verified(cursor.fetchall())


@pytest.mark.parametrize("seed", [3, 4])
def test_a_deferred_check_that_passes_gives_the_checked_ranking(kb, seed):
    """Every leader visible, a leg that deferred its checks ranks as one that checked as it
    read: each of its decisions saw the same leaders."""
    _random_corpus(kb, 60, seed)
    rng = random.Random(seed)
    for _ in range(12):
        query = _random_query(rng)
        checked = LexicalLeg(query, [kb], Visibility(), kb.language).ranking(10)
        leg = LexicalLeg(query, [kb], Visibility(), kb.language)
        leg.deferred = True
        deferred = leg.ranking(10)
        assert deferred == checked, query
        statement = leg.verification()  # None when the closing round checked them all
        if statement is not None:
            with connection.cursor() as cursor:
                cursor.execute(*statement)
                assert leg.verified(cursor.fetchall())


@pytest.mark.parametrize("pruning", [1.0, 1.5])
def test_a_deferred_leg_leaves_out_the_counts_of_chunks_that_cannot_rank(
    kb, monkeypatch, settings, pruning
):
    """After its first round, a leg whose checks are deferred reads term counts only for the
    chunks whose bound reaches its last leader's score, and ranks every query as a leg that
    reads them all (one that checks as it reads): the others could never have ranked."""
    settings.BAILING_KNOWLEDGE = {"SEARCH_LEXICAL_PRUNING": pruning}
    # Small rounds, so that most queries read several, and levels, not closing rounds.
    monkeypatch.setattr(lexical, "FIRST_ROUND", 8)
    monkeypatch.setattr(lexical, "GROWTH", 2)
    monkeypatch.setattr(lexical, "COMBINED_POSTINGS", 0)
    _random_corpus(kb, 120, seed=5)
    rng = random.Random(11)
    unscored = 0
    for _ in range(30):
        query = " ".join(rng.sample(VOCABULARY[:40], k=rng.randint(2, 5)))
        for limit in (10, 40):
            checked = LexicalLeg(query, [kb], Visibility(), kb.language)
            expected = checked.ranking(limit)
            leg = LexicalLeg(query, [kb], Visibility(), kb.language)
            leg.deferred = True
            assert leg.ranking(limit) == expected, query
            assert leg.chunks_read == checked.chunks_read
            assert checked.unscored == 0
            unscored += leg.unscored
    assert unscored > 100, unscored  # the path under test was taken


def test_hidden_documents_take_no_slot(kb):
    upsert_document(kb, "public.md", "Public", "refund refund policy")
    upsert_document(
        kb, "staff.md", "Staff", "refund refund refund refund", metadata={"audiences": ["staff"]}
    )
    keys = dict(Chunk.objects.values_list("pk", "document__source_key"))
    customer = lexical_ranking("refund", [kb], Visibility(audience="customer"), 1)
    staff = lexical_ranking("refund", [kb], Visibility(audience="staff"), 1)
    assert [keys[c] for c, _ in customer] == ["public.md"]
    assert [keys[c] for c, _ in staff] == ["staff.md"]


def test_kbs_of_other_languages_are_searched_in_their_own_language(kb):
    german = services.create_knowledge_base("german", language="german")
    upsert_document(german, "haus.md", "Haus", "Die Häuser sind groß.")
    upsert_document(kb, "house.md", "House", "The houses are big.")
    keys = dict(Chunk.objects.values_list("pk", "document__source_key"))
    assert [keys[c] for c, _ in lexical_ranking("haus", [kb, german], Visibility(), 5)] == [
        "haus.md"
    ]
    assert [keys[c] for c, _ in lexical_ranking("house", [kb, german], Visibility(), 5)] == [
        "house.md"
    ]
    for query in ("haus", "house", "groß big"):
        expected = exhaustive_ranking(query, [kb, german], Visibility(), 5)
        assert lexical_ranking(query, [kb, german], Visibility(), 5) == expected


@pytest.mark.parametrize("check", [False, True], ids=["leaders-checked-apart", "rows-checked"])
def test_a_round_is_served_by_an_index(kb, check):
    """The GIN index, or the KB btree when the KB is small; which one is the planner's call
    (the benchmark checks the GIN index at 100k chunks). A round that checks its rows'
    documents looks each one up by its key."""
    _random_corpus(kb, 30, seed=1)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(
            "EXPLAIN " + rounds.ROUND,
            {
                **Visibility().params([kb.pk]),
                "terms": ["w000"],
                "wanted": ["'w000|90'", "'w000|89'"],
                "seen": [],
                "budget": 100,
                "check": check,
            },
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Seq Scan" not in plan, plan
    assert "Index Scan" in plan, plan
    assert ("bailing_knowledge_document_pkey" in plan) is check, plan


@pytest.mark.parametrize(
    ("audience", "postings"),
    [("", 10_000), ("customer", 10_000), ("", 0)],
    ids=["closing-round", "hidden-documents", "lists-too-long"],
)
def test_a_closing_round_over_term_combinations_keeps_the_top_k_exact(
    kb, monkeypatch, audience, postings
):
    """Once no single term can reach the proven ranks, the chunks holding a combination of
    terms that still can are read in one round; the ranks stay those of an exhaustive BM25,
    with documents hidden from the caller among them, and when the posting lists are too
    long for the round and levels are read on instead."""
    monkeypatch.setattr(lexical, "FIRST_ROUND", 8)
    monkeypatch.setattr(rounds, "FEW", 5)
    monkeypatch.setattr(lexical, "COMBINED_POSTINGS", postings)
    _random_corpus(kb, 120, seed=21)
    # A third of the documents only staff may see.
    staff_only = list(Document.objects.order_by("pk").values_list("pk", flat=True))[::3]
    Document.objects.filter(pk__in=staff_only).update(metadata={"audiences": ["staff"]})
    visibility = Visibility(audience=audience)
    rng = random.Random(9)
    combined = 0
    for _ in range(40):
        query = " ".join(rng.sample(VOCABULARY[:40], k=rng.randint(2, 5)))
        leg = LexicalLeg(query, [kb], visibility, kb.language)
        found = leg.ranking(10)
        expected = LexicalLeg(query, [kb], visibility, kb.language).exhaustive(10)
        assert [c for c, _ in found] == [c for c, _ in expected], query
        assert not leg.truncated
        combined += leg.combined
    if postings:
        assert combined >= 10, combined  # the path under test was taken
    else:
        assert combined == 0


def test_the_closing_round_counts_the_postings_of_every_knowledge_base(kb, monkeypatch):
    """The GIN index lists the chunks of every knowledge base: a term common in another one
    makes its lists too long for the round, however rare it is in the one searched."""
    monkeypatch.setattr(lexical, "FIRST_ROUND", 8)
    monkeypatch.setattr(rounds, "FEW", 5)
    _random_corpus(kb, 120, seed=21)
    queries = [" ".join(random.Random(n).sample(VOCABULARY[:40], k=4)) for n in range(30)]

    def closing_rounds() -> int:
        legs = [LexicalLeg(q, [kb], Visibility(), kb.language) for q in queries]
        for leg in legs:
            leg.ranking(10)
        return sum(leg.combined for leg in legs)

    monkeypatch.setattr(lexical, "COMBINED_POSTINGS", 400)
    assert closing_rounds() > 0
    other = services.create_knowledge_base("archive")
    _random_corpus(other, 200, seed=5)
    assert closing_rounds() == 0


def _same(found: list[tuple[int, float]], expected: list[tuple[int, float]]) -> bool:
    return [c for c, _ in found] == [c for c, _ in expected] and [
        s for _, s in found
    ] == pytest.approx([s for _, s in expected])


def _opened_ranking(leg: LexicalLeg, limit: int) -> tuple[int, list[tuple[int, float]]]:
    """The leg as a search runs it: its opening statements sent together, each answer handed
    to it as it arrives, then the rounds left. (How many statements opened it, the ranking.)"""
    opened, ranking, _ = _opened_ranking_counted(leg, limit)
    return opened, ranking


def _opened_ranking_counted(
    leg: LexicalLeg, limit: int
) -> tuple[int, list[tuple[int, float]], int]:
    """`_opened_ranking`, and how many statements the ranking ran after its opening ones."""
    ran: list[str] = []

    def count(execute, sql, params, many, context):
        ran.append(sql)
        return execute(sql, params, many, context)

    tx = session.SearchTransaction(batches=True, own=False)
    with transaction.atomic(), connection.cursor() as cursor:
        configure_search(cursor)
        opening = leg.opening(limit)
        tx.run(cursor, opening, arrived=leg.opened, part=leg.opened_part, batch=STREAM_ROWS)
        with connection.execute_wrapper(count):
            ranking = leg.ranking(limit, cursor)
        return len(opening), ranking, len(ran)


def test_a_first_round_planned_from_what_earlier_searches_read_finds_the_same(kb):
    _random_corpus(kb, 60, seed=9)
    rng = random.Random(5)
    for _ in range(30):
        query = _random_query(rng)
        expected = LexicalLeg(query, [kb], Visibility(), kb.language).exhaustive(10)
        statistics.forget()
        leg = LexicalLeg(query, [kb], Visibility(), kb.language)
        statements, found, after = _opened_ranking_counted(leg, 10)
        assert statements == 1 and _same(found, expected), query
        # Read once, remembered: the next search sends its first round with its statistics,
        # and runs one statement fewer after them, for the same rounds.
        again = LexicalLeg(query, [kb], Visibility(), kb.language)
        statements, found, after_early = _opened_ranking_counted(again, 10)
        assert statements == 2 and after_early == after - 1 and again.rounds == leg.rounds
        assert _same(found, expected), query


@pytest.mark.parametrize(
    "change", ["a term's top level rose", "a term appeared", "a term is gone", "all changed"]
)
def test_a_first_round_planned_from_outdated_statistics_finds_the_same(kb, monkeypatch, change):
    """What the process remembers only plans the first round: a term whose highest level
    is now above where the plan began is read again from the top; the ranking is the one
    the search's own statistics give."""
    monkeypatch.setattr(rounds, "FEW", 0)  # every term read level by level
    for number in range(24):
        upsert_document(kb, f"other-{number}.md", "Notes", " ".join(VOCABULARY[number::7]))
    for number in range(8):
        filler = " ".join(VOCABULARY[: 40 + number])
        upsert_document(kb, f"long-{number}.md", "Notes", f"{filler} alpha beta {filler}")
    upsert_document(kb, "gamma.md", "Notes", "gamma appears here with beta")
    query = "alpha beta gamma delta"  # delta is in no chunk yet
    statistics.forget()
    LexicalLeg(query, [kb], Visibility(), kb.language).ranking(10)  # remembered
    if change in ("a term's top level rose", "all changed"):
        upsert_document(kb, "short.md", "Alpha", "alpha alpha alpha")
    if change in ("a term appeared", "all changed"):
        upsert_document(kb, "new.md", "Notes", "delta beside alpha")
    if change in ("a term is gone", "all changed"):
        delete_document(kb, "gamma.md")
    leg = LexicalLeg(query, [kb], Visibility(), kb.language)
    statements, found = _opened_ranking(leg, 10)
    expected = LexicalLeg(query, [kb], Visibility(), kb.language).exhaustive(10)
    assert statements == 2
    assert _same(found, expected)
    if "rose" in change or change == "all changed":
        keys = dict(Chunk.objects.values_list("pk", "document__source_key"))
        assert "short.md" in [keys[chunk_id] for chunk_id, _ in found[:3]]
