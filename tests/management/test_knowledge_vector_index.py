"""`manage.py knowledge_vector_index`: an HNSW index per configured vector size, idempotently.

The indexes are built concurrently, which PostgreSQL refuses inside a transaction: these
tests run with real commits, and drop what they create.
"""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction

from bailing_knowledge import services
from bailing_knowledge.database import vector_index_name, vector_index_state
from bailing_knowledge.ingestion.documents import upsert_document
from bailing_knowledge.retrieval.embedders import get_embedder
from bailing_knowledge.retrieval.hybrid import HybridSearch, Visibility
from bailing_knowledge.retrieval.vector import VECTOR_OTHER

pytestmark = pytest.mark.django_db(transaction=True)

HASHING = "bailing_knowledge.retrieval.embedders.HashingEmbedder"
WORDLLAMA = "bailing_knowledge.retrieval.embedders.WordLlamaEmbedder"


@pytest.fixture
def drop_index():
    """Drop the indexes of these sizes after the test (DDL outlives the test's rows)."""
    sizes: list[int] = []
    yield sizes.append
    with connection.cursor() as cursor:
        for size in sizes:
            cursor.execute(f"DROP INDEX IF EXISTS {vector_index_name(size)}")


def run(*args: str) -> str:
    out = StringIO()
    call_command("knowledge_vector_index", *args, stdout=out)
    return out.getvalue()


def plan(dimensions: int, kb_id: int, vector: list[float]) -> str:
    """The vector leg's plan, priced as at scale (a tiny table is cheaper to scan)."""
    literal = "[" + ",".join(f"{x:.7g}" for x in vector) + "]"
    params = {"kbs": [kb_id], "audience": "", "roles": [], "vector": literal}
    params.update(limit=40, max_distance=0.9)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_sort = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
        cursor.execute("EXPLAIN " + VECTOR_OTHER.format(dimensions=dimensions), params)
        return "\n".join(row[0] for row in cursor.fetchall())


def test_the_migrations_index_the_shipped_sizes():
    for size in (256, 384):
        assert vector_index_state(connection, size) == "ok"
    assert run("--check") == f"{vector_index_name(384)}: ok\n"
    assert run("--check", "--dimensions", "256") == f"{vector_index_name(256)}: ok\n"


def test_a_wordllama_kb_is_searched_through_its_hnsw_index(settings, route):
    settings.BAILING_KNOWLEDGE = {"EMBEDDERS": {"default": {"BACKEND": WORDLLAMA}}}
    kb = services.create_knowledge_base("semantic")
    services.bind_knowledge_bases(route, [kb])
    for i in range(5):
        upsert_document(kb, f"doc-{i}.md", f"Doc {i}", f"Refunds and parcels, note {i}.")
    vector = get_embedder().embed_query("money back")
    assert f"Index Scan using {vector_index_name(256)}" in plan(256, kb.pk, vector)


def test_creates_the_index_of_each_configured_size_once(settings, route, drop_index):
    settings.BAILING_KNOWLEDGE = {
        "EMBEDDERS": {
            "default": {"BACKEND": HASHING},
            "small": {"BACKEND": HASHING, "OPTIONS": {"DIMENSIONS": 48}},
        }
    }
    drop_index(48)
    small = services.create_knowledge_base("small", embedder="small")
    services.bind_knowledge_bases(route, [small])
    for i in range(5):
        upsert_document(small, f"doc-{i}.md", f"Doc {i}", f"Refund for charger {i}.")
    vector = get_embedder("small").embed_query("refund charger")
    assert vector_index_state(connection, 48) == "missing"
    assert vector_index_name(48) not in plan(48, small.pk, vector)
    with pytest.raises(CommandError, match=f"No usable HNSW index: {vector_index_name(48)}"):
        run("--check")

    output = run()
    assert f"{vector_index_name(48)}: created" in output
    assert f"{vector_index_name(384)}: already indexed" in output
    assert vector_index_state(connection, 48) == "ok"
    assert json.loads(run("--json")) == [
        {"dimensions": 48, "index": vector_index_name(48), "found": "ok"},
        {"dimensions": 384, "index": vector_index_name(384), "found": "ok"},
    ]
    run("--check")
    assert f"Index Scan using {vector_index_name(48)}" in plan(48, small.pk, vector)
    result = HybridSearch("refund charger", [small], Visibility(), use_lexical=False).run(
        max_hits=3
    )
    assert result.status == "ok"
    assert result.hits


def test_an_index_the_search_cannot_use_is_built_again(drop_index):
    """An index of the expected name on full-precision vectors (an older recipe)."""
    drop_index(40)
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE INDEX {vector_index_name(40)} ON bailing_knowledge_chunk "
            "USING hnsw ((embedding::vector(40)) vector_cosine_ops) "
            "WHERE embedding_dimensions = 40"
        )
    assert vector_index_state(connection, 40) == "other"
    with pytest.raises(CommandError):
        run("--check", "--dimensions", "40")
    assert "rebuilt (the index of that name did not match the search)" in run("--dimensions", "40")
    assert vector_index_state(connection, 40) == "ok"
    assert "already indexed" in run("--dimensions", "40")


def test_an_unknown_database_is_a_usage_error():
    with pytest.raises(CommandError, match="--database: invalid choice: 'nosuch'"):
        run("--database", "nosuch")


@pytest.mark.parametrize("size", ["0", "4001"])
def test_rejects_sizes_hnsw_cannot_index(size):
    with pytest.raises(CommandError, match="--dimensions: HNSW indexes take 1 to 4000"):
        run("--dimensions", size)


def test_an_embedder_wider_than_hnsw_allows_is_noted_not_refused(settings):
    # Such a size is searched by a full scan: nothing to build, nothing for --check to fail on.
    settings.BAILING_KNOWLEDGE = {
        "EMBEDDERS": {
            "default": {"BACKEND": HASHING},
            "wide": {"BACKEND": HASHING, "OPTIONS": {"DIMENSIONS": 4096}},
        }
    }
    output = run()
    assert "4096 dimensions: no index (HNSW takes at most 4000); searched by a full scan" in output
    assert f"{vector_index_name(384)}: already indexed" in output
    assert vector_index_state(connection, 4096) == "missing"
    assert json.loads(run("--check", "--json")) == [
        {"dimensions": 4096, "index": None, "found": "too_wide"},
        {"dimensions": 384, "index": vector_index_name(384), "found": "ok"},
    ]
