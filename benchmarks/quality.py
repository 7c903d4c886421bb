"""`make bench-quality DATASET=...`: retrieval quality on a BEIR data set.

The corpus is loaded into a fresh knowledge base in its own benchmark database, one
document per corpus entry (title and text, through `upsert_documents`). Every test query is
then run through `HybridSearch` directly (the HTTP endpoint returns at most 3 hints) with one
hit per document and ten documents, in three configurations: lexical only, vector only
and hybrid. The embedder is the settings' `default` one (the hashing embedder), or the one
`--embedder` names (`wordllama`, `hashing`, or a backend's dotted path). A document's score
is its best chunk's.

Metrics, averaged over all test queries (a query without hits scores 0): nDCG@10 with the
graded relevance as gain, Recall@3 and Recall@10. Then the lexical leg's exactness: whether
its top 10 (`lexical.lexical_ranking`, as search runs it) is the top 10 of an exhaustive
BM25 (`lexical.exhaustive_ranking`) for each test query. Then variants, one knob at a time
and a few combinations: settings merged over the run's ones (candidates, similarity floor,
ef_search, BM25's k1 and b, the vector leg's `FUSION_WEIGHT` for the run's embedder), the
RRF constant by patching `hybrid.RRF_K` in this process, and the KB re-indexed in the
`simple` language (no stemming, no stopwords) and back.

The run ends with the embedder's name, then `QUALITY <dataset> <leg> ndcg@10=<x>` for each leg
(exactly that: scripts compare the lines across runs) and the exactness target as
`TARGET lexical_top10_exact_<dataset> <fraction> 0.95 PASS|FAIL`.
Results go to `.data/bench/quality-<dataset>[-<embedder>].json`.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import re
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .common import (
    BeirDataset,
    Target,
    code_version,
    create_database,
    heading,
    load_beir,
    print_table,
    setup_django,
    write_json,
)

KB_SLUG = "quality"
# The exactness target: the share of test queries whose lexical top 10 is the exhaustive one.
EXACT_TOP = 10
EXACT_TARGET = 0.95
# Exhaustive scores closer than this are a tie: either chunk may take the place.
SCORE_TIE = 1e-6

# Reference figures from the data sets' READMEs (nDCG@10 on test; Recall@3 where given).
REFERENCES: dict[str, list[tuple[str, float, float | None]]] = {
    "nfcorpus": [
        ("BM25 (k1 0.9, b 0.4, word tokens, no stemming)", 0.3045, 0.1025),
        ("BM25 published (BEIR, stemmed)", 0.325, None),
        ("all-MiniLM-L6-v2 (dense, exact)", 0.3159, None),
        ("RRF of BM25 and MiniLM", 0.3453, None),
    ],
    "cmrc2018-retrieval": [
        ("BM25 on word tokens (unsegmented Chinese)", 0.166, None),
        ("BM25 on CJK character bigrams", 0.983, None),
    ],
}

CONFIGS = {
    "lexical only": {"use_vector": False, "use_lexical": True},
    "vector only": {"use_vector": True, "use_lexical": False},
    "hybrid": {"use_vector": True, "use_lexical": True},
}
# The legs as the QUALITY lines name them.
LEGS = {"lexical": "lexical only", "vector": "vector only", "hybrid": "hybrid"}


# --------------------------------------------------------------------------------------------
# Metrics


def ndcg_at(ranked: Sequence[str], relevant: dict[str, int], k: int = 10) -> float:
    dcg = sum(relevant.get(doc, 0) / math.log2(i + 2) for i, doc in enumerate(ranked[:k]))
    ideal = sorted(relevant.values(), reverse=True)[:k]
    idcg = sum(grade / math.log2(i + 2) for i, grade in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def recall_at(ranked: Sequence[str], relevant: dict[str, int], k: int) -> float:
    return len(set(ranked[:k]) & set(relevant)) / len(relevant) if relevant else 0.0


# --------------------------------------------------------------------------------------------
# Loading and searching


def load_corpus(data: BeirDataset, dbname: str) -> dict[str, Any]:
    """A fresh database and KB holding the corpus; returns load facts."""
    from bailing_knowledge import services
    from bailing_knowledge.ingestion.documents import (
        DocumentInput,
        DocumentOutcome,
        upsert_documents,
    )

    create_database(dbname)
    services.create_knowledge_base(KB_SLUG, title=f"Quality: {data.name}")
    start = time.perf_counter()
    chunks = 0

    def inputs() -> Iterator[DocumentInput]:
        for doc_id, (title, text) in data.corpus.items():
            title = title.strip() or doc_id
            body = f"{title}\n\n{text}" if text.strip() else title
            yield DocumentInput(doc_id, title[:500], body)

    for result in upsert_documents(KB_SLUG, inputs()):
        if result.outcome != DocumentOutcome.CREATED:
            raise RuntimeError(f"{result.source_key}: {result.outcome} {result.error}")
        chunks += result.chunks
    seconds = time.perf_counter() - start
    # Fresh planner statistics before evaluating, so that autovacuum's ANALYZE cannot change
    # the plans halfway through.
    from django.db import connection

    from bailing_knowledge.retrieval import hybrid

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    if hasattr(hybrid, "clear_lexeme_statistics"):  # the lexical leg before BM25
        hybrid.clear_lexeme_statistics()
    return {
        "documents": len(data.corpus),
        "chunks": chunks,
        "seconds": round(seconds, 1),
        "chunks_per_s": round(chunks / seconds),
    }


class Evaluator:
    """Runs test queries through `HybridSearch` and scores the documents it returns."""

    def __init__(self, data: BeirDataset, limit: int | None) -> None:
        from bailing_knowledge.models import Document, KnowledgeBase

        self.data = data
        self.kbs: list[KnowledgeBase] = []
        self.reload()
        self.source_keys = dict(
            Document.objects.filter(knowledge_base__in=self.kbs).values_list("pk", "source_key")
        )
        self.query_ids = sorted(data.qrels)[:limit] if limit else sorted(data.qrels)

    def reload(self) -> None:
        """Read the KB again (after its language changed: the search reads it from there)."""
        from bailing_knowledge.models import KnowledgeBase

        self.kbs = list(KnowledgeBase.objects.filter(slug=KB_SLUG))

    def ranking(self, query: str, use_vector: bool, use_lexical: bool) -> list[str]:
        from bailing_knowledge.retrieval.hybrid import HybridSearch, Visibility

        result = HybridSearch(
            query, self.kbs, Visibility(), use_vector=use_vector, use_lexical=use_lexical
        ).run(max_hits=10, per_document=1, max_documents=10)
        return [self.source_keys[hit.document_id] for hit in result.hits]

    def evaluate(self, use_vector: bool = True, use_lexical: bool = True) -> dict[str, Any]:
        ndcg, recall3, recall10, empty, times = [], [], [], 0, []
        for query_id in self.query_ids:
            relevant = self.data.qrels[query_id]
            start = time.perf_counter()
            ranked = self.ranking(self.data.queries[query_id], use_vector, use_lexical)
            times.append(time.perf_counter() - start)
            empty += not ranked
            ndcg.append(ndcg_at(ranked, relevant))
            recall3.append(recall_at(ranked, relevant, 3))
            recall10.append(recall_at(ranked, relevant, 10))
        return {
            "ndcg_at_10": round(statistics.fmean(ndcg), 4),
            "recall_at_3": round(statistics.fmean(recall3), 4),
            "recall_at_10": round(statistics.fmean(recall10), 4),
            "queries_without_hits": empty,
            "search_p50_ms": round(statistics.median(times) * 1000, 2),
            "per_query_ndcg": ndcg,
        }


# --------------------------------------------------------------------------------------------
# Exactness of the lexical leg


def lexical_module() -> Any:
    """`bailing_knowledge.retrieval.lexical`, or None in a version without it."""
    try:
        from bailing_knowledge.retrieval import lexical
    except ImportError:
        return None
    return lexical


def same_top(
    found: Sequence[int], exhaustive: Callable[[int], list[tuple[int, float]]], k: int
) -> bool:
    """Whether `found` is the top `k` of `exhaustive(depth)` (chunk id, score; best first),
    position by position, two chunks whose exhaustive scores differ by less than
    `SCORE_TIE` being interchangeable.

    A chunk of `found` beyond the exhaustive top `k` may still tie with the `k`-th one:
    its exhaustive score is looked up deeper (x10 at a time) while the tie lasts.
    """
    if len(set(found)) != len(found):
        return False
    depth = k
    while True:
        reference = exhaustive(depth)
        top = reference[:k]
        if len(found) != len(top):
            return False
        scores = dict(reference)
        deeper = False
        for chunk_id, (_, expected) in zip(found, top, strict=True):
            score = scores.get(chunk_id)
            if score is None:
                # Unscored so far: only a tie running past the depth read can hold it.
                deeper = len(reference) == depth and abs(reference[-1][1] - expected) < SCORE_TIE
                if not deeper:
                    return False
                break
            if abs(score - expected) >= SCORE_TIE:
                return False
        if not deeper:
            return True
        if depth >= 100_000:
            return False
        depth *= 10


def lexical_exactness(evaluator: Evaluator) -> dict[str, Any] | None:
    """The share of test queries whose lexical top 10 equals the exhaustive BM25 top 10."""
    lexical = lexical_module()
    if lexical is None:
        return None
    from bailing_knowledge.retrieval.hybrid import Visibility

    visibility = Visibility()
    exact, differing, seconds = 0, [], {"lexical_ranking": 0.0, "exhaustive_ranking": 0.0}
    for query_id in evaluator.query_ids:
        query = evaluator.data.queries[query_id]
        start = time.perf_counter()
        found = [cid for cid, _ in lexical.lexical_ranking(query, evaluator.kbs, visibility, 10)]
        middle = time.perf_counter()

        def exhaustive(depth: int, query: str = query) -> list[tuple[int, float]]:
            return lexical.exhaustive_ranking(query, evaluator.kbs, visibility, depth)

        if same_top(found, exhaustive, EXACT_TOP):
            exact += 1
        else:
            differing.append(query_id)
        seconds["lexical_ranking"] += middle - start
        seconds["exhaustive_ranking"] += time.perf_counter() - middle
    queries = len(evaluator.query_ids)
    return {
        "queries": queries,
        "exact": exact,
        "fraction": exact / queries if queries else 0.0,
        "differing_queries": differing[:50],
        "mean_ms": {name: round(total / queries * 1000, 2) for name, total in seconds.items()},
    }


# --------------------------------------------------------------------------------------------
# Variants of the hybrid configuration


@contextlib.contextmanager
def knowledge_settings(**overrides: Any) -> Iterator[None]:
    """`overrides` merged over the current `BAILING_KNOWLEDGE`, not replacing it: a variant
    changes one knob and keeps the run's embedder."""
    from django.conf import settings
    from django.test import override_settings

    current = getattr(settings, "BAILING_KNOWLEDGE", None) or {}
    with override_settings(BAILING_KNOWLEDGE={**current, **overrides}):
        yield


@contextlib.contextmanager
def rrf_k(value: int) -> Iterator[None]:
    from bailing_knowledge.retrieval import hybrid

    saved = hybrid.RRF_K
    hybrid.RRF_K = value
    try:
        yield
    finally:
        hybrid.RRF_K = saved


def vector_weight(weight: float) -> dict[str, Any]:
    """`EMBEDDERS` as configured, with the `default` embedder at fusion weight `weight`."""
    from bailing_knowledge.conf import knowledge_settings as current

    embedders = dict(current.EMBEDDERS)
    embedders["default"] = {**embedders["default"], "FUSION_WEIGHT": weight}
    return embedders


# `--embedder` short names.
EMBEDDERS = {
    "hashing": "bailing_knowledge.retrieval.embedders.HashingEmbedder",
    "wordllama": "bailing_knowledge.retrieval.embedders.WordLlamaEmbedder",
}
# The fusion weights the variants try for the run's embedder.
FUSION_WEIGHTS = (0.03, 0.05, 0.1, 0.25, 0.35, 0.5, 0.75, 1.0)


def use_embedder(name: str | None) -> str:
    """Make `name` the `default` embedder for the whole run; returns a short label for it."""
    if not name:
        return ""
    from django.conf import settings
    from django.test import override_settings

    backend = EMBEDDERS.get(name, name)
    current = getattr(settings, "BAILING_KNOWLEDGE", None) or {}
    override_settings(
        BAILING_KNOWLEDGE={**current, "EMBEDDERS": {"default": {"BACKEND": backend}}}
    ).enable()
    return re.sub(r"[^a-z0-9]+", "-", name.rsplit(".", 1)[-1].lower()).strip("-")


def language_switch() -> Callable[..., Any] | None:
    """`set_knowledge_base_language` where the version under test has it: in `services`,
    or in `ingestion.documents` before it moved there."""
    from bailing_knowledge import services
    from bailing_knowledge.ingestion import documents

    name = "set_knowledge_base_language"
    return getattr(services, name, None) or getattr(documents, name, None)


@contextlib.contextmanager
def language(evaluator: Evaluator, value: str) -> Iterator[None]:
    """The KB re-indexed in another language for the duration, then back to its own."""
    from django.db import connection

    set_knowledge_base_language = language_switch()
    original = {kb.pk: kb.language for kb in evaluator.kbs}

    def switch(to: dict[int, str]) -> None:
        for kb in evaluator.kbs:
            set_knowledge_base_language(kb, to[kb.pk])
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
        evaluator.reload()

    switch(dict.fromkeys(original, value))
    try:
        yield
    finally:
        switch(original)


Context = Callable[[], contextlib.AbstractContextManager[None]]
# A variant: its label, what it changes for its duration, and the configurations it runs.
Variant = tuple[str, Context, tuple[str, ...]]
BOTH_LEGS = ("lexical only", "hybrid")


def variants(evaluator: Evaluator) -> tuple[list[Variant], list[str]]:
    """(label, context, configurations) one knob at a time around the defaults, then
    combinations; and notes on the variants this version of the product cannot run."""
    from bailing_knowledge.conf import DEFAULTS

    def settings(**overrides: Any) -> Context:
        return lambda: knowledge_settings(**overrides)

    found: list[Variant] = [
        ("defaults", contextlib.nullcontext, tuple(CONFIGS)),
        ("SEARCH_CANDIDATES 20", settings(SEARCH_CANDIDATES=20), ("hybrid",)),
        ("SEARCH_CANDIDATES 100", settings(SEARCH_CANDIDATES=100), ("hybrid",)),
        ("SEARCH_MIN_SIMILARITY 0.1", settings(SEARCH_MIN_SIMILARITY=0.1), ("hybrid",)),
        ("SEARCH_MIN_SIMILARITY 0.3", settings(SEARCH_MIN_SIMILARITY=0.3), ("hybrid",)),
        ("RRF k 5", lambda: rrf_k(5), ("hybrid",)),
        ("RRF k 30", lambda: rrf_k(30), ("hybrid",)),
        ("RRF k 60", lambda: rrf_k(60), ("hybrid",)),
        *(
            (f"vector FUSION_WEIGHT {w}", settings(EMBEDDERS=vector_weight(w)), ("hybrid",))
            for w in FUSION_WEIGHTS
        ),
        ("SEARCH_EF_SEARCH 200", settings(SEARCH_EF_SEARCH=200), ("vector only", "hybrid")),
        (
            "SEARCH_EF_SEARCH 1000 (near exact)",
            settings(SEARCH_EF_SEARCH=1000),
            ("vector only", "hybrid"),
        ),
        (
            "ef_search 200 + min similarity 0.3",
            settings(SEARCH_EF_SEARCH=200, SEARCH_MIN_SIMILARITY=0.3),
            ("hybrid",),
        ),
        (
            "ef_search 200 + vector weight 0.25",
            settings(SEARCH_EF_SEARCH=200, EMBEDDERS=vector_weight(0.25)),
            ("hybrid",),
        ),
    ]
    notes = []
    if "SEARCH_BM25_K1" in DEFAULTS and "SEARCH_BM25_B" in DEFAULTS:
        found += [
            (f"SEARCH_BM25_K1 {k1}", settings(SEARCH_BM25_K1=k1), BOTH_LEGS)
            for k1 in (0.9, 1.2, 1.5)
        ]
        found += [
            (f"SEARCH_BM25_B {b}", settings(SEARCH_BM25_B=b), BOTH_LEGS) for b in (0.4, 0.6, 0.75)
        ]
    else:
        notes.append("BM25 variants skipped: no SEARCH_BM25_K1 / SEARCH_BM25_B settings")
    if language_switch() is not None:
        # Last: it re-indexes the KB twice.
        found.append(("language simple", lambda: language(evaluator, "simple"), BOTH_LEGS))
    else:
        notes.append("language variant skipped: no set_knowledge_base_language")
    return found, notes


def defaults() -> str:
    """The settings the "defaults" row runs with, read from the code under test."""
    from bailing_knowledge.conf import DEFAULTS
    from bailing_knowledge.conf import knowledge_settings as current
    from bailing_knowledge.models import KnowledgeBase
    from bailing_knowledge.retrieval import hybrid

    weight = hybrid.fusion_weight("default") if hasattr(hybrid, "fusion_weight") else 1.0
    text = (
        f"candidates {current.SEARCH_CANDIDATES}, min similarity "
        f"{current.SEARCH_MIN_SIMILARITY}, RRF k {hybrid.RRF_K}, vector weight {weight}, "
        f"ef_search {current.SEARCH_EF_SEARCH}"
    )
    if "SEARCH_BM25_K1" in DEFAULTS:
        text += f", BM25 k1 {current.SEARCH_BM25_K1} b {current.SEARCH_BM25_B}"
    languages = sorted(
        {getattr(kb, "language", "") for kb in KnowledgeBase.objects.filter(slug=KB_SLUG)}
    )
    return text + f", language {' '.join(languages) or '-'}"


# --------------------------------------------------------------------------------------------
# Main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Retrieval quality on a BEIR data set.")
    parser.add_argument("dataset", type=Path)
    parser.add_argument("--limit", type=int, help="only the first N test queries")
    parser.add_argument(
        "--embedder",
        help="the default embedder for the run: hashing, wordllama or a backend's dotted path",
    )
    parser.add_argument("--no-variants", action="store_true", help="skip the variants")
    parser.add_argument(
        "--variant-limit",
        type=int,
        default=500,
        help="the variants run on the first N test queries (default 500)",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    setup_django()
    run_label = use_embedder(args.embedder)
    from bailing_knowledge.retrieval.embedders import get_embedder

    embedder = get_embedder("default")

    data = load_beir(args.dataset)
    name = data.name
    dbname = "bench_quality_" + re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    heading(f"{name}: {len(data.corpus):,} documents, {len(data.qrels):,} test queries")
    print(f"embedder: {embedder.model_name}, fusion weight {embedder.fusion_weight}")
    load = load_corpus(data, dbname)
    print(
        f"loaded into {dbname} through upsert_documents: {load['chunks']:,} chunks in "
        f"{load['seconds']} s ({load['chunks_per_s']} chunks/s)"
    )
    evaluator = Evaluator(data, args.limit)
    results: dict[str, Any] = {
        "dataset": name,
        "queries": len(evaluator.query_ids),
        "load": load,
        "code": code_version(),
        "embedder": {"model_name": embedder.model_name, "fusion_weight": embedder.fusion_weight},
        "configs": {},
    }
    for label, config in CONFIGS.items():
        results["configs"][label] = evaluator.evaluate(**config)

    heading("Document-level quality (test split)")
    rows: list[list[Any]] = [
        [
            label,
            r["ndcg_at_10"],
            r["recall_at_3"],
            r["recall_at_10"],
            r["queries_without_hits"],
            r["search_p50_ms"],
        ]
        for label, r in results["configs"].items()
    ]
    rows += [
        [f"reference: {ref}", ndcg, recall3 if recall3 is not None else "", "", "", ""]
        for ref, ndcg, recall3 in REFERENCES.get(name, [])
    ]
    print_table(["system", "nDCG@10", "Recall@3", "Recall@10", "no hits", "p50 ms"], rows)

    configs = results["configs"]
    best_leg = max(configs["lexical only"]["ndcg_at_10"], configs["vector only"]["ndcg_at_10"])
    hybrid = configs["hybrid"]
    results["hybrid_vs_best_leg"] = round(hybrid["ndcg_at_10"] - best_leg, 4)
    wins = losses = 0
    for h, lexical, vector in zip(
        hybrid["per_query_ndcg"],
        configs["lexical only"]["per_query_ndcg"],
        configs["vector only"]["per_query_ndcg"],
        strict=True,
    ):
        wins += h > max(lexical, vector) + 1e-9
        losses += h < max(lexical, vector) - 1e-9
    results["per_query"] = {"hybrid_above_both_legs": wins, "hybrid_below_best_leg": losses}
    # Paired standard error of the mean difference, hybrid minus each leg, over the queries.
    for leg in ("lexical only", "vector only"):
        differences = [
            h - other
            for h, other in zip(
                hybrid["per_query_ndcg"], configs[leg]["per_query_ndcg"], strict=True
            )
        ]
        results["per_query"][f"hybrid_minus_{leg.split()[0]}"] = {
            "mean": round(statistics.fmean(differences), 4),
            "standard_error": round(statistics.stdev(differences) / math.sqrt(len(differences)), 4),
        }
    print(
        f"hybrid - best leg: {results['hybrid_vs_best_leg']:+.4f} nDCG@10; per query, hybrid "
        f"beats both legs on {wins} and trails the better leg on {losses} of "
        f"{len(evaluator.query_ids)}"
    )
    for key in ("hybrid_minus_lexical", "hybrid_minus_vector"):
        difference = results["per_query"][key]
        print(
            f"{key}: {difference['mean']:+.4f} "
            f"(paired standard error {difference['standard_error']})"
        )

    heading("Lexical leg: top 10 against an exhaustive BM25")
    exactness = results["lexical_exactness"] = lexical_exactness(evaluator)
    if exactness is None:
        print("skipped: this version has no bailing_knowledge.retrieval.lexical")
    else:
        print(
            f"{exactness['exact']} of {exactness['queries']} test queries have the exhaustive "
            f"top {EXACT_TOP} ({exactness['fraction']:.4f}); mean ms per query: "
            f"{exactness['mean_ms']}"
        )

    if not args.no_variants:
        heading("Variants")
        subset = Evaluator(data, min(filter(None, (args.variant_limit, args.limit)), default=None))
        found, notes = variants(subset)
        print(f"on {len(subset.query_ids)} test queries; defaults: {defaults()}\n")
        for note in notes:
            print(f"  ({note})")
        results["variants_queries"] = len(subset.query_ids)
        results["variants_notes"] = notes
        results["variants"] = []
        for label, context, legs in found:
            with context():
                for leg in legs:
                    r = subset.evaluate(**CONFIGS[leg])
                    results["variants"].append(
                        {
                            "variant": f"{leg}, {label}",
                            "ndcg_at_10": r["ndcg_at_10"],
                            "recall_at_3": r["recall_at_3"],
                            "recall_at_10": r["recall_at_10"],
                            "search_p50_ms": r["search_p50_ms"],
                        }
                    )
                    print(f"  {leg}, {label}: nDCG@10 {r['ndcg_at_10']:.4f}", flush=True)
        print()
        print_table(
            ["variant", "nDCG@10", "Recall@3", "Recall@10", "p50 ms"],
            [
                [
                    v["variant"],
                    v["ndcg_at_10"],
                    v["recall_at_3"],
                    v["recall_at_10"],
                    v["search_p50_ms"],
                ]
                for v in results["variants"]
            ],
        )

    for config in configs.values():
        del config["per_query_ndcg"]
    results["seconds"] = round(time.perf_counter() - started, 1)
    path = write_json(f"quality-{name}{'-' + run_label if run_label else ''}.json", results)
    print(f"total {results['seconds']} s; results in .data/bench/{path.name}")
    heading("Summary")
    print(f"embedder: {embedder.model_name}")
    for leg, config in LEGS.items():
        print(f"QUALITY {name} {leg} ndcg@10={configs[config]['ndcg_at_10']:.4f}")
    if exactness is None:
        print("(lexical exactness target skipped: no bailing_knowledge.retrieval.lexical)")
    else:
        target = Target(f"lexical_top10_exact_{name}", exactness["fraction"], EXACT_TARGET, True, 4)
        print(target.line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
