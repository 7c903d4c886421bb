"""The COPY writer's staging table, on the real database."""

from __future__ import annotations

import pytest
from django.db import connection

from bailing_knowledge.ingestion.documents import upsert_document
from bailing_knowledge.ingestion.storage import STAGE_TYPES

pytestmark = pytest.mark.django_db


def test_the_staging_types_are_the_staging_tables(kb):
    upsert_document(kb, "a.md", "Title", "# Title\n\nSome text to index.")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT format_type(atttypid, NULL) FROM pg_attribute "
            "WHERE attrelid = 'bailing_knowledge_chunk_stage'::regclass AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum"
        )
        actual = [row[0] for row in cursor.fetchall()]
    # Binary-compatible: varchar takes text's binary form; a vector is sent as raw bytes in
    # pgvector's binary form.
    compatible = {("text", "character varying"), ("bytea", "vector")}
    sent = list(STAGE_TYPES)
    assert len(actual) == len(sent)
    assert all(a == s or (s, a) in compatible for s, a in zip(sent, actual, strict=True)), actual
