"""Build (or reuse) the benchmark databases of 10k and 100k chunks.

Documents are realistic text: NFCorpus abstracts joined into documents of 4-12 abstracts,
each copy varied (a sentence dropped, the sentences rotated) so that no chunk repeats.

How the rows are written: chunking and embedding run through the product's own
`ingestion.documents._prepare` (chunker + the default `HashingEmbedder`) in two forked worker
processes; the rows have exactly the shape `_write_chunks` writes (text hash, vector,
`to_tsvector('simple', <lexical terms>)`) but are bulk-loaded with COPY, and the HNSW and GIN
indexes are dropped during the load and re-created from their own definitions afterwards
(building an HNSW index is much faster than inserting 100k rows into one). One large
document (about 1 MB, for the read benchmark) is then ingested through `upsert_document`.

A database is reused when its recorded build version matches (see `build_version`), so a
second `make bench` skips the build.
"""

from __future__ import annotations

import hashlib
import multiprocessing
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

BUILD_VERSION = "bench-build-3"
KB_SLUG = "bench"
ROUTE_KEY = "bench"
CLIENT_APP_ID = "bench-agent"
BIG_DOCUMENT_KEY = "handbook-1mb.md"
BIG_DOCUMENT_BYTES = 1_000_000
INDEXES = ("bk_chunk_embedding_hnsw_384", "bk_chunk_search_vector_gin")
SEED = 20240601


def build_version(target_chunks: int, dataset: Path) -> str:
    """Everything that changes the built data: bump `BUILD_VERSION` when this file changes."""
    from django.db.migrations.loader import MigrationLoader

    from bailing_knowledge.conf import knowledge_settings
    from bailing_knowledge.retrieval.embedders import get_embedder

    leaves = sorted(
        f"{app}.{name}"
        for app, name in MigrationLoader(None, ignore_no_migrations=True).graph.leaf_nodes()
        if app == "bailing_knowledge"
    )
    corpus = dataset / "corpus.jsonl"
    stat = corpus.stat()
    return "|".join(
        [
            BUILD_VERSION,
            f"chunks={target_chunks}",
            get_embedder("default").model_name,
            f"chunking={knowledge_settings.CHUNK_TARGET_CHARS}/{knowledge_settings.CHUNK_OVERLAP_CHARS}",
            *leaves,
            f"corpus={stat.st_size}",
        ]
    )


# --------------------------------------------------------------------------------------------
# Worker side: chunk + embed + row shape, exactly as `_write_chunks` builds its rows.


def _prepare_rows(item: tuple[int, str, str]) -> tuple[int, str, str, list[tuple[Any, ...]]]:
    from bailing_knowledge.ingestion import documents
    from bailing_knowledge.models import KnowledgeBase
    from bailing_knowledge.retrieval.tokenization import lexical_terms

    number, title, body = item
    kb = KnowledgeBase(slug=KB_SLUG, embedder="default")
    chunks, dimensions = documents._prepare(kb, body)
    rows = [
        (
            chunk.ordinal,
            chunk.start,
            chunk.end,
            chunk.text,
            hashlib.sha256(chunk.text.encode("utf-8")).hexdigest(),
            documents._vector_literal(chunk.embedding or []),
            dimensions,
            " ".join(lexical_terms(chunk.text)),
        )
        for chunk in chunks
    ]
    return number, title, body, rows


# --------------------------------------------------------------------------------------------
# Parent side


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


def _write_batch(kb: Any, batch: list[tuple[str, str, list[tuple[Any, ...]]]], first: int) -> None:
    """Documents via the ORM (ready, revision 1), their chunk rows via COPY to the stage."""
    from django.db import connection, transaction

    from bailing_knowledge.models import Document, content_hash

    with transaction.atomic():
        documents = Document.objects.bulk_create(
            Document(
                knowledge_base=kb,
                source_key=f"doc-{first + offset:06d}.md",
                title=title,
                body=body,
                content_hash=content_hash(title, body),
                status=Document.Status.READY,
                revision=1,
            )
            for offset, (title, body, _) in enumerate(batch)
        )
        with (
            connection.cursor() as cursor,
            cursor.cursor.copy("COPY bench_chunk_stage FROM STDIN") as copy,
        ):
            for document, (_, _, rows) in zip(documents, batch, strict=True):
                for row in rows:
                    copy.write_row((document.pk, *row))


def _bulk_load(corpus: Sequence[tuple[str, str]], target_chunks: int) -> dict[str, Any]:
    """Load about `target_chunks` chunks; returns counts and timings."""
    from django.db import connection, connections

    from bailing_knowledge.models import KnowledgeBase

    kb = KnowledgeBase.objects.get(slug=KB_SLUG)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE indexname = ANY(%s)", [list(INDEXES)]
        )
        definitions = dict(cursor.fetchall())
        for name in INDEXES:
            cursor.execute(f'DROP INDEX "{name}"')
        cursor.execute(
            "CREATE UNLOGGED TABLE bench_chunk_stage (document_id bigint, ordinal int, "
            '"start" int, "end" int, "text" text, text_hash text, embedding vector, '
            "embedding_dimensions smallint, lexical_text text)"
        )

    source = synthetic_documents(corpus, seed=SEED)
    # Chunks per document, from a sample, to hand the workers a finite list of documents.
    sample = [_prepare_rows((0, *next(source)))[3] for _ in range(40)]
    per_document = sum(map(len, sample)) / len(sample)
    connections.close_all()  # nothing shared with the forked workers

    started = time.perf_counter()
    chunks = documents = 0
    batch: list[tuple[str, str, list[tuple[Any, ...]]]] = []
    context = multiprocessing.get_context("fork")
    with context.Pool(2) as pool:
        while chunks < target_chunks:
            wanted = int((target_chunks - chunks) / per_document * 1.05) + 20
            work = ((number, *next(source)) for number in range(wanted))
            for _, title, body, rows in pool.imap(_prepare_rows, work, chunksize=8):
                batch.append((title, body, rows))
                chunks += len(rows)
                if len(batch) == 100 or chunks >= target_chunks:
                    _write_batch(kb, batch, documents)
                    documents += len(batch)
                    batch = []
                if chunks >= target_chunks:
                    break
            if batch:
                _write_batch(kb, batch, documents)
                documents += len(batch)
                batch = []
        pool.terminate()
    loaded = time.perf_counter()

    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO bailing_knowledge_chunk (document_id, knowledge_base_id, revision, "
            'ordinal, "start", "end", "text", text_hash, embedding, embedding_dimensions, '
            "search_vector) "
            'SELECT document_id, %s, 1, ordinal, "start", "end", "text", text_hash, '
            "embedding, embedding_dimensions, to_tsvector('simple', lexical_text) "
            "FROM bench_chunk_stage ORDER BY document_id, ordinal",
            [kb.pk],
        )
        cursor.execute("DROP TABLE bench_chunk_stage")
    inserted = time.perf_counter()

    index_seconds: dict[str, float] = {}
    with connection.cursor() as cursor:
        cursor.execute("SET maintenance_work_mem = '1GB'")
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
        "prepare_and_copy_s": round(loaded - started, 1),
        "insert_with_tsvector_s": round(inserted - loaded, 1),
        "index_build_s": index_seconds,
    }


def ensure_scale_database(
    name: str, target_chunks: int, dataset: Path, *, with_big_document: bool
) -> dict[str, Any]:
    """Reuse `name` when its build version matches, else build it. Returns build facts."""
    version = build_version(target_chunks, dataset) + f"|big={int(with_big_document)}"
    if database_version(name) == version:
        use_database(name)
        return {"database": name, "reused": True, **_counts()}

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
    with raw_connection(name, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    set_database_version(name, version)
    use_database(name)
    facts["build_s"] = round(time.perf_counter() - started, 1)
    print(f"built {name} in {facts['build_s']} s", flush=True)
    return {"database": name, "reused": False, **facts, **_counts()}


def _counts() -> dict[str, Any]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM bailing_knowledge_chunk")
        chunks = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM bailing_knowledge_document")
        documents = cursor.fetchone()[0]
        cursor.execute(
            "SELECT pg_size_pretty(pg_database_size(current_database())), "
            "pg_size_pretty(pg_relation_size('bk_chunk_embedding_hnsw_384')), "
            "pg_relation_size('bk_chunk_embedding_hnsw_384'), "
            "pg_size_pretty(pg_relation_size('bk_chunk_search_vector_gin'))"
        )
        database, hnsw, hnsw_bytes, gin = cursor.fetchone()
    return {
        "total_chunks": chunks,
        "total_documents": documents,
        "database_size": database,
        "hnsw_size": hnsw,
        "hnsw_bytes": hnsw_bytes,
        "gin_size": gin,
    }
