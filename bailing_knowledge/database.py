"""What the app needs from PostgreSQL, checked with messages that say how to fix it.

The app runs as whatever role the host project gives it, often a role that is not a
superuser (every managed PostgreSQL works that way). Such a role cannot create the `vector`
extension unless pgvector is marked trusted, so the first migration creates it only when it
is missing and the role may, and otherwise stops before touching anything with the one
statement an administrator has to run. Reversing the migration drops the extension only when
that migration created it and nothing else uses it.
"""

from __future__ import annotations

from typing import Any

from django.contrib.postgres.operations import CreateExtension
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, router, transaction
from psycopg import sql

MIN_POSTGRES_VERSION = 140000
# 0.8 brought iterative index scans (`hnsw.iterative_scan`), which the vector leg turns on
# so that filtered searches still find enough rows; since 0.6 the extension reserves the
# `hnsw.` prefix, so on an older version setting it is an error, not a no-op.
MIN_PGVECTOR_VERSION = (0, 8)
_MIN_PGVECTOR = ".".join(map(str, MIN_PGVECTOR_VERSION))

PGVECTOR_MISSING = (
    f"The PostgreSQL server has no pgvector (the extension 'vector', version {_MIN_PGVECTOR} "
    "or newer). "
    "Install pgvector for the server's PostgreSQL version "
    "(https://github.com/pgvector/pgvector) or use a managed PostgreSQL that offers it, "
    "then run migrate again."
)

# Appended to the extension's comment when the first migration created it: the mark that
# lets reversing the migration tell its own extension from one an administrator made.
CREATED_MARK = " [created by bailing_knowledge]"

_EXTENSION_STATE = """
SELECT a.default_version,
       e.extversion,
       r.rolsuper OR (coalesce(v.trusted, false)
                      AND has_database_privilege(current_database(), 'CREATE')),
       current_user,
       current_database()
FROM pg_available_extensions a
LEFT JOIN pg_extension e ON e.extname = a.name
LEFT JOIN pg_available_extension_versions v
       ON v.name = a.name AND v.version = a.default_version
JOIN pg_roles r ON r.rolname = current_user
WHERE a.name = 'vector'
"""

_SCHEMA_STATE = """
SELECT current_schema(),
       has_schema_privilege(current_schema(), 'CREATE'),
       to_regclass('bailing_knowledge_knowledgebase') IS NOT NULL,
       pg_encoding_to_char(d.encoding)
FROM pg_database d WHERE d.datname = current_database()
"""


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def database_problems(connection: Any) -> list[str]:
    """Return what is missing on `connection`'s server, in words an operator can act on."""
    if connection.vendor != "postgresql":
        return [
            f"bailing_knowledge needs PostgreSQL >= 14 with pgvector >= {_MIN_PGVECTOR}; "
            f"the database uses the {connection.vendor!r} backend."
        ]
    problems = []
    with connection.cursor() as cursor:
        if connection.pg_version < MIN_POSTGRES_VERSION:
            problems.append("bailing_knowledge needs PostgreSQL >= 14.")
        cursor.execute(_EXTENSION_STATE)
        extension = cursor.fetchone()
        cursor.execute(_SCHEMA_STATE)
        schema, may_create_tables, migrated, encoding = cursor.fetchone()
    if extension is None:
        problems.append(PGVECTOR_MISSING)
    else:
        available, installed, may_create, role, database = extension
        version = installed or available
        if _version_tuple(version) < MIN_PGVECTOR_VERSION:
            problems.append(
                f"pgvector {version} is too old; bailing_knowledge needs >= {_MIN_PGVECTOR}. "
                "Install a newer pgvector on the server, then run ALTER EXTENSION vector "
                "UPDATE; in the database."
            )
        elif installed is None and not may_create:
            problems.append(
                f"The extension 'vector' is not installed in the database {database!r} and "
                f"the role {role!r} may not create it. An administrator (a superuser) runs "
                f'CREATE EXTENSION vector; in that database once (psql -d "{database}" -c '
                '"CREATE EXTENSION vector;"), then migrate runs as this role.'
            )
    if encoding != "UTF8":
        # Offsets in refs and read pages count characters, as Python and `substr` in a
        # UTF-8 database do; in another encoding `substr` counts something else.
        problems.append(
            f"The database uses the {encoding} encoding; bailing_knowledge needs UTF8 (offsets "
            "in its references count characters). Create the database with ENCODING 'UTF8' "
            "(for example CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE template0)."
        )
    if not migrated and not may_create_tables:
        problems.append(
            f"The role may not create tables in the schema {schema!r}. Make it the "
            f"database's owner, or run GRANT CREATE ON SCHEMA {schema} TO <role>; "
            "as its owner."
        )
    return problems


class CreateVectorExtension(CreateExtension):
    """`CREATE EXTENSION vector` when it is missing and the role may, marked as ours."""

    def __init__(self) -> None:
        self.name = "vector"

    def database_forwards(self, app_label, schema_editor, from_state, to_state):  # type: ignore[no-untyped-def]
        connection = schema_editor.connection
        if connection.vendor != "postgresql" or not router.allow_migrate(
            connection.alias, app_label
        ):
            return
        if self.extension_exists(schema_editor, self.name):
            return
        problems = database_problems(connection)
        if problems:
            raise ImproperlyConfigured(" ".join(problems))
        schema_editor.execute("CREATE EXTENSION IF NOT EXISTS vector")
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT obj_description(oid, 'pg_extension') FROM pg_extension "
                "WHERE extname = 'vector'"
            )
            comment = (cursor.fetchone() or [None])[0] or "vector"
            # A literal, not a parameter: a utility statement takes none, and with Django's
            # `server_side_binding` option a parameter would reach the server as `$1`.
            comment_sql = sql.SQL("COMMENT ON EXTENSION vector IS {}").format(
                sql.Literal(comment + CREATED_MARK)
            )
            cursor.execute(comment_sql.as_string(connection.connection))

    def database_backwards(self, app_label, schema_editor, from_state, to_state):  # type: ignore[no-untyped-def]
        """Drop the extension only when it bears our mark and nothing else depends on it."""
        connection = schema_editor.connection
        if connection.vendor != "postgresql" or not router.allow_migrate(
            connection.alias, app_label
        ):
            return
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT obj_description(oid, 'pg_extension') FROM pg_extension "
                "WHERE extname = 'vector'"
            )
            row = cursor.fetchone()
        if row is None or not (row[0] or "").endswith(CREATED_MARK):
            return
        try:
            with transaction.atomic(using=connection.alias):
                schema_editor.execute("DROP EXTENSION vector")
        except DatabaseError:
            pass  # another app's columns or indexes use it: it stays

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
