"""Knowledge read: paged, byte-budgeted, revision-pinned reading of a referenced document.

A chain starts with a ref from search and continues with the `next_cursor` of each page.
Every page re-checks, in this order: the ref's and cursor's signatures (400), their age
(410), the run (409 `run_not_current`), the route's knowledge configuration (409
`knowledge_scope_changed`) and the document itself (409 `knowledge_changed`).

A page is one statement: the document's title, the UTF-8 size of its body and only the
stretch of the body the page needs, with the revision and content hash the ref was issued for
in its WHERE clause, so a page never mixes two revisions. A following page needs `max_bytes`
characters from its offset, so it costs about what fetching its own slice costs. The first
page of a chain also places the chain's window: it reads the body up to the furthest the
window can reach (whether a heading line is in fenced code depends on every fence line
before it) and looks for the hit's section heading just before the hit instead of listing
every heading. Only when that text cannot settle the window (a line longer than the window,
say) does a second statement, pinned the same way, read the whole body.

Offsets in refs and cursors count characters (Python `str` indices), as the database's
`substr` does; only `total_content_bytes` and the chain limit count UTF-8 bytes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection

from .. import constants
from ..budget import fit_end, fit_read_page, utf8_len
from ..exceptions import (
    KnowledgeChanged,
    KnowledgeReferenceExpired,
    KnowledgeReferenceInvalid,
    KnowledgeScopeChanged,
)
from ..markdown import PieceTooShort, find_headings, last_heading
from ..models import AgentSession, Document, Route, Run
from ..retrieval.hybrid import Hit
from ..retrieval.visibility import Visibility, searchable_knowledge_bases, visibility_for
from ..signing import (
    CursorClaims,
    Identity,
    ReferenceClaims,
    ReferenceExpired,
    ReferenceInvalid,
    sign_cursor,
    verify_cursor,
    verify_reference,
)
from .runs import current_run

# Characters read past the last one a cut may keep: the grapheme segmenter looks one past its
# stop, and one more tells "the body goes on" from "the body ends here".
_LOOKAHEAD = 2
# `substr` takes 4-byte integers; no body of a valid ref comes near.
_INT4_MAX = 2**31 - 1


@dataclass(frozen=True)
class Window:
    """The part of a body one chain may expose: at most `READ_CHAIN_MAX_BYTES` of UTF-8."""

    start: int
    end: int


def chain_window(body: str, hit_start: int) -> Window:
    """The whole body when it fits the chain limit; otherwise a window holding the hit.

    The window starts at the heading of the hit's section when that still reaches the hit,
    else at the hit itself, and runs as far as the chain limit allows. This is the rule on a
    whole body; a read computes the same window from less of it (`_window_from_piece`).
    """
    limit = constants.READ_CHAIN_MAX_BYTES
    if utf8_len(body) <= limit:
        return Window(0, len(body))
    if utf8_len(body[:hit_start]) < limit // 2:
        start = 0
    else:
        headings = [h.start for h in find_headings(body) if h.start <= hit_start]
        start = hit_start
        if headings and utf8_len(body[headings[-1] : hit_start]) < limit // 2:
            start = headings[-1]
    return Window(start, fit_end(body, start, limit, escaped=False))


@dataclass(frozen=True)
class _Piece:
    """What one pinned statement brought: the title, the body's size and a stretch of it.

    `text` is `body[base : base + len(text)]`; `complete` says it runs to the end of the body.
    """

    title: str
    total_bytes: int
    text: str
    base: int
    complete: bool


def _verify(
    identity: Identity, ref: str, cursor: str | None, run_id: str | None, now: float
) -> tuple[ReferenceClaims, CursorClaims | None]:
    """Signatures of both tokens first (400), then their ages (410)."""
    expired = False
    claims: ReferenceClaims | None = None
    cursor_claims: CursorClaims | None = None
    try:
        try:
            claims = verify_reference(ref, identity, run_id=run_id, now=now)
        except ReferenceExpired:
            expired = True
        if cursor is not None:
            try:
                cursor_claims = verify_cursor(cursor, identity, ref=ref, run_id=run_id, now=now)
            except ReferenceExpired:
                expired = True
    except ReferenceInvalid:
        raise KnowledgeReferenceInvalid() from None
    if expired or claims is None:
        raise KnowledgeReferenceExpired()
    return claims, cursor_claims


# One statement per page. Its WHERE clause holds the pins (revision, content hash, ready, a
# searchable KB), so the title and the stretch of body it returns are of the ref's revision.
# `octet_length` of a body stored uncompressed out of line (migration 0004) reads no byte of
# it, and `substr` reads it only up to about four times the end of the stretch (in UTF-8 it
# counts characters from the start), with nothing to decompress.
_IN_SCOPE = "d.status = %(ready)s AND d.knowledge_base_id = ANY(%(kbs)s::bigint[])"
_DOCUMENT_SQL = (
    """
SELECT d.title, d.metadata, octet_length(d.body), {body}
FROM {table} AS d
WHERE d.id = %(id)s AND d.revision = %(revision)s AND d.content_hash = %(content_hash)s
  AND """
    + _IN_SCOPE
)
# Whole bodies of several documents, each pinned to its own revision and hash.
_BODIES_SQL = (
    """
SELECT d.id, d.metadata, d.body
FROM {table} AS d
JOIN unnest(%(ids)s::bigint[], %(revisions)s::bigint[], %(hashes)s::text[])
  AS pin (id, revision, content_hash)
  ON d.id = pin.id AND d.revision = pin.revision AND d.content_hash = pin.content_hash
WHERE """
    + _IN_SCOPE
)
_SLICE_SQL = "substr(d.body, %(first)s, %(count)s)"
# The first page: a body within the chain limit whole (the window is all of it).
_FIRST_SQL = f"CASE WHEN octet_length(d.body) <= %(limit)s THEN d.body ELSE {_SLICE_SQL} END"


def _current_document(
    session: AgentSession, route: Route, claims: ReferenceClaims, body_sql: str, **params: Any
) -> tuple[Any, ...]:
    """The row of `body_sql` if the document is still exactly what the ref was issued for.

    Returns `(title, total UTF-8 bytes of the body, *body columns)`; 409 `knowledge_changed`
    when the document is gone, changed, not ready, out of the route's scope or hidden from
    the principal.
    """
    visibility, scope = _scope(session, route)
    with connection.cursor() as cursor:
        cursor.execute(
            _DOCUMENT_SQL.format(body=body_sql, table=Document._meta.db_table),
            {
                "id": claims.document_id,
                "revision": claims.revision,
                "content_hash": claims.content_hash,
                **scope,
                **params,
            },
        )
        row = cursor.fetchone()
    if row is None:
        raise KnowledgeChanged()
    title, metadata, total_bytes, *body = row
    if not visibility.admits(_decoded(metadata)):
        raise KnowledgeChanged()
    return (title, total_bytes, *body)


def _scope(session: AgentSession, route: Route) -> tuple[Visibility, dict[str, Any]]:
    """The principal's visibility, and the parameters of `_IN_SCOPE` for this route."""
    visibility = visibility_for(session)
    kb_ids = [kb.pk for kb in searchable_knowledge_bases(route.bound_knowledge_bases(), visibility)]
    return visibility, {"ready": Document.Status.READY.value, "kbs": kb_ids}


def _decoded(metadata: Any) -> Any:
    """Django's PostgreSQL backend leaves jsonb undecoded in raw rows."""
    return json.loads(metadata) if isinstance(metadata, str) else metadata


def pinned_bodies(session: AgentSession, route: Route, hits: Sequence[Hit]) -> dict[int, str]:
    """The whole body of each hit's document, by document id, where that document is still
    the revision the hit was found in and the principal may still read it: what a read of
    the hit's ref would check. A document that changed since is left out, never replaced by
    its newer text (one statement, whatever the number of hits)."""
    if not hits:
        return {}
    visibility, scope = _scope(session, route)
    with connection.cursor() as cursor:
        cursor.execute(
            _BODIES_SQL.format(table=Document._meta.db_table),
            {
                "ids": [hit.document_id for hit in hits],
                "revisions": [hit.revision for hit in hits],
                "hashes": [hit.content_hash for hit in hits],
                **scope,
            },
        )
        rows = cursor.fetchall()
    return {pk: body for pk, metadata, body in rows if visibility.admits(_decoded(metadata))}


def _slice(
    session: AgentSession, route: Route, claims: ReferenceClaims, start: int, count: int
) -> _Piece:
    """`count` characters of the body from `start`, fewer where the body ends."""
    title, total_bytes, text = _current_document(
        session,
        route,
        claims,
        _SLICE_SQL,
        first=min(start + 1, _INT4_MAX),
        count=min(count, _INT4_MAX),
    )
    return _Piece(title, total_bytes, text, start, len(text) < count)


def _first_piece(session: AgentSession, route: Route, claims: ReferenceClaims, hit: int) -> _Piece:
    """What the first page needs: the body up to the furthest a window holding `hit` reaches.

    A body within the chain limit comes whole. Of a longer one, the text after the hit is
    what the window can show, and the text before it what placing the window depends on: a
    heading line inside fenced code is no heading, and whether a line is inside a fence
    depends on every fence line before it.
    """
    limit = constants.READ_CHAIN_MAX_BYTES
    count = min(hit + limit + _LOOKAHEAD, _INT4_MAX)
    title, total_bytes, text = _current_document(
        session, route, claims, _FIRST_SQL, limit=limit, first=1, count=count
    )
    return _Piece(title, total_bytes, text, 0, total_bytes <= limit or len(text) < count)


def _whole(session: AgentSession, route: Route, claims: ReferenceClaims) -> _Piece:
    """The whole body, for the rare first page whose piece cannot settle the window."""
    title, total_bytes, body = _current_document(session, route, claims, "d.body")
    return _Piece(title, total_bytes, body, 0, True)


def _window_from_piece(piece: _Piece, hit: int) -> Window:
    """`chain_window(body, hit)`, from the beginning of the body `_first_piece` fetched.

    Only the headings just before the hit are looked for (`last_heading`), and the window's
    end is measured from its start: Python's work is about the window, not the body.
    `PieceTooShort` in the rare cases the piece cannot settle it (a line running past the
    window, front matter running past the hit).
    """
    limit = constants.READ_CHAIN_MAX_BYTES
    text = piece.text
    if piece.total_bytes <= limit:
        return Window(0, len(text))  # the piece is the whole body
    if hit > len(text):
        raise PieceTooShort("the hit lies beyond the body")
    # At least one byte per character: `limit // 2` characters are too many already.
    if hit < limit // 2 and utf8_len(text[:hit]) < limit // 2:
        start = 0
    else:
        # Nor can a heading more than `limit // 2 - 1` characters before the hit place it.
        floor = max(0, hit - (limit // 2 - 1))
        heading = last_heading(text, hit, floor=floor, complete=piece.complete)
        start = hit
        if heading is not None and utf8_len(text[heading.start : hit]) < limit // 2:
            start = heading.start
    return Window(start, fit_end(text, start, limit, escaped=False))


def read(
    session: AgentSession,
    route: Route,
    ref: str,
    *,
    cursor: str | None = None,
    run_id: str | None = None,
    max_bytes: int = constants.READ_DEFAULT_BYTES,
    now: float | None = None,
) -> dict[str, Any]:
    """One page of the referenced document; the rendered body is ≤ `max_bytes`."""
    now = time.time() if now is None else now
    identity = Identity.for_session(session, route.route_key)
    claims, cursor_claims = _verify(identity, ref, cursor, run_id, now)
    run: Run | None = current_run(session, route, run_id) if run_id is not None else None
    scope_revision = route.knowledge_scope_revision
    if claims.knowledge_scope_revision != scope_revision:
        raise KnowledgeScopeChanged()
    limit = constants.READ_CHAIN_MAX_BYTES

    if cursor_claims is None:
        piece = _first_piece(session, route, claims, claims.hit_start)
        try:
            window = _window_from_piece(piece, claims.hit_start)
        except PieceTooShort:
            piece = _whole(session, route, claims)
            window = chain_window(piece.text, min(claims.hit_start, len(piece.text)))
        start, consumed = window.start, 0
    else:
        window = Window(cursor_claims.window_start, cursor_claims.window_end)
        start, consumed = cursor_claims.offset, cursor_claims.consumed
        if not window.start <= start <= window.end:
            raise KnowledgeChanged()
        piece = _slice(session, route, claims, start, max_bytes + _LOOKAHEAD)
        if piece.complete and window.end > start + len(piece.text):
            raise KnowledgeChanged()  # the body ends before the window does
    # The window is the whole body exactly when the body fits the chain limit.
    covers_source = window.start == 0 and piece.total_bytes <= limit
    text, base = piece.text, piece.base

    envelope: dict[str, Any] = {
        "schema_version": constants.SCHEMA_READ,
        "route": route.route_key,
    }
    if run is not None:
        envelope["run_id"] = run.run_id
    envelope.update(
        {
            "knowledge_scope_revision": scope_revision,
            "ref": ref,
            "revision": claims.revision,
            "title": piece.title,
            "content": "",
            "trust": constants.TRUST_REFERENCE_ONLY,
            "next_cursor": None,
            "truncated": False,
            "budget_exhausted": False,
            "total_content_bytes": piece.total_bytes,
            "read_chain_max_bytes": limit,
        }
    )

    def finalize(end: int) -> dict[str, Any]:
        more = base + end < window.end
        next_cursor = None
        if more:
            next_cursor = sign_cursor(
                identity,
                CursorClaims(
                    ref=ref,
                    run_id=run_id,
                    offset=base + end,
                    consumed=consumed + utf8_len(text[start - base : end]),
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

    # Sized first without a cursor: the page that ends the window needs none, and takes all
    # the room. A page that does not end it gets its cursor on the second sizing, which
    # shrinks the room by exactly the cursor's cost (one render more than a placeholder,
    # which would cost the last page the placeholder's size and could split a body that
    # fits one page into two).
    # The piece holds `max_bytes` + `_LOOKAHEAD` characters past `start` (or runs to the end
    # of the body), more than a page can take: it is cut exactly as the whole body would be.
    end_limit = min(window.end - base, len(text))
    response, _ = fit_read_page(
        envelope, text, start - base, end_limit, max_bytes, finalize=finalize
    )
    return response
