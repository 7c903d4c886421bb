"""The read service reads slices, yet answers exactly as reading the whole body would."""

from __future__ import annotations

import random
import time
from typing import Any
from unittest import mock

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bailing_knowledge import constants, services, signing
from bailing_knowledge.budget import fit_read_page, utf8_len
from bailing_knowledge.ingestion.chunker import find_headings
from bailing_knowledge.ingestion.documents import upsert_document
from bailing_knowledge.models import Document, content_hash
from bailing_knowledge.services import read as read_service
from bailing_knowledge.services.read import Window, chain_window, read
from bailing_knowledge.services.search import find_hits

pytestmark = pytest.mark.django_db

LIMIT = constants.READ_CHAIN_MAX_BYTES

# Text that is hard to cut: multi-byte letters, combining marks, emoji sequences, flags,
# CR LF, characters JSON escapes, line separators DRF re-escapes.
TRICKY = [
    "Plain words about refunds. ",
    "中文句子，关于退款政策。",
    "e\u0301a\u0300",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466",
    "\U0001f44d\U0001f3fd",
    "\U0001f1e8\U0001f1ed\U0001f1eb",
    '"quoted" \\ ',
    "\r\n",
    "\x01\t",
    "\u2028",
]
# Lines that matter to the heading rule: headings of both kinds, fences, front-matter and
# thematic-break look-alikes, lines that cannot carry a setext heading.
LINES = [
    "# Title",
    "## Section *two*",
    "   ### Indented three",
    "    # indented code",
    "#nospace",
    "Setext text",
    "===",
    "---",
    "- item",
    "```",
    "```python",
    "~~~",
    "````",
    "# comment in code?",
    "",
    " ",
    "\u3000",
    "...",
]


def whole_body_read(session, route, ref, *, cursor=None, max_bytes, now) -> dict[str, Any]:
    """The read as it was before pages read slices: the whole body, then the same cut."""
    identity = signing.Identity.for_session(session, route.route_key)
    claims, cursor_claims = read_service._verify(identity, ref, cursor, None, now)
    document = Document.objects.get(pk=claims.document_id)
    assert (document.revision, document.content_hash) == (claims.revision, claims.content_hash)
    body = document.body
    if cursor_claims is None:
        window = chain_window(body, min(claims.hit_start, len(body)))
        start, consumed = window.start, 0
    else:
        window = Window(cursor_claims.window_start, cursor_claims.window_end)
        start, consumed = cursor_claims.offset, cursor_claims.consumed
    covers_source = window.start == 0 and window.end == len(body)
    envelope = {
        "schema_version": constants.SCHEMA_READ,
        "route": route.route_key,
        "knowledge_scope_revision": route.knowledge_scope_revision,
        "ref": ref,
        "revision": document.revision,
        "title": document.title,
        "content": "",
        "trust": constants.TRUST_REFERENCE_ONLY,
        "next_cursor": None,
        "truncated": False,
        "budget_exhausted": False,
        "total_content_bytes": utf8_len(body),
        "read_chain_max_bytes": constants.READ_CHAIN_MAX_BYTES,
    }

    def finalize(end: int) -> dict[str, Any]:
        more = end < window.end
        next_cursor = None
        if more:
            next_cursor = signing.sign_cursor(
                identity,
                signing.CursorClaims(
                    ref=ref,
                    run_id=None,
                    offset=end,
                    consumed=consumed + utf8_len(body[start:end]),
                    window_start=window.start,
                    window_end=window.end,
                    issued_at=int(now),
                ),
                now=now,
            )
        return {
            **envelope,
            "next_cursor": next_cursor,
            "truncated": more or not covers_source,
            "budget_exhausted": not more and not covers_source,
        }

    response, _ = fit_read_page(envelope, body, start, window.end, max_bytes, finalize=finalize)
    return response


def store(kb, body: str, key: str = "doc") -> Document:
    document, _ = Document.objects.update_or_create(
        knowledge_base=kb,
        source_key=key,
        defaults={
            "title": "Doc",
            "body": body,
            "content_hash": content_hash("Doc", body),
            "status": Document.Status.READY,
            "revision": 1,
        },
    )
    return document


def ref_for(issued, route, document: Document, hit: int, now: float) -> str:
    identity = signing.Identity.for_session(issued.session, route.route_key)
    claims = signing.ReferenceClaims(
        run_id=None,
        knowledge_scope_revision=route.knowledge_scope_revision,
        document_id=document.pk,
        revision=document.revision,
        content_hash=document.content_hash,
        hit_start=hit,
        hit_end=hit,
    )
    return signing.sign_reference(identity, claims, now=now)


def _document_statements(queries) -> list[str]:
    return [q["sql"] for q in queries if "bailing_knowledge_document" in q["sql"]]


def assert_same_chain(
    issued, route, document: Document, hit: int, max_bytes: int, *, statements: int = 1
) -> list:
    """Every page of the chain from `hit` equals the whole-body page; each page reads the
    document in one statement, the first in `statements` (two when it falls back, 0: any)."""
    now = time.time()
    ref = ref_for(issued, route, document, hit, now)
    pages, cursor = [], None
    while True:
        with CaptureQueriesContext(connection) as captured:
            page = read(issued.session, route, ref, cursor=cursor, max_bytes=max_bytes, now=now)
        if statements or cursor is not None:  # 0: the first page may fall back
            count = statements if cursor is None else 1
            assert len(_document_statements(captured.captured_queries)) == count
        expected = whole_body_read(
            issued.session, route, ref, cursor=cursor, max_bytes=max_bytes, now=now
        )
        assert page == expected, (hit, len(pages))
        pages.append(page)
        cursor = page["next_cursor"]
        if cursor is None:
            return pages


def markdown(rng: random.Random, size: int, *, front_matter: bool = False) -> str:
    """A Markdown body of about `size` characters: sections, code blocks, tricky text."""
    parts = ["---\ntitle: x\n```\n---\n"] if front_matter else []
    length = 0
    while length < size:
        roll = rng.random()
        if roll < 0.05:
            part = f"\n## Section {length}\n\n"
        elif roll < 0.07:
            part = "\n```sh\n# install it\n## not a heading\n```\n\n"
        elif roll < 0.08:
            part = f"\nSetext {length}\n---\n\n"
        elif roll < 0.1:
            part = rng.choice(LINES) + "\n"
        else:
            part = "".join(rng.choice(TRICKY) for _ in range(rng.randint(5, 40))) + "\n\n"
        parts.append(part)
        length += len(part)
    return "".join(parts)


# --------------------------------------------------------------------------- equality


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pages_of_a_long_document_equal_whole_body_pages(issued, route, kb, seed):
    rng = random.Random(seed)
    body = markdown(rng, 400_000, front_matter=seed == 2)
    assert utf8_len(body) > 4 * LIMIT
    document = store(kb, body)
    headings = [h.start for h in find_headings(body)]
    hits = [
        0,
        1000,
        40_000,
        len(body) // 2,
        len(body) - 10,
        len(body),
        headings[len(headings) // 2],  # exactly at a heading
        headings[len(headings) // 2] + 1,
        body.index("# install it", len(body) // 3),  # a heading look-alike in code
    ]
    for hit in hits:
        assert_same_chain(issued, route, document, hit, 32768)


def test_a_long_section_places_the_window_at_the_hit(issued, route, kb):
    rng = random.Random(5)
    long_section = ("word " * 100 + "\n\n") * 400  # 200 KB without a heading
    body = markdown(rng, 50_000) + "\n# Long\n\n" + long_section + markdown(rng, 50_000)
    document = store(kb, body)
    hit = body.index("# Long") + 100_000  # more than half the limit past the heading
    pages = assert_same_chain(issued, route, document, hit, 32768)
    assert body[hit:].startswith(pages[0]["content"])


def test_code_fenced_before_the_hit_hides_heading_look_alikes(issued, route, kb):
    # The window rule must see that the `# ...` line near the hit is inside a code block
    # opened 200 KB earlier: only the fence lines before the hit can tell.
    body = "# Top\n\n" + "prose. " * 30_000 + "\n\n```\n" + "code;\n" * 40_000
    body += "# not a heading\n" + "code;\n" * 200 + "```\n\nAfter the block.\n"
    document = store(kb, body)
    hit = body.index("# not a heading") + 200
    pages = assert_same_chain(issued, route, document, hit, 32768)
    assert body[hit:].startswith(pages[0]["content"])  # not at the look-alike


def test_multibyte_heavy_document(issued, route, kb):
    sentence = "中文句子，关于退款政策。👍🏽e\u0301"
    body = "".join(f"\n## 第{i}节\n\n" + sentence * 40 for i in range(400))
    assert utf8_len(body) > 2 * len(body) > 2 * LIMIT
    document = store(kb, body)
    for hit in (5, len(body) // 3, len(body) - 1):
        assert_same_chain(issued, route, document, hit, 16384)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    lines=st.lists(
        st.one_of(
            st.sampled_from(LINES),
            st.lists(st.sampled_from(TRICKY), min_size=1, max_size=30).map("".join),
        ),
        min_size=1,
        max_size=120,
    ),
    repeat=st.integers(min_value=1, max_value=80),
    limit=st.integers(min_value=1500, max_value=6000),
    max_bytes=st.integers(min_value=1200, max_value=3000),
    hit=st.floats(min_value=0, max_value=1),
    crlf=st.booleans(),
)
def test_pages_equal_whole_body_pages_for_any_text(
    issued, route, kb, lines, repeat, limit, max_bytes, hit, crlf
):
    # A small chain limit makes windows, sections, fences and page edges all come into play
    # with short bodies.
    body = (("\r\n" if crlf else "\n").join(lines) * repeat).replace("\x00", "") or "x"
    document = store(kb, body)
    with mock.patch.object(constants, "READ_CHAIN_MAX_BYTES", limit):
        assert_same_chain(issued, route, document, int(hit * len(body)), max_bytes, statements=0)


def test_compressed_rows_read_the_same(issued, route, kb):
    # Rows written before migration 0004 keep their compressed form until rewritten.
    with connection.cursor() as cursor:
        cursor.execute(
            "ALTER TABLE bailing_knowledge_document ALTER COLUMN body SET STORAGE EXTENDED"
        )
        document = store(kb, markdown(random.Random(8), 300_000))
        cursor.execute(
            "SELECT pg_column_compression(body) FROM bailing_knowledge_document WHERE id = %s",
            [document.pk],
        )
        assert cursor.fetchone()[0] is not None
    for hit in (10, 200_000):
        assert_same_chain(issued, route, document, hit, 16384)


# --------------------------------------------------------------------------- what is read


def test_a_following_page_fetches_only_its_slice_pinned(issued, route, kb):
    document = store(kb, markdown(random.Random(4), 600_000))
    now = time.time()
    ref = ref_for(issued, route, document, 300_000, now)
    first = read(issued.session, route, ref, max_bytes=8192, now=now)
    claims = signing.verify_cursor(
        first["next_cursor"],
        signing.Identity.for_session(issued.session, route.route_key),
        ref=ref,
        run_id=None,
        now=now,
    )
    with CaptureQueriesContext(connection) as captured:
        read(issued.session, route, ref, cursor=first["next_cursor"], max_bytes=8192, now=now)
    (sql,) = _document_statements(captured.captured_queries)
    assert f"substr(d.body, {claims.offset + 1}, {8192 + 2})" in sql
    assert f"d.revision = {document.revision}" in sql
    assert f"d.content_hash = '{document.content_hash}'" in sql
    assert "d.body," not in sql.replace("substr(d.body,", "")


def test_a_first_page_reads_the_body_up_to_the_window_reach(issued, route, kb):
    document = store(kb, markdown(random.Random(6), 600_000))
    now, hit = time.time(), 300_000
    ref = ref_for(issued, route, document, hit, now)
    with CaptureQueriesContext(connection) as captured:
        read(issued.session, route, ref, now=now)
    (sql,) = _document_statements(captured.captured_queries)
    assert f"substr(d.body, 1, {hit + LIMIT + 2})" in sql
    assert f"d.content_hash = '{document.content_hash}'" in sql


def test_a_window_the_piece_cannot_settle_reads_the_whole_body(issued, route, kb):
    # One line longer than the window: the heading rule needs the line after the hit's.
    body = "# Head\n\n" + "word " * 100_000 + "\n\n# Next\n\nEnd.\n"
    document = store(kb, body)
    with CaptureQueriesContext(connection) as captured:
        assert_same_chain(issued, route, document, 200_000, 32768, statements=2)
    statements = _document_statements(captured.captured_queries)
    assert any("octet_length(d.body), d.body\n" in sql for sql in statements)


def test_bodies_are_stored_uncompressed_out_of_line(kb):
    document = store(kb, "repetitive text " * 20_000)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attstorage FROM pg_attribute "
            "WHERE attrelid = 'bailing_knowledge_document'::regclass AND attname = 'body'"
        )
        assert cursor.fetchone()[0] == "e"
        cursor.execute(
            "SELECT pg_column_compression(body), octet_length(body) "
            "FROM bailing_knowledge_document WHERE id = %s",
            [document.pk],
        )
        assert cursor.fetchone() == (None, 320_000)


def test_pinned_bodies_hold_each_body_to_the_revision_its_hit_was_found_in(issued, route, kb):
    for key in ("alpha", "beta", "gamma", "delta"):
        upsert_document(kb, f"{key}.md", key, f"# {key}\n\nRefunds, {key} edition.")
    status, hits = find_hits(issued.session, route, "refunds edition", max_hits=4)
    assert (status, len(hits)) == ("ok", 4)
    # After the search: a new revision, a body hidden by its metadata alone (the revision
    # stays), and a document whose knowledge base left the route.
    upsert_document(kb, "beta.md", "beta", "# beta\n\nRefunds, revised.")
    upsert_document(
        kb, "gamma.md", "gamma", "# gamma\n\nRefunds, gamma edition.", {"roles": ["finance"]}
    )
    other = services.create_knowledge_base("archive")
    Document.objects.filter(source_key="delta.md").update(knowledge_base=other)
    bodies = read_service.pinned_bodies(issued.session, route, hits)
    assert bodies == {
        Document.objects.get(source_key="alpha.md").pk: "# alpha\n\nRefunds, alpha edition."
    }
    assert read_service.pinned_bodies(issued.session, route, []) == {}
