"""What the app needs from PostgreSQL, checked with messages that say how to fix it."""

from __future__ import annotations

from typing import Any

from django.contrib.postgres.operations import CreateExtension
from django.core.exceptions import ImproperlyConfigured

MIN_POSTGRES_VERSION = 140000
MIN_PGVECTOR_VERSION = (0, 7)

PGVECTOR_MISSING = (
    "The PostgreSQL extension 'vector' (pgvector >= 0.7) is not installed on this server. "
    "Install pgvector for your PostgreSQL version (https://github.com/pgvector/pgvector), "
    "or leave DATABASE_URL unset to use the embedded PostgreSQL that ships with it."
)


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def database_problems(connection: Any) -> list[str]:
    """Return what is missing on `connection`'s server, in words an operator can act on."""
    if connection.vendor != "postgresql":
        return [
            "bailing_knowledge needs PostgreSQL >= 14 with pgvector >= 0.7; "
            f"the database uses the {connection.vendor!r} backend."
        ]
    problems = []
    with connection.cursor() as cursor:
        if connection.pg_version < MIN_POSTGRES_VERSION:
            problems.append("bailing_knowledge needs PostgreSQL >= 14.")
        cursor.execute(
            "SELECT default_version, installed_version FROM pg_available_extensions "
            "WHERE name = 'vector'"
        )
        row = cursor.fetchone()
    if row is None:
        problems.append(PGVECTOR_MISSING)
    else:
        version = row[1] or row[0]
        if _version_tuple(version) < MIN_PGVECTOR_VERSION:
            problems.append(f"pgvector {version} is too old; bailing_knowledge needs >= 0.7.")
    return problems


class CreateVectorExtension(CreateExtension):
    """`CREATE EXTENSION vector`, failing with an actionable message when pgvector is absent."""

    def __init__(self) -> None:
        self.name = "vector"

    def database_forwards(self, app_label, schema_editor, from_state, to_state):  # type: ignore[no-untyped-def]
        if schema_editor.connection.vendor == "postgresql":
            problems = database_problems(schema_editor.connection)
            if problems:
                raise ImproperlyConfigured(" ".join(problems))
        super().database_forwards(app_label, schema_editor, from_state, to_state)

    def deconstruct(self):  # type: ignore[no-untyped-def]
        return (self.__class__.__qualname__, [], {})


# --------------------------------------------------------------------------------------------
# HNSW indexes per vector size

#: pgvector's HNSW limit for ``halfvec``.
HNSW_MAX_DIMENSIONS = 4000
#: The graph of the hashing embedder's size is sparser (m 8, ef_construction 32), which makes
#: inserting a chunk cheaper (docs/performance.md). It costs that embedder's vector leg recall
#: (NFCorpus nDCG@10 0.16-0.17, against 0.20 when searched nearly exhaustively), which its small
#: fusion weight keeps out of the hybrid ranking. Other sizes get pgvector's defaults, m 16
#: and ef_construction 64: on NFCorpus, WordLlama's vector leg scored 0.244 through an m 8
#: graph and 0.252, the exact scan's figure, through an m 16 one (docs/embedders.md).
HNSW_SPARSE_DIMENSIONS = 384


def hnsw_parameters(dimensions: int) -> tuple[int, int]:
    """``(m, ef_construction)`` of the HNSW index for vectors of `dimensions`."""
    return (8, 32) if dimensions == HNSW_SPARSE_DIMENSIONS else (16, 64)


def vector_index_name(dimensions: int) -> str:
    return f"bk_chunk_embedding_hnsw_{int(dimensions)}"


def vector_index_sql(dimensions: int) -> str:
    """The index the vector leg's ORDER BY matches for chunks of `dimensions` (see models.py's
    `vector_index`, which the migrations create for the shipped sizes)."""
    n = int(dimensions)
    m, ef_construction = hnsw_parameters(n)
    return (
        f"CREATE INDEX CONCURRENTLY {vector_index_name(n)} ON bailing_knowledge_chunk "
        f"USING hnsw ((embedding::halfvec({n})) halfvec_cosine_ops) "
        f"WITH (m = {m}, ef_construction = {ef_construction}) WHERE embedding_dimensions = {n}"
    )


def vector_index_state(connection: Any, dimensions: int) -> str:
    """``"ok"``, ``"missing"``, ``"invalid"`` (a concurrent build that failed) or ``"other"``
    (an index of that name that the search cannot use: another expression or operator class).
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = %s AND c.relnamespace = current_schema()::regnamespace",
            [vector_index_name(dimensions)],
        )
        row = cursor.fetchone()
    if row is None:
        return "missing"
    valid, definition = row
    if not valid:
        return "invalid"
    n = int(dimensions)
    expected = (
        f"USING hnsw (((embedding)::halfvec({n})) halfvec_cosine_ops)",
        f"WHERE (embedding_dimensions = {n})",
    )
    return "ok" if all(part in definition for part in expected) else "other"


def ensure_vector_index(connection: Any, dimensions: int) -> str:
    """Create the HNSW index for `dimensions` unless a usable one exists; returns the state it
    was found in (`vector_index_state`).

    Built concurrently, so ingestion goes on meanwhile; that cannot run in a transaction. An
    index of the same name that the search cannot use is dropped and built again.
    """
    n = int(dimensions)
    if not 1 <= n <= HNSW_MAX_DIMENSIONS:
        raise ValueError(f"HNSW indexes take 1 to {HNSW_MAX_DIMENSIONS} dimensions, not {n}")
    state = vector_index_state(connection, n)
    if state == "ok":
        return state
    with connection.cursor() as cursor:
        if state != "missing":
            cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {vector_index_name(n)}")
        cursor.execute(vector_index_sql(n))
    return state
