"""`make bench-embedders`: the speed and memory of the embedders that need no server.

For the hashing embedder and, when its extra is installed, WordLlama: the time to build the
embedder and load its model, chunks embedded per second (the corpus texts cut to the chunk
size and embedded in batches, as ingestion does), the latency of embedding one query (as a
search does; p50 and p95 over the test queries, each embedded many times) and the growth of
the process's resident memory. Every backend runs in a process of its own, so that one's
memory does not count for the next.

It ends with `TARGET query_embedding_p50_ms <ms> 1 PASS|FAIL`, for WordLlama: embedding the
query must add at most a millisecond to a search. `make bench` prints the same line
(`query_embedding_target`), measured on the built-in queries below.

`--vector-chunks 100000` also builds (or reuses) `bench_wordllama_100k`, the benchmark corpus
of `make bench` embedded by WordLlama (its 256-dimension HNSW index maintained while loading),
and times the vector leg's SQL as a search runs it, against an exact scan of the same rows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .common import ROOT, Target, heading, load_beir, print_table, setup_django, write_json

BACKENDS = {
    "hashing": "bailing_knowledge.retrieval.embedders.HashingEmbedder",
    "wordllama": "bailing_knowledge.retrieval.embedders.WordLlamaEmbedder",
}
QUERY_TARGET_MS = 1.0
# Chunks are cut at about this many characters (CHUNK_TARGET_CHARS).
CHUNK_CHARS = 1000
BATCH = 64
# Queries for a run without a data set: short questions, as agents send them.
QUERIES = [
    "money back",
    "how long do refunds take",
    "when will my parcel arrive",
    "the product broke, is it covered",
    "can I return an opened item",
    "express delivery price",
    "battery warranty after one year",
    "change the delivery address of an order",
    "does vitamin D help against depression",
    "statin side effects in older patients",
    "is red meat linked to colon cancer",
    "how much fibre should adults eat per day",
]


def resident_mb() -> float | None:
    """The process's resident memory now (Linux), in MB."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6


def query_latencies(embedder: Any, queries: Sequence[str], rounds: int) -> list[float]:
    """Milliseconds per `embed_query`, each query embedded `rounds` times (after a warm-up)."""
    for query in queries:
        embedder.embed_query(query)
    times = []
    for _ in range(rounds):
        for query in queries:
            start = time.perf_counter()
            embedder.embed_query(query)
            times.append((time.perf_counter() - start) * 1000)
    return times


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def measure(backend: str, texts: Sequence[str], queries: Sequence[str]) -> dict[str, Any]:
    """Everything measured for one backend, in this process."""
    setup_django()
    from django.test import override_settings

    from bailing_knowledge.retrieval.embedders import get_embedder

    before = resident_mb()
    start = time.perf_counter()
    with override_settings(BAILING_KNOWLEDGE={"EMBEDDERS": {"default": {"BACKEND": backend}}}):
        embedder = get_embedder()
        embedder.embed_query("load the model")
        load_s = time.perf_counter() - start
        loaded = resident_mb()
        start = time.perf_counter()
        for offset in range(0, len(texts), BATCH):
            embedder.embed_documents(texts[offset : offset + BATCH])
        documents_s = time.perf_counter() - start
        times = query_latencies(embedder, queries, max(1, 2000 // max(1, len(queries))))
        after = resident_mb()
    return {
        "model_name": embedder.model_name,
        "dimensions": embedder.dimensions,
        "load_s": round(load_s, 3),
        "chunks": len(texts),
        "chunks_per_s": round(len(texts) / documents_s) if texts else None,
        "query_p50_ms": round(statistics.median(times), 4),
        "query_p95_ms": round(percentile(times, 0.95), 4),
        "rss_after_load_mb": round(loaded - before, 1) if before and loaded else None,
        "rss_after_run_mb": round(after - before, 1) if before and after else None,
    }


def query_embedding_target() -> Target | None:
    """WordLlama's query-embedding p50 against 1 ms, or None without the wordllama extra."""
    from bailing_knowledge.retrieval.embedders import WordLlamaEmbedder

    if WordLlamaEmbedder.missing_requirement():
        return None
    times = query_latencies(WordLlamaEmbedder("bench"), QUERIES, 200)
    return Target("query_embedding_p50_ms", statistics.median(times), QUERY_TARGET_MS, decimals=4)


def vector_leg(dataset: Path, chunks: int, rounds: int = 2) -> dict[str, Any]:
    """The vector leg's SQL over `chunks` WordLlama chunks: p50 and p95 through the HNSW
    index (NFCorpus test queries, `rounds` passes), and an exact scan for comparison."""
    from . import build, quality

    quality.use_embedder("wordllama")
    name = f"bench_wordllama_{chunks // 1000}k"
    facts = build.ensure_scale_database(name, chunks, dataset)
    from django.db import connection, transaction

    from bailing_knowledge.database import vector_index_name
    from bailing_knowledge.models import KnowledgeBase
    from bailing_knowledge.retrieval.embedders import get_embedder
    from bailing_knowledge.retrieval.session import configure_search
    from bailing_knowledge.retrieval.vector import VECTOR_OTHER
    from bailing_knowledge.retrieval.visibility import Visibility

    kb = KnowledgeBase.objects.get(slug=build.KB_SLUG)
    embedder = get_embedder()
    sql = VECTOR_OTHER.format(dimensions=embedder.dimensions)
    data = load_beir(dataset)

    def params(query: str) -> dict[str, Any]:
        literal = "[" + ",".join(f"{x:.7g}" for x in embedder.embed_query(query)) + "]"
        return {**Visibility().params([kb.pk]), "vector": literal, "limit": 40, "max_distance": 0.8}

    prepared = [params(data.queries[query_id]) for query_id in sorted(data.qrels)]

    def timed(statements: Sequence[dict[str, Any]], *, exact: bool = False) -> list[float]:
        times = []
        with transaction.atomic(), connection.cursor() as cursor:
            if exact:
                cursor.execute(f"DROP INDEX {vector_index_name(embedder.dimensions)}")
            for statement in statements:
                with transaction.atomic():
                    configure_search(cursor)
                    start = time.perf_counter()
                    cursor.execute(sql, statement)
                    cursor.fetchall()
                    times.append((time.perf_counter() - start) * 1000)
            transaction.set_rollback(True)  # the index stays
        return times

    with transaction.atomic(), connection.cursor() as cursor:
        configure_search(cursor)
        cursor.execute("EXPLAIN " + sql, prepared[0])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    indexed = timed(prepared * rounds)
    exact = timed(prepared[:20], exact=True)
    return {
        "database": name,
        "chunks": facts.get("total_chunks"),
        "build_s": facts.get("build_s"),
        "index_used": vector_index_name(embedder.dimensions) in plan,
        "vector_sql_p50_ms": round(statistics.median(indexed), 2),
        "vector_sql_p95_ms": round(percentile(indexed, 0.95), 2),
        "exact_scan_p50_ms": round(statistics.median(exact), 1),
    }


def corpus(dataset: Path | None, limit: int) -> tuple[list[str], list[str]]:
    """Chunk-sized texts and test queries of a BEIR data set, or the built-in queries."""
    if dataset is None:
        return [], QUERIES
    data = load_beir(dataset)
    texts = [f"{title}\n\n{text}"[:CHUNK_CHARS] for title, text in data.corpus.values()]
    queries = [data.queries[query_id] for query_id in sorted(data.qrels)]
    return texts[:limit], queries


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Speed and memory of the local embedders.")
    parser.add_argument("dataset", type=Path, nargs="?", help="a BEIR data set's folder")
    parser.add_argument("--limit", type=int, default=3000, help="corpus texts to embed")
    parser.add_argument("--backend", choices=sorted(BACKENDS), help=argparse.SUPPRESS)
    parser.add_argument(
        "--vector-chunks",
        type=int,
        help="also time WordLlama's vector leg over this many chunks (needs the data set)",
    )
    args = parser.parse_args(argv)
    texts, queries = corpus(args.dataset, args.limit)
    if args.backend:  # the child process: one backend, JSON on stdout
        print(json.dumps(measure(BACKENDS[args.backend], texts, queries)))
        return 0

    results: dict[str, Any] = {"dataset": str(args.dataset or "built-in queries"), "backends": {}}
    for name in BACKENDS:
        if name == "wordllama":
            setup_django()
            from bailing_knowledge.retrieval.embedders import WordLlamaEmbedder

            if WordLlamaEmbedder.missing_requirement():
                print("wordllama: skipped (pip install 'bailing-knowledge[wordllama]')")
                continue
        command = [sys.executable, "-m", "benchmarks.embedding", "--backend", name]
        command += [str(args.dataset), "--limit", str(args.limit)] if args.dataset else []
        child = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
        results["backends"][name] = json.loads(child.stdout.splitlines()[-1])

    heading(f"Embedders: {len(texts):,} chunk-sized texts, {len(queries):,} queries")
    print_table(
        ["backend", "load s", "chunks/s", "query p50 ms", "query p95 ms", "memory MB"],
        [
            [
                r["model_name"],
                r["load_s"],
                r["chunks_per_s"] or "-",
                r["query_p50_ms"],
                r["query_p95_ms"],
                r["rss_after_run_mb"] if r["rss_after_run_mb"] is not None else "-",
            ]
            for r in results["backends"].values()
        ],
    )
    if args.vector_chunks and args.dataset and "wordllama" in results["backends"]:
        setup_django()
        leg = results["vector_leg"] = vector_leg(args.dataset, args.vector_chunks)
        heading(f"WordLlama's vector leg over {leg['chunks']:,} chunks (SQL, ms)")
        print_table(
            ["index used", "p50", "p95", "exact scan p50"],
            [[leg["index_used"], leg["vector_sql_p50_ms"], leg["vector_sql_p95_ms"],
              leg["exact_scan_p50_ms"]]],
        )  # fmt: skip
    path = write_json("embedders.json", results)
    print(f"results in .data/bench/{path.name}")
    wordllama = results["backends"].get("wordllama")
    if wordllama:
        heading("Target")
        target = Target(
            "query_embedding_p50_ms", wordllama["query_p50_ms"], QUERY_TARGET_MS, decimals=4
        )
        print(target.line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
