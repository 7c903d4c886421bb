"""Build (or reuse) the benchmark databases: 10k, 100k and (on request) 1M chunks.

Documents are realistic text: NFCorpus abstracts joined into documents of 4-12 abstracts,
each copy varied (a sentence dropped, the sentences rotated) so that no chunk repeats.

How the rows are written: through the product's own `upsert_documents` (chunker, the default
`HashingEmbedder`, binary COPY), with the HNSW and GIN indexes dropped during the load and
re-created from their own definitions afterwards (building an HNSW index is much faster than
inserting 100k rows into one). One large document (about 1 MB, for the read benchmark) is
then ingested through `upsert_document`, indexes in place (at 100k chunks and above).

Nothing holds more than one batch of documents in memory: the documents are generated as
`upsert_documents` consumes them, so 1M chunks build like 100k, ten times longer.

A database is reused when its recorded build version matches (see `build_version`), so a
second `make bench` skips the build; the build's own facts (time, index builds) are kept
with the version and reported again on reuse.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .common import (
    create_database,
    database_version,
    load_beir,
    raw_connection,
    set_database_version,
    synthetic_documents,
    use_database,
)

BUILD_VERSION = "bench-build-5"
KB_SLUG = "bench"
ROUTE_KEY = "bench"
CLIENT_APP_ID = "bench-agent"
BIG_DOCUMENT_KEY = "handbook-1mb.md"
BIG_DOCUMENT_BYTES = 1_000_000
INDEXES = ("bk_chunk_embedding_hnsw_384", "bk_chunk_search_vector_gin")
SEED = 20240601
# The big document goes into every database of at least this many chunks.
BIG_DOCUMENT_FROM_CHUNKS = 100_000


def build_version(target_chunks: int, dataset: Path) -> str:
    """Everything that changes the built data: bump `BUILD_VERSION` when this file changes."""
    from django.db import connection

    from bailing_knowledge import models
    from bailing_knowledge.conf import knowledge_settings
    from bailing_knowledge.retrieval.embedders import get_embedder

    # The columns of the tables the data lives in, and the indexes the benchmark searches
    # through: another shape rebuilds, while migrations that leave them alone (an index for
    # another embedding size, a storage parameter) are applied to the reused database
    # (`migrate`).
    shape = [
        f"{field.column}:{field.db_type(connection)}"
        for model in (models.KnowledgeBase, models.Document, models.Chunk, models.LexiconTerm)
        for field in model._meta.concrete_fields
    ] + [
        index.name
        for index in models.Chunk._meta.indexes
        if index.name in INDEXES or not index.name.startswith("bk_chunk_embedding_hnsw_")
    ]
    corpus = dataset / "corpus.jsonl"
    stat = corpus.stat()
    return "|".join(
        [
            BUILD_VERSION,
            f"chunks={target_chunks}",
            get_embedder("default").model_name,
            f"chunking={knowledge_settings.CHUNK_TARGET_CHARS}/{knowledge_settings.CHUNK_OVERLAP_CHARS}",
            "schema=" + hashlib.sha256("|".join(shape).encode()).hexdigest()[:12],
            f"corpus={stat.st_size}",
            f"lexical-format={_lexical_format()}",
        ]
    )


def _lexical_format() -> int:
    """The lexical index format the rows were written in (0 before the BM25 index)."""
    try:
        from bailing_knowledge.retrieval import postings
    except ImportError:  # before the format had a module of its own
        from bailing_knowledge.retrieval import lexical as postings

    return getattr(postings, "INDEX_FORMAT", 0)


# --------------------------------------------------------------------------------------------
# Loading


def big_document(corpus: Sequence[tuple[str, str]]) -> tuple[str, str]:
    """A ~1 MB Markdown handbook: sections of joined abstracts under headings."""
    parts = ["# Nutrition evidence handbook\n"]
    size = 0
    sections = synthetic_documents(corpus, seed=SEED + 1, min_parts=6, max_parts=10)
    number = 0
    while size < BIG_DOCUMENT_BYTES:
        number += 1
        title, body = next(sections)
        part = f"\n## {number}. {title}\n\n{body}\n"
        parts.append(part)
        size += len(part.encode("utf-8"))
    return "Nutrition evidence handbook", "".join(parts)


def _setup_catalog() -> None:
    from bailing_knowledge import services

    kb = services.create_knowledge_base(KB_SLUG, title="Benchmark knowledge")
    route = services.create_route(ROUTE_KEY, name="Benchmark", knowledge_bases=[kb])
    services.create_client(CLIENT_APP_ID, name="Benchmark agent", routes=[route])


def _bulk_load(corpus: Sequence[tuple[str, str]], target_chunks: int) -> dict[str, Any]:
    """Load about `target_chunks` chunks through `upsert_documents`, the indexes dropped."""
    from django.db import connection

    from bailing_knowledge.conf import knowledge_settings
    from bailing_knowledge.ingestion.chunker import chunk_spans
    from bailing_knowledge.ingestion.documents import (
        DocumentInput,
        DocumentOutcome,
        upsert_documents,
    )

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE indexname = ANY(%s)", [list(INDEXES)]
        )
        definitions = dict(cursor.fetchall())
        for name in INDEXES:
            cursor.execute(f'DROP INDEX "{name}"')

    source = synthetic_documents(corpus, seed=SEED)
    counted = 0

    def inputs() -> Any:
        nonlocal counted
        number = 0
        while counted < target_chunks:
            title, body = next(source)
            counted += len(
                chunk_spans(
                    body,
                    target_chars=knowledge_settings.CHUNK_TARGET_CHARS,
                    overlap_chars=knowledge_settings.CHUNK_OVERLAP_CHARS,
                )
            )
            yield DocumentInput(f"doc-{number:06d}.md", title, body)
            number += 1

    started = time.perf_counter()
    chunks = documents = 0
    for result in upsert_documents(KB_SLUG, inputs()):
        if result.outcome != DocumentOutcome.CREATED:
            raise RuntimeError(f"{result.source_key}: {result.outcome} {result.error}")
        chunks += result.chunks
        documents += 1
    loaded = time.perf_counter()

    index_seconds: dict[str, float] = {}
    # The HNSW graph is built in memory while it fits (about 1 KB per chunk here); past that
    # the build goes on much more slowly on disk.
    memory_gb = max(1, -(-target_chunks * 3 // 1_000_000))
    with connection.cursor() as cursor:
        cursor.execute(f"SET maintenance_work_mem = '{memory_gb}GB'")
        cursor.execute("SET max_parallel_maintenance_workers = 1")
        for name in INDEXES:
            start = time.perf_counter()
            cursor.execute(definitions[name])
            index_seconds[name] = round(time.perf_counter() - start, 1)
        cursor.execute("RESET maintenance_work_mem")
        cursor.execute("RESET max_parallel_maintenance_workers")
    return {
        "documents": documents,
        "chunks": chunks,
        "upsert_documents_s": round(loaded - started, 1),
        "index_build_s": index_seconds,
    }


def ensure_scale_database(name: str, target_chunks: int, dataset: Path) -> dict[str, Any]:
    """Reuse `name` when its build version matches, else build it. Returns build facts."""
    with_big_document = target_chunks >= BIG_DOCUMENT_FROM_CHUNKS
    version = build_version(target_chunks, dataset) + f"|big={int(with_big_document)}"
    recorded, _, built = (database_version(name) or "").partition("\n")
    if recorded == version:
        from django.core.management import call_command

        use_database(name)
        call_command("migrate", verbosity=0)  # e.g. new SQL functions; the rows stay
        return {"database": name, "reused": True, **json.loads(built or "{}"), **storage()}

    from bailing_knowledge.ingestion.documents import upsert_document

    started = time.perf_counter()
    print(f"building {name}: about {target_chunks:,} chunks ...", flush=True)
    create_database(name)
    _setup_catalog()
    data = load_beir(dataset)
    corpus = [data.corpus[key] for key in sorted(data.corpus)]
    random.Random(SEED).shuffle(corpus)
    big_chunks = 0
    if with_big_document:
        # Measure the big document's size in chunks first, so the total hits the target.
        from bailing_knowledge.ingestion.chunker import chunk_spans

        title, body = big_document(corpus)
        big_chunks = len(chunk_spans(body))
    facts = _bulk_load(corpus, target_chunks - big_chunks)
    if with_big_document:
        start = time.perf_counter()
        title, body = big_document(corpus)
        result = upsert_document(KB_SLUG, BIG_DOCUMENT_KEY, title, body)
        facts["big_document"] = {
            "bytes": len(body.encode("utf-8")),
            "chunks": result.chunks,
            "upsert_s": round(time.perf_counter() - start, 1),
        }
    from django.db import connection

    connection.close()
    start = time.perf_counter()
    with raw_connection(name, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    facts["vacuum_analyze_s"] = round(time.perf_counter() - start, 1)
    facts["build_s"] = round(time.perf_counter() - started, 1)
    set_database_version(name, version + "\n" + json.dumps(facts))
    use_database(name)
    print(f"built {name} in {facts['build_s']} s", flush=True)
    return {"database": name, "reused": False, **facts, **storage()}


def storage() -> dict[str, Any]:
    """Counts and sizes (bytes) of the current database; the lexicon is None before it exists."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM bailing_knowledge_chunk), "
            "(SELECT count(*) FROM bailing_knowledge_document), "
            "pg_database_size(current_database()), "
            "pg_total_relation_size('bailing_knowledge_chunk'), "
            "pg_total_relation_size(to_regclass('bailing_knowledge_lexicon')), "
            "pg_relation_size(to_regclass(%s)), "
            "pg_relation_size(to_regclass(%s))",
            list(INDEXES),
        )
        chunks, documents, database, chunk_table, lexicon, hnsw, gin = cursor.fetchone()
    return {
        "total_chunks": chunks,
        "total_documents": documents,
        "bytes": {
            "database": database,
            "chunk table and its indexes": chunk_table,
            "lexicon table": lexicon,
            "GIN index": gin,
            "HNSW index": hnsw,
        },
    }
