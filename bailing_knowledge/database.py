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
