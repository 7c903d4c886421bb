"""The visibility rule: the SQL the searches filter with and the check reads apply agree."""

from __future__ import annotations

import json

import pytest
from django.db import connection, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bailing_knowledge import services
from bailing_knowledge.ingestion.documents import upsert_document
from bailing_knowledge.models import Document
from bailing_knowledge.retrieval.session import configure_search
from bailing_knowledge.retrieval.visibility import (
    DOCUMENT_VISIBLE_SQL,
    OPEN_DOCUMENT_SQL,
    Visibility,
    narrowest,
    visibility_for,
)

# The real fragment, over one ready document `d` and one chunk `c` of its current revision:
# only the metadata and the principal vary.
_FRAGMENT = f"""
SELECT {DOCUMENT_VISIBLE_SQL}
FROM (SELECT 1 AS id, 'ready'::text AS status, 1 AS revision, %(metadata)s::jsonb AS metadata) d,
     (SELECT 1 AS document_id, 1 AS revision) c
"""

NAMES = st.sampled_from(["", "staff", "public", "support", "admin", "Staff"])
JSON_SCALARS = st.none() | st.booleans() | st.integers(-3, 3) | NAMES
# What the restricting keys may hold: what ingestion accepts (absent, null, lists of names)
# and what an edit outside it could leave (scalars, mixed lists, objects).
KEY_VALUES = (
    st.lists(NAMES.filter(bool), max_size=4)
    | st.lists(JSON_SCALARS, max_size=4)
    | st.dictionaries(NAMES, JSON_SCALARS, max_size=3)
    | JSON_SCALARS
)
METADATA = st.fixed_dictionaries(
    {},
    optional={
        "audiences": KEY_VALUES,
        "roles": KEY_VALUES,
        # jsonb refuses NUL and lone surrogates: no stored metadata holds one.
        "source": st.text(
            st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=5
        ),
    },
)
PRINCIPALS = st.builds(Visibility, audience=NAMES, roles=st.lists(NAMES, max_size=3).map(tuple))


# Both checks over one document `d` and one chunk `c` whose state varies too.
_BOTH = f"""
SELECT ({OPEN_DOCUMENT_SQL}) IS TRUE, ({DOCUMENT_VISIBLE_SQL}) IS TRUE
FROM (SELECT 1 AS id, %(status)s::text AS status, %(revision)s AS revision,
             %(metadata)s::jsonb AS metadata) d,
     (SELECT 1 AS document_id, %(chunk_revision)s AS revision) c
"""
STATUSES = st.sampled_from(["ready", "pending", "indexing", "failed"])
REVISIONS = st.integers(1, 2)


def _sql_admits(visibility: Visibility, metadata: dict) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(_FRAGMENT, {**visibility.params([]), "metadata": json.dumps(metadata)})
        return cursor.fetchone()[0]


@pytest.mark.django_db
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(visibility=PRINCIPALS, metadata=METADATA)
def test_the_python_check_agrees_with_the_sql(visibility, metadata):
    assert visibility.admits(metadata) is _sql_admits(visibility, metadata)


@pytest.mark.parametrize(
    ("metadata", "visible"),
    [
        ({}, True),
        ({"audiences": ["staff"]}, True),
        ({"audiences": ["public"]}, False),
        ({"roles": ["admin", "support"]}, True),
        ({"roles": ["admin"]}, False),
        ({"roles": []}, False),
        # A key present restricts, whatever it holds: null admits no one.
        ({"audiences": None}, False),
        ({"roles": None}, False),
    ],
)
def test_what_a_staff_support_principal_sees(metadata, visible):
    assert Visibility(audience="staff", roles=("support",)).admits(metadata) is visible


def test_a_session_is_seen_as_its_principal(issued):
    session = services.get_session(issued.session_id)
    assert visibility_for(session) == Visibility(
        tenant="acme", audience="staff", roles=("support",)
    )


@pytest.mark.django_db
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    visibility=PRINCIPALS,
    metadata=METADATA,
    status=STATUSES,
    revision=REVISIONS,
    chunk_revision=REVISIONS,
)
def test_an_open_document_is_one_every_principal_sees(
    visibility, metadata, status, revision, chunk_revision
):
    """The lexical leg's shortcut admits no chunk the full check refuses, and it admits
    every chunk of a current, ready document that restricts no one."""
    with connection.cursor() as cursor:
        cursor.execute(
            _BOTH,
            {
                **visibility.params([]),
                "metadata": json.dumps(metadata),
                "status": status,
                "revision": revision,
                "chunk_revision": chunk_revision,
            },
        )
        open_, visible = cursor.fetchone()
    restricted = "audiences" in metadata or "roles" in metadata
    assert open_ is (status == "ready" and revision == chunk_revision and not restricted)
    assert visible or not open_


@pytest.mark.django_db(transaction=True)
def test_the_open_documents_are_found_in_their_index_alone(kb):
    """`bk_document_open`'s condition is `OPEN_DOCUMENT_SQL`'s: the check of a chunk's
    document is answered by an index-only scan of it, without the document's row.

    The document is committed and its table vacuumed: its page is then all-visible and the
    statistics are the table's own, so reading the index alone is the cheapest plan
    whatever earlier tests left in the table (in a transaction, the planner's choice among
    the document indexes followed the statistics autovacuum had last left)."""
    upsert_document(kb, "faq", "FAQ", "Refunds take five days.")
    with connection.cursor() as cursor:
        cursor.execute("VACUUM (ANALYZE) bailing_knowledge_document")
    with transaction.atomic(), connection.cursor() as cursor:
        configure_search(cursor)
        cursor.execute(
            "EXPLAIN (COSTS OFF) SELECT (SELECT true FROM bailing_knowledge_document d"
            f" WHERE {OPEN_DOCUMENT_SQL}) FROM bailing_knowledge_chunk c"
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Index Only Scan using bk_document_open" in plan, plan


@pytest.mark.django_db
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(visibility=PRINCIPALS, metadata=METADATA, status=STATUSES)
def test_the_admitted_documents_function_applies_the_same_rule(kb, visibility, metadata, status):
    """Migration 0011's function, which a search's deferred document check calls, admits a
    document exactly when the SQL the legs filter with sees its current chunks."""
    if not Document.objects.filter(knowledge_base=kb).exists():
        upsert_document(kb, "faq", "FAQ", "Refunds take five days.")
    document = Document.objects.get(knowledge_base=kb)
    Document.objects.filter(pk=document.pk).update(metadata=metadata, status=status)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT * FROM bailing_knowledge_admitted_documents(%s::bigint[], %s, %s::text[])",
            [[document.pk], visibility.audience, list(visibility.roles)],
        )
        admitted = cursor.fetchall()
        cursor.execute(
            _BOTH,
            {
                **visibility.params([]),
                "metadata": json.dumps(metadata),
                "status": status,
                "revision": document.revision,
                "chunk_revision": document.revision,
            },
        )
        _, visible = cursor.fetchone()
    assert admitted == ([(document.pk, document.revision)] if visible else [])


@settings(max_examples=500)
@given(visibility=PRINCIPALS, old=METADATA, new=METADATA)
def test_the_narrowest_visibility_admits_only_whom_both_admit(visibility, old, new):
    narrowed = narrowest(old, new)
    both = visibility.admits(old) and visibility.admits(new)
    assert not visibility.admits(narrowed) or both
    if len(visibility.roles) <= 1:
        assert visibility.admits(narrowed) is both
