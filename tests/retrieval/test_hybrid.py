"""Query plans and filtering behaviour of the hybrid search SQL."""

from __future__ import annotations

import math
import random
import re
import threading
import time

import pytest
from django.db import connection, transaction

from bailing_knowledge import constants, services
from bailing_knowledge.ingestion.documents import upsert_document
from bailing_knowledge.models import Chunk
from bailing_knowledge.retrieval import hybrid, rounds
from bailing_knowledge.retrieval.embedders import get_embedder
from bailing_knowledge.retrieval.hybrid import HybridSearch, Visibility
from bailing_knowledge.retrieval.vector import VECTOR_INDEXED, VECTOR_OTHER
from tests.hnsw import rebuild_vector_index

pytestmark = pytest.mark.django_db

WORDS = [
    "refund",
    "shipping",
    "warranty",
    "invoice",
    "parcel",
    "battery",
    "screen",
    "charger",
    "discount",
    "voucher",
    "account",
    "password",
    "delivery",
    "return",
    "exchange",
    "repair",
    "address",
    "payment",
    "order",
    "customer",
]


def _corpus(kb, documents: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    for i in range(documents):
        text = " ".join(rng.choice(WORDS) for _ in range(60))
        upsert_document(kb, f"doc-{i}.md", f"Document {i}", f"# Document {i}\n\n{text}.")


def _plan(sql: str, params: dict, *, ordered: bool = False) -> str:
    """EXPLAIN as the planner would choose at scale: on a tiny table a sequential scan (or a
    sort of a few rows) is cheaper than any index, so those are priced out here; the
    benchmark checks the same plans on 100k chunks without any setting."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        if ordered:
            cursor.execute("SET LOCAL enable_sort = off")
            cursor.execute("SET LOCAL enable_bitmapscan = off")
        cursor.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


def _params(kb, **extra):
    return {"kbs": [kb.pk], "audience": "", "roles": [], **extra}


HASHING = "bailing_knowledge.retrieval.embedders.HashingEmbedder"


@pytest.fixture
def small_kb(settings, route):
    """A KB whose embedder makes 64-dimension vectors: the shipped index does not cover it."""
    settings.BAILING_KNOWLEDGE = {
        "EMBEDDERS": {
            "default": {"BACKEND": HASHING},
            "small": {"BACKEND": HASHING, "OPTIONS": {"DIMENSIONS": 64}},
        }
    }
    small = services.create_knowledge_base("small", embedder="small")
    services.bind_knowledge_bases(route, [small])
    return small


def _vector_leg_sql(dimensions: int) -> str:
    if dimensions == constants.INDEXED_EMBEDDING_DIMENSIONS:
        return VECTOR_INDEXED
    return VECTOR_OTHER.format(dimensions=dimensions)


def _literal(vector) -> str:
    return "[" + ",".join(f"{x:.7g}" for x in vector) + "]"


def _run_vector_leg(sql: str, params: dict) -> list[tuple[int, float]]:
    """The leg's rows, with the index preferred as it is at scale, and rebuilt without the
    entries of earlier tests' rows (`tests.hnsw`)."""
    with transaction.atomic(), connection.cursor() as cursor:
        rebuild_vector_index(cursor)
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_sort = off")
        cursor.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
        cursor.execute("SET LOCAL hnsw.ef_search = 1000")
        cursor.execute(sql, params)
        return [row[:2] for row in cursor.fetchall()]


def _distances(kb, literal: str, dimensions: int, kind: str) -> dict[int, float]:
    """Every chunk's cosine distance to the query, computed on `kind` (vector or halfvec)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id, embedding::{kind}({dimensions}) <=> %s::{kind}({dimensions}) "
            "FROM bailing_knowledge_chunk WHERE knowledge_base_id = %s",
            [literal, kb.pk],
        )
        return dict(cursor.fetchall())


def test_the_vector_leg_scans_the_hnsw_index(kb):
    _corpus(kb, 30)
    vector = get_embedder().embed_query("refund for a broken charger")
    literal = "[" + ",".join(f"{x:.7g}" for x in vector) + "]"
    plan = _plan(
        VECTOR_INDEXED,
        _params(kb, vector=literal, limit=40, max_distance=0.9),
        ordered=True,
    )
    assert "bk_chunk_embedding_hnsw_384" in plan, plan


@pytest.mark.parametrize("dimensions", [384, 64], ids=["indexed", "other"])
def test_the_vector_leg_returns_exact_full_precision_distances(kb, small_kb, dimensions):
    """The index orders by half-precision vectors; distances, and so the similarity floor
    and the order of the candidates, are those of the stored full-precision vectors."""
    target = kb if dimensions == 384 else small_kb
    _corpus(target, 30)
    vector = get_embedder(target.embedder).embed_query("refund for a broken charger")
    assert len(vector) == dimensions
    literal = _literal(vector)
    sql = _vector_leg_sql(dimensions)
    rows = _run_vector_leg(sql, _params(target, vector=literal, limit=1000, max_distance=2.0))
    exact = _distances(target, literal, dimensions, "vector")
    half = _distances(target, literal, dimensions, "halfvec")
    assert len(rows) == len(exact) > 1
    for chunk_id, distance in rows:
        assert distance == exact[chunk_id]
    # The check above could not tell the two apart if they were equal.
    assert any(half[chunk_id] != exact[chunk_id] for chunk_id in exact)
    assert [d for _, d in rows] == sorted(exact.values())

    # ... and they are the cosine distances of the vectors themselves.
    query = [float(x) for x in literal[1:-1].split(",")]
    embeddings = dict(Chunk.objects.filter(knowledge_base=target).values_list("id", "embedding"))
    for chunk_id, distance in rows:
        stored = [float(x) for x in embeddings[chunk_id]]
        dot = sum(a * b for a, b in zip(stored, query, strict=True))
        norms = math.sqrt(sum(a * a for a in stored) * sum(b * b for b in query))
        assert distance == pytest.approx(1 - dot / norms, abs=1e-6)

    # The similarity floor is applied to the exact distance, to the last bit.
    floor = sorted(exact.values())[len(exact) // 2]
    params = _params(target, vector=literal, limit=1000, max_distance=floor)
    kept = {chunk_id for chunk_id, _ in _run_vector_leg(sql, params)}
    assert kept == {chunk_id for chunk_id, d in exact.items() if d <= floor}
    params["max_distance"] = math.nextafter(floor, 0.0)
    kept = {chunk_id for chunk_id, _ in _run_vector_leg(sql, params)}
    assert kept == {chunk_id for chunk_id, d in exact.items() if d < floor}


# The index docs/embedders.md tells operators to create for another size.
OPERATOR_INDEX = """
CREATE INDEX bk_chunk_embedding_hnsw_64 ON bailing_knowledge_chunk
USING hnsw ((embedding::halfvec(64)) halfvec_cosine_ops)
WITH (m = 8, ef_construction = 32) WHERE embedding_dimensions = 64
"""


def test_other_dimensions_use_an_operators_halfvec_index(small_kb):
    literal = _literal(get_embedder("small").embed_query("refund for a broken charger"))
    params = _params(small_kb, vector=literal, limit=40, max_distance=0.9)
    sql = VECTOR_OTHER.format(dimensions=64)
    assert "bk_chunk_embedding_hnsw" not in _plan(sql, params, ordered=True)
    # Before any row: CREATE INDEX refuses to run with deferred constraint checks pending.
    with connection.cursor() as cursor:
        cursor.execute(OPERATOR_INDEX)
    _corpus(small_kb, 30)
    plan = _plan(sql, params, ordered=True)
    assert "bk_chunk_embedding_hnsw_64" in plan, plan
    result = HybridSearch("refund charger", [small_kb], Visibility(), use_lexical=False).run(
        max_hits=5, per_document=1, max_documents=5
    )
    assert result.status == "ok"
    assert len(result.hits) == 5
    assert {hit.knowledge_base_id for hit in result.hits} == {small_kb.pk}


def test_a_small_kb_among_many_rows_is_not_starved(kb, route):
    """Iterative index scans keep walking until enough rows of the filtered KB pass."""
    with connection.cursor() as cursor:
        rebuild_vector_index(cursor)  # only this test's rows to walk through
    big = services.create_knowledge_base("big")
    services.bind_knowledge_bases(route, [big])
    _corpus(big, 80, seed=2)
    _corpus(kb, 12, seed=3)
    result = HybridSearch("refund charger", [kb], Visibility(), use_lexical=False).run(
        max_hits=10, per_document=1, max_documents=10
    )
    assert len(result.hits) == 10
    assert {hit.knowledge_base_id for hit in result.hits} == {kb.pk}
    assert result.status == "ok"


def _timed_out_search(kb, settings) -> hybrid.SearchResult:
    _corpus(kb, 5)
    # Only the vector leg answers: its scan must reach these rows past earlier tests' dead
    # index entries (tests/hnsw.py).
    with connection.cursor() as cursor:
        rebuild_vector_index(cursor)
    settings.BAILING_KNOWLEDGE = {"SEARCH_STATEMENT_TIMEOUT_MS": 500}
    original = hybrid.HybridSearch._lexical

    def slow_lexical(self, *args):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(1.5)")
        return original(self, *args)

    search = HybridSearch("refund", [kb], Visibility())
    search._lexical = slow_lexical.__get__(search)
    return search.run(max_hits=3)


def test_a_timed_out_leg_makes_the_answer_partial(kb, settings):
    result = _timed_out_search(kb, settings)
    assert result.status == "partial"
    assert result.legs_ok == 1
    assert result.hits


@pytest.mark.django_db(transaction=True)
def test_after_a_timed_out_leg_the_others_run_in_a_new_transaction(settings):
    """Outside any caller's transaction the timeout aborts the search's own: the vector leg
    and the fetch still answer, from a new one."""
    kb = services.create_knowledge_base("handbook", title="Handbook")
    result = _timed_out_search(kb, settings)
    assert result.status == "partial"
    assert result.legs_ok == 1
    assert result.hits
    assert not connection.in_atomic_block


def test_weighted_fusion_scores_first_place_everywhere_as_one():
    scores = HybridSearch._fuse([(1.0, [10, 11]), (0.35, [11, 12])])
    assert scores[11] > scores[10] > scores[12]
    assert HybridSearch._fuse([(1.0, [7]), (0.35, [7])])[7] == pytest.approx(1.0)


def test_fusion_weight_comes_from_the_embedder_or_its_settings(settings):
    from django.core.exceptions import ImproperlyConfigured

    from bailing_knowledge.retrieval.embedders import get_embedder

    assert hybrid.fusion_weight("default") == 0.03
    backend = "bailing_knowledge.retrieval.embedders.HashingEmbedder"
    settings.BAILING_KNOWLEDGE = {
        "EMBEDDERS": {"default": {"BACKEND": backend, "FUSION_WEIGHT": 2}}
    }
    assert hybrid.fusion_weight("default") == 2.0
    settings.BAILING_KNOWLEDGE = {
        "EMBEDDERS": {"default": {"BACKEND": backend, "FUSION_WEIGHT": -1}}
    }
    with pytest.raises(ImproperlyConfigured):
        get_embedder("default")


def _before(tag: str, action):
    """An execute wrapper that runs `action` once, just before the first `bk:<tag>` statement."""
    done = []

    def wrapper(execute, sql, params, many, context):
        if not done and f"/* bk:{tag} */" in sql:
            done.append(True)
            action()
        return execute(sql, params, many, context)

    return wrapper


@pytest.mark.django_db(transaction=True)
def test_a_search_sees_one_snapshot_while_its_document_is_reingested():
    """A re-ingestion committed between the legs and the fetch does not empty the answer."""
    kb = services.create_knowledge_base("handbook", title="Handbook")
    upsert_document(kb, "refunds.md", "Refunds", "# Refunds\n\nA refund takes five days.")

    def reingest() -> None:
        # Another connection, as a concurrent ingestion would be: a thread has its own.
        def work() -> None:
            try:
                upsert_document(kb, "refunds.md", "Refunds", "# Refunds\n\nA refund takes a week.")
            finally:
                connection.close()

        thread = threading.Thread(target=work)
        thread.start()
        thread.join()

    with connection.execute_wrapper(_before("fetch", reingest)):
        result = HybridSearch("refund", [kb], Visibility()).run(max_hits=3)
    assert [hit.text for hit in result.hits] == ["# Refunds\n\nA refund takes five days."]
    assert result.status == "ok"
    # The next search sees the new revision.
    result = HybridSearch("refund", [kb], Visibility()).run(max_hits=3)
    assert "a week" in result.hits[0].text
    # The search's isolation level was the transaction's only: the connection is back to its own.
    assert connection.connection.isolation_level is None


@pytest.mark.parametrize("how", ["vector leg", "lexical leg checking as it reads"])
def test_a_hit_dropped_as_stale_makes_the_answer_partial(kb, how):
    """Inside a caller's transaction (its own isolation), a document changed before the
    fetch loses its hits: the answer says `partial`, never `ok` with nothing. (A lexical
    leg whose check waits for the fetch finds such a chunk hidden instead and runs again.)"""
    upsert_document(kb, "refunds.md", "Refunds", "# Refunds\n\nA refund takes five days.")
    if how == "vector leg":
        # Alone, the vector leg's scan must reach this row past earlier tests' dead index
        # entries (tests/hnsw.py).
        with connection.cursor() as cursor:
            rebuild_vector_index(cursor)
    else:
        hybrid._remember_hidden(hybrid._hidden_key([kb], Visibility()))

    def bump() -> None:
        with connection.cursor() as cursor:
            cursor.execute("UPDATE bailing_knowledge_document SET revision = revision + 1")

    with connection.execute_wrapper(_before("fetch", bump)):
        search = HybridSearch("refund", [kb], Visibility(), use_lexical=how != "vector leg")
        result = search.run(max_hits=3)
    assert result.hits == []
    assert result.stale == 1
    assert result.status == "partial"


def _fetches(sent: list[str]) -> list[str]:
    return [sql for sql in sent if sql.startswith("/* bk:fetch */")]


def _recorder(sent: list[str], checks: list[bool]):
    """An execute wrapper noting each statement, and whether each lexical round checked its
    rows' documents (a parameter, or written into a query string of several statements)."""

    def record(execute, sql, params, many, context):
        sent.append(sql)
        if isinstance(params, dict) and "check" in params:
            checks.append(params["check"])
        checks.extend(word == "true" for word in re.findall(r"CASE WHEN (true|false)", sql))
        return execute(sql, params, many, context)

    return record


def test_a_hidden_leader_found_by_the_fetch_runs_the_search_again_checking_as_it_reads(kb):
    """The lexical leg leaves its document checks to the fetch; a chunk it ranked that the
    principal may not see makes the search run again, checking each chunk as it is read,
    and the next searches of these knowledge bases by that principal check so from the
    start."""
    upsert_document(kb, "public.md", "Public", "Our refund policy: five days.")
    upsert_document(
        kb, "staff.md", "Staff", "refund refund refund refund", metadata={"audiences": ["staff"]}
    )
    titles = dict(Chunk.objects.values_list("pk", "document__title"))
    customer = Visibility(audience="customer")
    sent: list[str] = []
    checks: list[bool] = []

    with connection.execute_wrapper(_recorder(sent, checks)):
        first = HybridSearch("refund", [kb], customer, use_vector=False).run(max_hits=3)
    assert [titles[hit.chunk_id] for hit in first.hits] == ["Public"]
    assert first.status == "ok"
    fetches = _fetches(sent)
    assert len(fetches) == 2
    assert "/* bk:lexical */" in fetches[0]
    assert "/* bk:lexical */" not in fetches[1]  # checked as read: nothing left to check
    assert checks == [False, True]  # the round of each run

    sent.clear()
    checks.clear()
    with connection.execute_wrapper(_recorder(sent, checks)):
        again = HybridSearch("refund", [kb], customer, use_vector=False).run(max_hits=3)
    assert again.hits == first.hits
    assert len(_fetches(sent)) == 1 and checks == [True]
    # Who may see the chunk is not held up: it was not their search that met it.
    staff = HybridSearch("refund", [kb], Visibility(audience="staff"), use_vector=False)
    assert [titles[hit.chunk_id] for hit in staff.run(max_hits=3).hits] == ["Staff", "Public"]


def test_with_every_leader_visible_the_check_rides_on_the_fetch(kb):
    """No statement of the lexical leg's own checks documents, and none of its rounds looks
    them up per row: the fetch's query string carries the one check."""
    for number in range(40):
        upsert_document(kb, f"doc-{number}.md", f"Doc {number}", "refund policy " * (number + 1))
    sent: list[str] = []
    checks: list[bool] = []

    with connection.execute_wrapper(_recorder(sent, checks)):
        result = HybridSearch("refund policy", [kb], Visibility()).run(max_hits=3)
    assert result.status == "ok" and len(result.hits) == 3
    markers = [rounds.VISIBLE.split("WHERE")[0].strip(), "bailing_knowledge_admitted_documents("]
    apart = [sql for sql in sent if any(marker in sql for marker in markers)]
    assert apart == _fetches(sent)  # only in the fetch's query string
    assert checks and not any(checks)
    assert result.hits == HybridSearch("refund policy", [kb], Visibility()).run(max_hits=3).hits


def test_a_hidden_leader_is_remembered_for_a_while_and_for_its_principal_only():
    kbs = [services.create_knowledge_base(slug, title=slug) for slug in ("one", "two")]
    customer = hybrid._hidden_key(kbs, Visibility(audience="customer"))
    hybrid._remember_hidden(customer)
    assert not hybrid._defers(customer)
    assert not hybrid._defers(hybrid._hidden_key(kbs[::-1], Visibility(audience="customer")))
    assert hybrid._defers(hybrid._hidden_key(kbs, Visibility(audience="staff")))
    assert hybrid._defers(hybrid._hidden_key(kbs[:1], Visibility(audience="customer")))
    assert hybrid._hidden_met[customer] > time.monotonic() + hybrid.HIDDEN_MEMORY_SECONDS - 60
    hybrid._hidden_met[customer] = time.monotonic() - 1  # the while is over
    assert hybrid._defers(customer)
