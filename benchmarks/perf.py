"""`make bench`: latency and throughput of the agent API, and whether they meet their targets.

a. Search through the full Django stack next to the raw SQL of the same hybrid query and of
   its vector leg alone (see `benchmarks.stack`), at every scale of the run (10k and 100k
   chunks, 1M on request); very common terms against rare terms; where the SQL's time goes;
   the lexical leg at 1M against 100k chunks on the same queries.
b. Ingestion throughput of `upsert_documents` with every index maintained.
c. Read latency of 16 KB pages of a 1 MB document through the full stack, next to the
   capabilities endpoint and the raw SQL of the page's slice of the body.
d. EXPLAIN of both legs: which indexes they use, what they read.
e. The framework: the capabilities endpoint against a bare DRF view (`benchmarks.floor`),
   persistent against per-request connections, and the HNSW `ef_search` trade-off.

Each comparison times its sides alternately, query by query, so the machine's noise hits
them alike: compare the ratios, not the absolute figures. The run ends with one line per
target, `TARGET <name> <measured> <limit> PASS|FAIL` (for a lower bound, `limit` is the
least allowed). Results go to `.data/bench/perf.json`.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import re
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from .common import (
    ROOT,
    Target,
    code_version,
    create_database,
    drop_database,
    heading,
    load_beir,
    prewarm,
    print_table,
    ratio,
    raw_connection,
    server_facts,
    setup_django,
    summary_ms,
    synthetic_documents,
    use_database,
    write_json,
)
from .embedding import query_embedding_target
from .stack import (
    FLOOR,
    LEXICAL_STEPS,
    STEPS,
    VECTOR_STEPS,
    Bench,
    CapturedSearch,
    RawSQL,
    open_bench,
    step_of,
)

# --------------------------------------------------------------------------------------------
# Scales and targets


@dataclass(frozen=True)
class Scale:
    """A benchmark database of about `chunks` chunks, named after its label (`bench_100k`)."""

    label: str
    chunks: int

    @property
    def dbname(self) -> str:
        return f"bench_{self.label}"


_SCALE = re.compile(r"(\d+)([km])")
# The scales whose search targets count; the others are measured for comparison only.
TARGET_SCALES = ("100k", "1m")
# Where the read, framework and ingestion measurements run (else the largest scale).
DETAIL_SCALE = "100k"


def parse_scales(text: str) -> list[Scale]:
    """`10k,100k,1m` → scales, smallest first."""
    scales = {}
    for item in text.lower().replace(" ", "").split(","):
        match = _SCALE.fullmatch(item)
        if not match:
            raise argparse.ArgumentTypeError(f"not a scale: {item!r} (e.g. 10k, 100k, 1m)")
        number, unit = int(match[1]), match[2]
        scales[item] = Scale(item, number * (1_000 if unit == "k" else 1_000_000))
    return sorted(scales.values(), key=lambda scale: scale.chunks)


def _median_ms(function: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 3)


def _rotated(items: Sequence[Any], turn: int) -> list[Any]:
    """`items` starting at `turn`: which side goes first changes from one query to the next."""
    turn %= len(items)
    return [*items[turn:], *items[:turn]]


# --------------------------------------------------------------------------------------------
# (a) search

SEARCH_SIDES = ("full_stack", "raw_sql", "vector_sql")


def compare_search(
    bench: Bench, searches: Sequence[CapturedSearch], rounds: int, seed: int, warmup: int = 30
) -> dict[str, Any]:
    """Full stack, the raw hybrid SQL and the raw SQL of the vector leg alone (configure and
    vector statements), alternately per query, `rounds` passes over `searches`; each side on
    a connection of its own (`Bench.vector`)."""

    def run(side: str, search: CapturedSearch) -> float:
        if side == "full_stack":
            return bench.agent.post("search", {"query": search.query})[0]
        if side == "raw_sql":
            return bench.raw.timed(search)
        return bench.vector.timed_together(search, VECTOR_STEPS)

    rng = random.Random(seed)
    for search in searches[:warmup]:
        for side in SEARCH_SIDES:
            run(side, search)
    timings: dict[str, list[float]] = {side: [] for side in SEARCH_SIDES}
    for number in range(rounds):
        order = list(searches)
        rng.shuffle(order)
        for index, search in enumerate(order):
            for side in _rotated(SEARCH_SIDES, index + number):
                timings[side].append(run(side, search))
    full, raw, vector = (summary_ms(timings[side]) for side in SEARCH_SIDES)
    return {
        "queries": len(searches),
        "rounds": rounds,
        "full_stack": full,
        "raw_sql": raw,
        "vector_sql": vector,
        "p50_over_raw": ratio(full["p50_ms"], raw["p50_ms"]),
        "p95_over_raw": ratio(full["p95_ms"], raw["p95_ms"]),
        "p50_over_vector": ratio(full["p50_ms"], vector["p50_ms"]),
        "p95_over_vector": ratio(full["p95_ms"], vector["p95_ms"]),
        "p50_overhead_ms": round(full["p50_ms"] - raw["p50_ms"], 2),
    }


def term_document_frequencies(
    corpus: Sequence[tuple[str, str]], language: str
) -> tuple[Counter[str], dict[str, str]]:
    """Abstracts holding each term as the index sees it (the knowledge base's analysis:
    stems, no stopwords), and for each term the word that most often stands for it."""
    from bailing_knowledge.retrieval.analysis import query_terms
    from bailing_knowledge.retrieval.tokenization import lexical_terms

    df: Counter[str] = Counter()
    forms: Counter[tuple[str, str]] = Counter()
    analysed: dict[str, str | None] = {}
    for title, text in corpus:
        terms = set()
        for word in lexical_terms(f"{title} {text}"):
            if word not in analysed:
                found = query_terms(word, language, max_terms=1) if word.isalpha() else []
                analysed[word] = found[0] if found else None
            if (term := analysed[word]) is not None:
                terms.add(term)
                forms[term, word] += 1
        df.update(terms)
    word_of: dict[str, str] = {}
    for (term, word), _ in forms.most_common():
        word_of.setdefault(term, word)
    return df, word_of


def common_and_rare_queries(
    corpus: Sequence[tuple[str, str]], count: int, seed: int
) -> tuple[list[str], list[str]]:
    """Queries of 3 of the 25 most frequent terms, and queries of 2 terms found in only 2-3
    abstracts; frequent and rare as the index sees them (a rare word whose stem is common,
    such as 'sexuality', is not rare), each term written as its commonest word."""
    from bailing_knowledge.retrieval.analysis import DEFAULT_LANGUAGE  # the benchmark KB's

    rng = random.Random(seed)
    df, word_of = term_document_frequencies(corpus, DEFAULT_LANGUAGE)
    common_terms = [word_of[term] for term, _ in df.most_common(25)]
    rare_terms = sorted(word_of[t] for t, n in df.items() if 2 <= n <= 3 and len(word_of[t]) >= 6)
    common = [" ".join(rng.sample(common_terms, 3)) for _ in range(count)]
    rare = [" ".join(rng.sample(rare_terms, 2)) for _ in range(count)]
    return common, rare


def unmatched_queries(count: int, seed: int) -> list[str]:
    """Queries of two made-up words that no chunk holds: a search whose lexical leg finds
    nothing after its statistics, so that what remains is the request and the vector leg.
    Most such searches find no chunk similar enough to answer with, and so skip the fetch
    and the hints a search that answers pays too: their full stack over the vector SQL is
    a floor under `search_p50_over_vector_sql`, not the whole of a real search's fixed part."""
    rng = random.Random(seed)

    def word() -> str:
        return "".join(rng.choice("bdgkpqvz") + rng.choice("aeiou") for _ in range(4))

    return [f"{word()} {word()}" for _ in range(count)]


def term_chunk_counts(bench: Bench, queries: Sequence[str]) -> list[int]:
    """How many chunks hold each term of `queries`, as the index sees the terms.

    From the lexicon (BM25's own statistics, the terms analysed in the KB's language) when
    the product has one; before it, a count of the GIN matches of each `simple` term.
    """
    from bailing_knowledge.models import KnowledgeBase

    from .build import KB_SLUG

    kb = KnowledgeBase.objects.get(slug=KB_SLUG)
    counts: list[int] = []
    with bench.raw.conn.cursor() as cursor:
        cursor.execute("SELECT to_regclass('bailing_knowledge_lexicon') IS NOT NULL")
        if cursor.fetchone()[0]:
            from bailing_knowledge.retrieval.analysis import query_terms

            terms = {t for query in queries for t in query_terms(query, kb.language)}
            cursor.execute(
                "SELECT term, chunks FROM bailing_knowledge_lexicon "
                "WHERE knowledge_base_id = %s AND term = ANY(%s)",
                [kb.pk, sorted(terms)],
            )
            found = dict(cursor.fetchall())
            counts = [int(found.get(term, 0)) for term in sorted(terms)]
        else:
            from bailing_knowledge.retrieval.tokenization import lexical_query_terms

            for term in sorted({t for query in queries for t in lexical_query_terms(query)}):
                cursor.execute(
                    "SELECT count(*) FROM bailing_knowledge_chunk "
                    "WHERE search_vector @@ to_tsquery('simple', %s)",
                    ["'" + term.replace("'", "''") + "'"],
                )
                counts.append(cursor.fetchone()[0])
    bench.raw.conn.commit()
    return counts


def common_vs_rare(
    bench: Bench, common: Sequence[CapturedSearch], rare: Sequence[CapturedSearch], rounds: int
) -> dict[str, Any]:
    """Full stack (and raw SQL) of common-term and rare-term queries, interleaved."""
    timings: dict[str, list[float]] = {"common": [], "rare": [], "common_raw": [], "rare_raw": []}
    for search in [*common, *rare]:  # warm-up
        bench.agent.post("search", {"query": search.query})
    for number in range(rounds):
        for index, (one, other) in enumerate(zip(common, rare, strict=True)):
            for kind, search in _rotated([("common", one), ("rare", other)], index + number):
                timings[kind].append(bench.agent.post("search", {"query": search.query})[0])
                timings[f"{kind}_raw"].append(bench.raw.timed(search))
    summaries = {kind: summary_ms(values) for kind, values in timings.items()}
    return {
        **summaries,
        "p50_ratio": ratio(summaries["common"]["p50_ms"], summaries["rare"]["p50_ms"]),
        "p95_ratio": ratio(summaries["common"]["p95_ms"], summaries["rare"]["p95_ms"]),
    }


def sql_breakdown(bench: Bench, groups: dict[str, Sequence[CapturedSearch]]) -> dict[str, Any]:
    """Median milliseconds of each step of the raw SQL, per group of queries."""
    result: dict[str, Any] = {}
    for name, searches in groups.items():
        spent: list[dict[str, float]] = []
        for search in searches:
            spent.append({})
            bench.raw.replay(search, spent[-1])
        steps = {step: [s.get(step, 0.0) for s in spent] for step in STEPS}
        totals = [sum(s.values()) for s in spent]
        result[name] = {
            step: summary_ms(values)["p50_ms"] for step, values in steps.items() if any(values)
        }
        result[name]["total"] = summary_ms(totals)["p50_ms"]
        result[name]["statements"] = round(statistics.fmean(len(s.statements) for s in searches), 1)
        # Several statements when the leg reads in rounds.
        result[name]["lexical statements"] = round(
            statistics.fmean(len(s.of("lexical")) for s in searches), 1
        )
    return result


def capture_all(bench: Bench, queries: Sequence[str]) -> list[CapturedSearch]:
    return [bench.capture(query) for query in queries]


def lexical_scaling(
    small: tuple[str, Sequence[CapturedSearch]],
    large: tuple[str, Sequence[CapturedSearch]],
    rounds: int,
    seed: int,
) -> dict[str, Any]:
    """The lexical leg alone (its lexicon and lexical statements, after the configure
    statement) at two scales, the same queries, alternately query by query."""
    (small_db, small_searches), (large_db, large_searches) = small, large
    by_query = {s.query: s for s in large_searches}
    pairs = [
        (s, by_query[s.query])
        for s in small_searches
        if s.query in by_query and (s.of(*LEXICAL_STEPS) or by_query[s.query].of(*LEXICAL_STEPS))
    ]
    connections = {"small": RawSQL(small_db), "large": RawSQL(large_db)}

    def run(side: str, pair: tuple[CapturedSearch, CapturedSearch]) -> float:
        search = pair[0] if side == "small" else pair[1]
        return connections[side].timed_steps(search, LEXICAL_STEPS, untimed=("configure",))

    try:
        for pair in pairs:  # warm-up
            run("small", pair)
            run("large", pair)
        timings: dict[str, list[float]] = {"small": [], "large": []}
        rng = random.Random(seed)
        for number in range(rounds):
            order = list(pairs)
            rng.shuffle(order)
            for index, pair in enumerate(order):
                for side in _rotated(("small", "large"), index + number):
                    timings[side].append(run(side, pair))
    finally:
        for raw in connections.values():
            raw.close()
    small_summary, large_summary = summary_ms(timings["small"]), summary_ms(timings["large"])
    return {
        "queries": len(pairs),
        "rounds": rounds,
        small_db: small_summary,
        large_db: large_summary,
        "p50_ratio": ratio(large_summary["p50_ms"], small_summary["p50_ms"]),
        "p95_ratio": ratio(large_summary["p95_ms"], small_summary["p95_ms"]),
    }


# --------------------------------------------------------------------------------------------
# (e) the framework


def capabilities_vs_floor(bench: Bench, requests: int) -> dict[str, Any]:
    """The capabilities endpoint and the bare DRF view of `benchmarks.floor`, alternately."""
    floor_path = FLOOR.format(route=bench.agent.route)
    sides: dict[str, Callable[[], float]] = {
        "capabilities": lambda: bench.agent.call("get", "capabilities")[0],
        "floor": lambda: bench.agent.request("get", floor_path)[0],
    }
    for _ in range(20):
        for call in sides.values():
            call()
    timings: dict[str, list[float]] = {side: [] for side in sides}
    for number in range(requests):
        for side in _rotated(list(sides), number):
            timings[side].append(sides[side]())
    summaries = {side: summary_ms(values) for side, values in timings.items()}
    return {
        **summaries,
        "p50_ratio": ratio(summaries["capabilities"]["p50_ms"], summaries["floor"]["p50_ms"]),
        "p50_difference_ms": round(
            summaries["capabilities"]["p50_ms"] - summaries["floor"]["p50_ms"], 2
        ),
    }


def request_floor_parts(bench: Bench, repeat: int = 300) -> dict[str, float]:
    """Median ms of the per-request lookups, through the ORM and as the same SQL on a cursor."""
    from django.db import connection

    from bailing_knowledge import permissions
    from bailing_knowledge.models import AgentSession, hash_token

    digest = hash_token(bench.agent.headers["Authorization"].split()[1])
    query = AgentSession.objects.select_related("client").filter(token_hash=digest)[:1]
    sql, params = query.query.sql_with_params()

    def raw() -> None:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            cursor.fetchone()

    def orm() -> Any:
        return AgentSession.objects.select_related("client").filter(token_hash=digest).first()

    session = orm()
    parts: dict[str, Callable[[], Any]] = {
        "session lookup through the ORM": orm,
        "the same SQL on a cursor": raw,
        "SELECT 1 round trip": lambda: connection.cursor().execute("SELECT 1"),
    }
    if hasattr(permissions, "allowed_route"):
        parts["route re-check (permissions.allowed_route)"] = lambda: permissions.allowed_route(
            session, bench.route.route_key
        )
    for function in parts.values():
        _median_ms(function, 30)
    return {name: _median_ms(function, repeat) for name, function in parts.items()}


def connection_modes(bench: Bench, requests: int) -> dict[str, Any]:
    """Capabilities endpoint with persistent connections against one connection per request."""
    from django.db import connection

    timings: dict[str, list[float]] = {"persistent": [], "per_request": []}
    for number in range(requests):
        for mode in _rotated(("persistent", "per_request"), number):
            connection.close()
            connection.settings_dict["CONN_MAX_AGE"] = 60 if mode == "persistent" else 0
            bench.agent.call("get", "capabilities")  # opens the connection
            timings[mode].append(bench.agent.call("get", "capabilities")[0])
    connection.close()
    connection.settings_dict["CONN_MAX_AGE"] = 60
    summaries = {mode: summary_ms(values) for mode, values in timings.items()}
    return {
        **summaries,
        "p50_ratio": ratio(summaries["per_request"]["p50_ms"], summaries["persistent"]["p50_ms"]),
        "p50_cost_ms": round(
            summaries["per_request"]["p50_ms"] - summaries["persistent"]["p50_ms"], 2
        ),
    }


def _vector_leg(bench: Bench, search: CapturedSearch, setting: str | None) -> list[int]:
    """The captured vector leg after the captured configuration plus one extra SET LOCAL."""
    (configure_sql, configure_params), *_ = search.of("configure")
    (vector_sql, vector_params), *_ = search.of("vector")
    with bench.raw.conn.cursor() as cursor:
        cursor.execute(configure_sql, configure_params)
        if setting:
            cursor.execute(setting)
        cursor.execute(vector_sql, vector_params)
        ids = [row[0] for row in cursor.fetchall()]
    bench.raw.conn.commit()
    return ids


def ef_search_sweep(
    bench: Bench, searches: Sequence[CapturedSearch], values: Sequence[int]
) -> list[dict[str, Any]]:
    """The vector leg alone: latency and recall against an exact scan, per `hnsw.ef_search`."""
    searches = [s for s in searches if s.of("vector")]
    # The exact scan reads every vector: at a million chunks it outlasts the search's own
    # statement timeout, which is lifted for it.
    exact_scan = (
        "SELECT set_config('enable_indexscan', 'off', true),"
        " set_config('statement_timeout', '0', true)"
    )
    exact = [_vector_leg(bench, s, exact_scan) for s in searches]
    rows = []
    for ef in values:
        times: list[float] = []
        recall10: list[float] = []
        recall_all: list[float] = []
        for _ in range(2):
            for search, truth in zip(searches, exact, strict=True):
                start = time.perf_counter()
                found = _vector_leg(bench, search, f"SET LOCAL hnsw.ef_search = {int(ef)}")
                times.append(time.perf_counter() - start)
                if truth:
                    recall_all.append(len(set(found) & set(truth)) / len(truth))
                    recall10.append(len(set(found[:10]) & set(truth[:10])) / len(truth[:10]))
        summary = summary_ms(times)
        rows.append(
            {
                "ef_search": ef,
                "p50_ms": summary["p50_ms"],
                "p95_ms": summary["p95_ms"],
                "recall_at_10": round(statistics.fmean(recall10), 3) if recall10 else None,
                "recall_of_candidates": round(statistics.fmean(recall_all), 3)
                if recall_all
                else None,
            }
        )
    return rows


# --------------------------------------------------------------------------------------------
# (d) EXPLAIN

# Scans of the product's tables and indexes (not of the catalogs).
_SCAN = re.compile(
    r"((?:Bitmap Index|Index Only|Index|Seq) Scan)(?: using| on) ((?:bk_|bailing_)\S+)"
)
_BUFFERS = re.compile(r"(?:hit|read)=(\d+)")
_EXECUTION = re.compile(r"Execution Time: ([\d.]+) ms")


def explain(bench: Bench, search: CapturedSearch) -> dict[str, Any]:
    """EXPLAIN ANALYZE of the statements of both legs, in the order the search sent them,
    after its own configuration: per leg, the statements, their time, the buffers they
    touched and the scans of their plans."""
    legs = ("lexicon", "lexical", "vector")
    plans: list[tuple[str, list[str]]] = []
    (configure_sql, configure_params), *_ = search.of("configure")
    with bench.raw.conn.cursor() as cursor:
        cursor.execute(configure_sql, configure_params)
        for sql, params in search.of(*legs):
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql, params)
            plans.append((step_of(sql), _lines(cursor)))
    bench.raw.conn.rollback()
    result: dict[str, Any] = {"query": search.query}
    for leg in legs:
        leg_plans = [lines for step, lines in plans if step == leg]
        scans = sorted(
            {
                " ".join(m.groups())
                for lines in leg_plans
                for line in lines
                for m in _SCAN.finditer(line)
            }
        )
        # The first Buffers line of a plan is its top node's: the whole statement's.
        buffers = sum(
            sum(map(int, _BUFFERS.findall(next((x for x in lines if "Buffers:" in x), ""))))
            for lines in leg_plans
        )
        milliseconds = sum(
            float(m[1]) for lines in leg_plans for line in lines if (m := _EXECUTION.search(line))
        )
        result[leg] = {
            "statements": len(leg_plans),
            "execution_ms": round(milliseconds, 2),
            "buffers": buffers,
            "scans": scans,
            "plans": leg_plans,
        }
    result["vector_uses_hnsw"] = any(
        "bk_chunk_embedding_hnsw_384" in scan for scan in result["vector"]["scans"]
    )
    result["lexical_uses_gin"] = any(
        "bk_chunk_search_vector_gin" in scan for scan in result["lexical"]["scans"]
    )
    return result


def _lines(cursor: Any) -> list[str]:
    return [row[0].strip() for row in cursor.fetchall()]


def print_explain(label: str, plan: dict[str, Any]) -> None:
    print(f"{label}: query {plan['query']!r}")
    for leg in ("lexicon", "lexical", "vector"):
        part = plan[leg]
        if part["statements"]:
            print(
                f"  {leg}: {part['statements']} statement(s), {part['execution_ms']} ms, "
                f"{part['buffers']:,} buffers; {'; '.join(part['scans']) or 'no scan'}"
            )


# --------------------------------------------------------------------------------------------
# (c) read

_SLICE = "SELECT substr(body, %s, %s) FROM bailing_knowledge_document WHERE id = %s"


def compare_read(bench: Bench, chains: int) -> dict[str, Any]:
    """Whole read chains (16 KB pages) of the 1 MB document: each page next to a request to
    the capabilities endpoint and the raw SQL of that page's slice of the body, the three
    alternately, page by page."""
    from bailing_knowledge.models import Chunk, Document
    from bailing_knowledge.retrieval.hybrid import Hit
    from bailing_knowledge.services.search import sign_hits

    from .build import BIG_DOCUMENT_KEY

    document = Document.objects.defer("body").get(source_key=BIG_DOCUMENT_KEY)
    body = Document.objects.values_list("body", flat=True).get(pk=document.pk)
    chunk = (
        Chunk.objects.filter(document=document, start__gte=len(body) // 2).order_by("start").first()
    )
    assert chunk is not None
    # The hit a search would return for this chunk, signed as the search endpoint signs it.
    values = {
        "chunk_id": chunk.pk,
        "document_id": document.pk,
        "knowledge_base_id": document.knowledge_base_id,
        "revision": chunk.revision,
        "start": chunk.start,
        "end": chunk.end,
        "text": chunk.text,
        "title": document.title,
        "content_hash": document.content_hash,
        "score": 1.0,
    }
    hit = Hit(**{f.name: values[f.name] for f in fields(Hit) if f.name in values})
    ref = sign_hits(bench.session, bench.route, [hit])[0]["ref"]

    def pages() -> Any:
        """The pages of one chain, each as (seconds, page) when it is asked for."""
        request: dict[str, Any] = {"ref": ref, "max_bytes": 16384}
        while True:
            elapsed, page = bench.agent.post("read", request)
            yield elapsed, page
            if not page["next_cursor"]:
                return
            request = {"ref": ref, "cursor": page["next_cursor"], "max_bytes": 16384}

    # Every chain reads the same pages: their places in the body, from a first chain.
    offsets: list[tuple[int, int]] = []
    for _, page in pages():
        content = page["content"]
        start = offsets[-1][0] + offsets[-1][1] if offsets else 0
        if body[start : start + len(content)] != content:
            start = body.find(content)
        assert start >= 0, "a page's content is not a slice of the body"
        offsets.append((start, len(content)))

    def raw_slice(number: int) -> float:
        start, length = offsets[number]
        begin = time.perf_counter()
        with bench.raw.conn.cursor() as cursor:
            cursor.execute(_SLICE, [start + 1, length, document.pk])
            cursor.fetchone()
        bench.raw.conn.commit()
        return time.perf_counter() - begin

    def capabilities() -> float:
        return bench.agent.call("get", "capabilities")[0]

    timings: dict[str, list[float]] = {
        "first": [],
        "following": [],
        "capabilities": [],
        "slice": [],
    }
    for chain in range(chains + 2):
        record = chain >= 2  # two warm-up chains
        chain_pages = pages()
        number = 0
        while True:
            spent: dict[str, float] = {}
            for side in _rotated(("page", "capabilities", "slice"), chain + number):
                if side == "page":
                    item = next(chain_pages, None)
                    if item is None:
                        break
                    spent["page"] = item[0]
                elif side == "capabilities":
                    spent["capabilities"] = capabilities()
                else:
                    spent["slice"] = raw_slice(min(number, len(offsets) - 1))
            if "page" not in spent:
                break
            if record:
                timings["first" if number == 0 else "following"].append(spent.pop("page"))
                for side, seconds in spent.items():
                    timings[side].append(seconds)
            number += 1
    every = summary_ms(timings["first"] + timings["following"])
    capabilities_summary = summary_ms(timings["capabilities"])
    slice_summary = summary_ms(timings["slice"])
    limit = capabilities_summary["p50_ms"] + 2 * slice_summary["p50_ms"]
    return {
        "document_bytes": len(body.encode("utf-8")),
        "document_characters": len(body),
        "pages_per_chain": len(offsets),
        "chains": chains,
        "page_characters_median": int(statistics.median(length for _, length in offsets)),
        "page": every,
        "first_page": summary_ms(timings["first"]),
        "following_pages": summary_ms(timings["following"]),
        "capabilities": capabilities_summary,
        "raw_slice": slice_summary,
        "page_p50_limit_ms": round(limit, 3),
    }


# --------------------------------------------------------------------------------------------
# (b) ingestion


def _ingest(
    corpus: Sequence[tuple[str, str]], seed: int, min_chunks: int, prefix: str, *, bulk: bool
) -> dict[str, Any]:
    """New documents until `min_chunks` chunks: through `upsert_documents` (`bulk`) or a loop
    of `upsert_document`, whose preparation (chunk, embed, encode) is timed apart: each
    document is prepared once more through `prepare_documents`, outside the loop's time."""
    from django.db import connection

    from bailing_knowledge.ingestion import documents

    from .build import KB_SLUG

    source = synthetic_documents(corpus, seed=seed)
    chunks = count = 0
    prepare = 0.0
    start = time.perf_counter()
    if bulk:

        def inputs() -> Any:
            for number in range(10**9):
                title, body = next(source)
                yield documents.DocumentInput(f"{prefix}-{number:05d}.md", title, body)

        for result in documents.upsert_documents(KB_SLUG, inputs()):
            chunks += result.chunks
            count += 1
            if chunks >= min_chunks:
                break
    else:
        from bailing_knowledge.lookups import get_knowledge_base

        kb = get_knowledge_base(KB_SLUG)
        aside = 0.0  # the preparation timed on its own, left out of the loop's time
        while chunks < min_chunks:
            title, body = next(source)
            key = f"{prefix}-{count:05d}.md"
            begin = time.perf_counter()
            document = documents.clean_document(key, title, body)
            middle = time.perf_counter()
            documents.prepare_documents(kb.embedder, kb.language, [document])
            end = time.perf_counter()
            prepare += end - middle
            aside += end - begin
            chunks += documents.upsert_document(KB_SLUG, key, title, body).chunks
            count += 1
        start += aside
    total = time.perf_counter() - start
    connection.close()
    return {
        "documents": count,
        "chunks": chunks,
        "seconds": round(total, 1),
        "chunks_per_s": round(chunks / total),
        **({} if bulk else {"prepare_s": prepare}),
    }


def _ingest_row(run: dict[str, Any]) -> list[Any]:
    return [run["chunks"], run["documents"], run["seconds"], run["chunks_per_s"]]


def _ingest_worker(
    dbname: str, corpus: Sequence[tuple[str, str]], seed: int, chunks: int, queue: Any
) -> None:
    use_database(dbname)
    queue.put(_ingest(corpus, seed, chunks, f"worker{seed}", bulk=True))


def ingestion(
    template: str, corpus: Sequence[tuple[str, str]], chunks: int, workers: int
) -> dict[str, Any]:
    """Ingest into a copy of `template`, HNSW and GIN maintained: `upsert_documents` in one
    process, a loop of `upsert_document`, `upsert_documents` in `workers` processes, and
    `upsert_documents` again without the HNSW index (what maintaining it costs)."""
    from django.db import connections

    dbname = "bench_ingest"
    connections.close_all()
    create_database(dbname, template=template)
    use_database(dbname)
    bulk = _ingest(corpus, 7001, chunks, "bulk", bulk=True)
    single = _ingest(corpus, 7002, chunks // 2, "single", bulk=False)
    prepare = single.pop("prepare_s")
    database = single["seconds"] - prepare
    single["ms_per_chunk"] = {
        "chunk_embed_encode": round(prepare / single["chunks"] * 1000, 2),
        "database": round(database / single["chunks"] * 1000, 2),
    }
    result: dict[str, Any] = {
        "into": f"a copy of {template}",
        "upsert_documents": bulk,
        "upsert_document_loop": single,
    }
    connections.close_all()  # nothing shared with the forked workers
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    processes = [
        context.Process(
            target=_ingest_worker, args=(dbname, corpus, 8000 + n, chunks // workers, queue)
        )
        for n in range(workers)
    ]
    start = time.perf_counter()
    for process in processes:
        process.start()
    results = [queue.get() for _ in processes]
    for process in processes:
        process.join()
    elapsed = time.perf_counter() - start
    total = sum(part["chunks"] for part in results)
    result["parallel"] = {
        "processes": workers,
        "chunks": total,
        "seconds": round(elapsed, 1),
        "chunks_per_s": round(total / elapsed),
    }
    with raw_connection(dbname, autocommit=True) as conn:
        conn.execute("DROP INDEX bk_chunk_embedding_hnsw_384")
    use_database(dbname)
    result["upsert_documents_without_hnsw"] = _ingest(corpus, 9001, chunks, "nohnsw", bulk=True)
    drop_database(dbname)
    return result


# --------------------------------------------------------------------------------------------
# Main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Latency and throughput benchmarks.")
    parser.add_argument("--dataset", type=Path, default=ROOT.parent / "shared/datasets/nfcorpus")
    parser.add_argument("--rounds", type=int, default=2, help="passes over the test queries")
    parser.add_argument(
        "--scales",
        type=parse_scales,
        default=parse_scales("10k,100k"),
        help="databases to measure, in chunks (default 10k,100k; e.g. 10k,100k,1m)",
    )
    parser.add_argument("--quick", action="store_true", help="few iterations: a smoke test")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    setup_django()

    from .build import BIG_DOCUMENT_FROM_CHUNKS, ensure_scale_database

    quick = args.quick
    rounds = 1 if quick else args.rounds
    scales: list[Scale] = args.scales
    labels = [scale.label for scale in scales]
    detail = next((s for s in scales if s.label == DETAIL_SCALE), scales[-1])
    data = load_beir(args.dataset)
    corpus = [data.corpus[key] for key in sorted(data.corpus)]
    texts = sorted({data.queries[q] for q in data.qrels})
    if quick:
        texts = texts[:40]
    results: dict[str, Any] = {"dataset": data.name, "scales": labels, "builds": {}, "search": {}}
    timings: dict[str, float] = {}

    def lap(name: str, since: float) -> None:
        timings[name] = round(time.perf_counter() - since, 1)

    heading("Databases")
    for scale in scales:
        start = time.perf_counter()
        results["builds"][scale.label] = ensure_scale_database(
            scale.dbname, scale.chunks, args.dataset
        )
        lap(f"build_{scale.label}_s", start)
    print_table(
        ["scale", "reused", "chunks", "documents", "build s", "load s", "index builds s"],
        [
            [
                label,
                b["reused"],
                b["total_chunks"],
                b["total_documents"],
                b.get("build_s", "-"),
                b.get("upsert_documents_s", "-"),
                " / ".join(f"{name} {s}" for name, s in b.get("index_build_s", {}).items()),
            ]
            for label, b in results["builds"].items()
        ],
    )
    parts = list(next(iter(results["builds"].values()))["bytes"])
    for title, cell in (
        ("storage, MB", lambda size, _: "-" if size is None else f"{size / 2**20:,.1f}"),
        ("storage per chunk, bytes (size / chunks)", _per_chunk),
    ):
        print(f"{title}:\n")
        print_table(
            ["scale", *parts],
            [
                [label, *(cell(b["bytes"][part], b["total_chunks"]) for part in parts)]
                for label, b in results["builds"].items()
            ],
        )
    # Every scale's pages in the page cache before anything is timed, however cold the server.
    warmed = {scale.label: prewarm(scale.dbname) for scale in scales}
    results["prewarm"] = warmed
    for label, w in warmed.items():
        done = f"{w['mb']:,} MB in {w['s']} s" if w["prewarmed"] else f"not read: {w['reason']}"
        print(f"read into the page cache, {label} (pg_prewarm): {done}")
    print()
    results["server"] = server_facts(detail.dbname)
    results["code"] = code_version()
    print("server:", results["server"])

    heading("(a) Search: full stack against the raw SQL of the hybrid query and of its vector leg")
    common_text, rare_text = common_and_rare_queries(corpus, 8 if quick else 20, seed=5)
    captured: dict[str, list[CapturedSearch]] = {}
    for scale in scales:
        start = time.perf_counter()
        bench = open_bench(scale.dbname)
        try:
            searches = captured[scale.label] = capture_all(bench, texts)
            search = results["search"][scale.label] = compare_search(
                bench, searches, rounds, seed=11
            )
            common, rare = capture_all(bench, common_text), capture_all(bench, rare_text)
            cvr = search["common_vs_rare"] = common_vs_rare(bench, common, rare, 2 if quick else 4)
            cvr["examples"] = {"common": common_text[:3], "rare": rare_text[:3]}
            cvr["common_term_chunks_min"] = min(term_chunk_counts(bench, common_text), default=0)
            cvr["rare_term_chunks_max"] = max(term_chunk_counts(bench, rare_text), default=0)
            unmatched = capture_all(bench, unmatched_queries(8 if quick else 40, seed=7))
            assert not any(s.of("lexical") for s in unmatched), "a made-up word matched"
            search["no_lexical_match"] = compare_search(bench, unmatched, 2, seed=17, warmup=5)
            # Those whose vector leg found a chunk similar enough to fetch and answer with.
            search["no_lexical_match"]["answered"] = sum(1 for s in unmatched if s.of("fetch"))
            search["sql_breakdown"] = sql_breakdown(
                bench, {"test queries": searches[:100], "common terms": common, "rare terms": rare}
            )
            search["explain"] = {
                "test query": explain(bench, searches[0]),
                "common terms": explain(bench, common[0]),
            }
        finally:
            bench.close()
        lap(f"search_{scale.label}_s", start)
    print(f"{len(texts)} {data.name} test queries, {rounds} round(s), milliseconds:\n")
    print_table(
        ["chunks", "full p50 / p95", "hybrid SQL p50 / p95", "vector SQL p50 / p95",
         "full/vector p50", "full/vector p95", "full/hybrid p50", "+p50"],
        [
            [
                label,
                _pair(s["full_stack"]),
                _pair(s["raw_sql"]),
                _pair(s["vector_sql"]),
                s["p50_over_vector"],
                s["p95_over_vector"],
                s["p50_over_raw"],
                s["p50_overhead_ms"],
            ]
            for label, s in results["search"].items()
        ],
    )  # fmt: skip
    print(
        f"common-term queries (3 of the 25 commonest terms, e.g. {common_text[0]!r}) against "
        f"rare-term queries (2 terms of 2-3 abstracts, e.g. {rare_text[0]!r}), milliseconds:\n"
    )
    print_table(
        ["chunks", "common full", "rare full", "common SQL", "rare SQL", "p50 ratio",
         "p95 ratio", "common term ≥ chunks", "rare term ≤ chunks"],
        [
            [
                label,
                *(_pair(c[kind]) for kind in ("common", "rare", "common_raw", "rare_raw")),
                c["p50_ratio"],
                c["p95_ratio"],
                c["common_term_chunks_min"],
                c["rare_term_chunks_max"],
            ]
            for label, s in results["search"].items()
            for c in [s["common_vs_rare"]]
        ],
    )  # fmt: skip
    print(
        "searches whose words no chunk holds (the request and the vector leg, no lexical "
        "reading; the fetch and the hints only for those that answer), milliseconds: a floor "
        "under full/vector with this framework\n"
    )
    print_table(
        ["chunks", "full p50 / p95", "vector SQL p50 / p95", "full/vector p50", "full/vector p95",
         "answered"],
        [
            [label, _pair(n["full_stack"]), _pair(n["vector_sql"]), n["p50_over_vector"],
             n["p95_over_vector"], f"{n['answered']} of {n['queries']}"]
            for label, s in results["search"].items()
            for n in [s["no_lexical_match"]]
        ],
    )  # fmt: skip
    print("where the raw SQL's time goes (median ms per step; statements per search):\n")
    shown = ("configure", "lexicon", "lexical", "vector", "fetch", "other", "total")
    counts = ("statements", "lexical statements")
    print_table(
        ["chunks", "queries", *shown, *counts],
        [
            [label, name, *(steps.get(k, 0.0) for k in (*shown, *counts))]
            for label, s in results["search"].items()
            for name, steps in s["sql_breakdown"].items()
        ],
    )
    print("(d) EXPLAIN ANALYZE of each leg's statements, after the search's configuration:\n")
    for label, s in results["search"].items():
        for name, plan in s["explain"].items():
            print_explain(f"{label}, {name}", plan)
    print()

    if "100k" in captured and "1m" in captured:
        heading("The lexical leg at 1M chunks against 100k, same queries")
        start = time.perf_counter()
        scaling = results["lexical_1m_over_100k"] = lexical_scaling(
            ("bench_100k", captured["100k"]), ("bench_1m", captured["1m"]), rounds, seed=13
        )
        lap("lexical_scaling_s", start)
        print(
            f"lexicon and lexical statements replayed, {scaling['queries']} queries, "
            f"{rounds} round(s), milliseconds:\n"
        )
        print_table(
            ["chunks", "p50", "p95"],
            [
                [label, scaling[db]["p50_ms"], scaling[db]["p95_ms"]]
                for label, db in (("100k", "bench_100k"), ("1m", "bench_1m"))
            ],
        )
        print(f"1m / 100k: p50 x {scaling['p50_ratio']}, p95 x {scaling['p95_ratio']}")

    heading(f"(e) The framework at {detail.label}")
    start = time.perf_counter()
    bench = open_bench(detail.dbname)
    floor = results["capabilities_vs_floor"] = capabilities_vs_floor(bench, 100 if quick else 400)
    print(
        f"capabilities endpoint p50 {floor['capabilities']['p50_ms']} ms, bare DRF view with "
        f"one token lookup p50 {floor['floor']['p50_ms']} ms (+{floor['p50_difference_ms']} ms, "
        f"x {floor['p50_ratio']}), {floor['floor']['n']} requests each"
    )
    results["request_floor_parts"] = request_floor_parts(bench, 100 if quick else 300)
    print("per-request lookups alone, median ms:", results["request_floor_parts"])
    conn = results["connections"] = connection_modes(bench, 20 if quick else 60)
    print(
        f"capabilities endpoint, {conn['persistent']['n']} requests each: persistent p50 "
        f"{conn['persistent']['p50_ms']} ms, a new connection per request p50 "
        f"{conn['per_request']['p50_ms']} ms (+{conn['p50_cost_ms']} ms, "
        f"ratio {conn['p50_ratio']})\n"
    )
    sweep = results["ef_search"] = ef_search_sweep(
        bench, captured[detail.label][: 30 if quick else 100], (40, 64, 128, 200)
    )
    print("vector leg alone (raw SQL); recall against an exact scan of the same statement:\n")
    keys = ("ef_search", "p50_ms", "p95_ms", "recall_at_10", "recall_of_candidates")
    print_table(list(keys), [[r[k] for k in keys] for r in sweep])
    lap("framework_s", start)

    if detail.chunks >= BIG_DOCUMENT_FROM_CHUNKS:
        heading(f"(c) Read: 16 KB pages of the 1 MB document at {detail.label}")
        start = time.perf_counter()
        read = results["read"] = compare_read(bench, 10 if quick else 40)
        lap("read_s", start)
        print_table(
            ["", "p50 ms", "p95 ms", "n"],
            [
                [name, read[key]["p50_ms"], read[key]["p95_ms"], read[key]["n"]]
                for name, key in (
                    ("full stack, any page", "page"),
                    ("full stack, first page of a chain", "first_page"),
                    ("full stack, following pages", "following_pages"),
                    ("capabilities endpoint", "capabilities"),
                    ("raw SQL of the page's slice", "raw_slice"),
                )
            ],
        )
        print(
            f"document {read['document_bytes']:,} bytes, {read['pages_per_chain']} pages per "
            f"chain, median page {read['page_characters_median']:,} characters; page p50 "
            f"limit (capabilities p50 + 2 x slice p50): {read['page_p50_limit_ms']} ms"
        )
    bench.close()

    heading("(b) Ingestion with every index maintained")
    start = time.perf_counter()
    template = "bench_100k" if "100k" in labels else detail.dbname
    ingest = results["ingestion"] = ingestion(template, corpus, 600 if quick else 6000, 2)
    lap("ingestion_s", start)
    bulk, loop = ingest["upsert_documents"], ingest["upsert_document_loop"]
    two, bare = ingest["parallel"], ingest["upsert_documents_without_hnsw"]
    print(f"into {ingest['into']}, new documents of about 15 chunks:")
    print_table(
        ["how", "chunks", "documents", "seconds", "chunks/s"],
        [
            ["upsert_documents, one process", *_ingest_row(bulk)],
            ["upsert_document loop, one process", *_ingest_row(loop)],
            [f"upsert_documents, {two['processes']} processes", two["chunks"], "-",
             two["seconds"], two["chunks_per_s"]],
            ["upsert_documents, HNSW index dropped", *_ingest_row(bare)],
        ],
    )  # fmt: skip
    print("upsert_document loop, ms per chunk:", loop["ms_per_chunk"])

    lap("total_s", started)
    results["timings"] = timings
    found = targets(results)
    embedding = query_embedding_target()  # WordLlama's, when its extra is installed
    if embedding is not None:
        found.append(embedding)
    results["targets"] = [target.as_dict() for target in found]
    path = write_json("perf.json", results)
    print(f"\ntimings (s): {timings}")
    print(f"results: {path.relative_to(ROOT)}")
    heading("Targets")
    for target in found:
        print(target.line())
    return 0


def targets(results: dict[str, Any]) -> list[Target]:
    """The acceptance targets measured in this run, from the unrounded summaries."""
    found: list[Target] = []
    for label, search in results["search"].items():
        if label not in TARGET_SCALES:
            continue
        full, vector = search["full_stack"], search["vector_sql"]
        found += [
            Target(f"search_p50_over_vector_sql_{label}", full["p50_ms"] / vector["p50_ms"], 3),
            Target(f"search_p95_over_vector_sql_{label}", full["p95_ms"] / vector["p95_ms"], 5),
        ]
    for label, search in results["search"].items():
        if label in TARGET_SCALES:
            cvr = search["common_vs_rare"]
            found.append(
                Target(
                    f"common_over_rare_p50_{label}",
                    cvr["common"]["p50_ms"] / cvr["rare"]["p50_ms"],
                    2,
                )
            )
    if "lexical_1m_over_100k" in results:
        scaling = results["lexical_1m_over_100k"]
        found.append(
            Target(
                "lexical_p95_1m_over_100k",
                scaling["bench_1m"]["p95_ms"] / scaling["bench_100k"]["p95_ms"],
                2,
            )
        )
    if "read" in results:
        read = results["read"]
        found.append(Target("read_page_p50_ms", read["page"]["p50_ms"], read["page_p50_limit_ms"]))
    floor = results["capabilities_vs_floor"]
    found.append(
        Target(
            "capabilities_over_floor_p50",
            floor["capabilities"]["p50_ms"] / floor["floor"]["p50_ms"],
            1.5,
        )
    )
    found.append(
        Target(
            "ingestion_chunks_per_s",
            results["ingestion"]["upsert_documents"]["chunks_per_s"],
            500,
            at_least=True,
        )
    )
    return found


def _pair(summary: dict[str, float]) -> str:
    return f"{summary['p50_ms']:.1f} / {summary['p95_ms']:.1f}"


def _per_chunk(size: int | None, chunks: int) -> str:
    return "-" if size is None or not chunks else f"{size / chunks:,.0f}"


if __name__ == "__main__":
    raise SystemExit(main())
