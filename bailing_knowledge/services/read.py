"""Knowledge read: paged, byte-budgeted, revision-pinned reading of a referenced document.

A chain starts with a ref from search and continues with the `next_cursor` of each page.
Every page re-checks, in this order: the ref's and cursor's signatures (400), their age
(410), the run (409 `run_not_current`), the route's knowledge configuration (409
`knowledge_scope_changed`) and the document itself (409 `knowledge_changed`). The document
row is read once per page, in one statement, so a page never mixes two revisions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .. import constants
from ..budget import fit_end, fit_read_page, utf8_len
from ..exceptions import (
    KnowledgeChanged,
    KnowledgeReferenceExpired,
    KnowledgeReferenceInvalid,
    KnowledgeScopeChanged,
)
from ..ingestion.chunker import find_headings
from ..models import AgentSession, Document, Route, Run
from ..retrieval.hybrid import searchable_knowledge_bases
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
from .search import visibility_for


@dataclass(frozen=True)
class Window:
    """The part of a body one chain may expose: at most `READ_CHAIN_MAX_BYTES` of UTF-8."""

    start: int
    end: int


def chain_window(body: str, hit_start: int) -> Window:
    """The whole body when it fits the chain limit; otherwise a window holding the hit.

    The window starts at the heading of the hit's section when that still reaches the hit,
    else at the hit itself, and runs as far as the chain limit allows.
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


_DOCUMENT_FIELDS = (
    "id",
    "knowledge_base_id",
    "title",
    "body",
    "status",
    "revision",
    "content_hash",
    "metadata",
)


def _current_document(session: AgentSession, route: Route, claims: ReferenceClaims) -> Document:
    """The referenced document, if it is still exactly what the ref was issued for."""
    visibility = visibility_for(session)
    kb_ids = {kb.pk for kb in searchable_knowledge_bases(route.knowledge_bases.all(), visibility)}
    document = Document.objects.only(*_DOCUMENT_FIELDS).filter(pk=claims.document_id).first()
    if (
        document is None
        or document.knowledge_base_id not in kb_ids
        or document.status != Document.Status.READY
        or document.revision != claims.revision
        or document.content_hash != claims.content_hash
        or not _visible(document.metadata, visibility.audience, visibility.roles)
    ):
        raise KnowledgeChanged()
    return document


def _visible(metadata: dict[str, Any], audience: str, roles: tuple[str, ...]) -> bool:
    """The same audience/role rule the search applies in SQL."""
    audiences = metadata.get("audiences")
    allowed_roles = metadata.get("roles")
    if audiences is not None and audience not in audiences:
        return False
    return allowed_roles is None or bool(set(allowed_roles) & set(roles))


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
    document = _current_document(session, route, claims)
    body = document.body

    if cursor_claims is None:
        window = chain_window(body, min(claims.hit_start, len(body)))
        start, consumed = window.start, 0
    else:
        window = Window(cursor_claims.window_start, cursor_claims.window_end)
        start, consumed = cursor_claims.offset, cursor_claims.consumed
        if not window.start <= start <= window.end <= len(body):
            raise KnowledgeChanged()
    covers_source = window.start == 0 and window.end == len(body)

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
    )

    def finalize(end: int) -> dict[str, Any]:
        more = end < window.end
        next_cursor = None
        if more:
            next_cursor = sign_cursor(
                identity,
                CursorClaims(
                    ref=ref,
                    run_id=run_id,
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

    # A placeholder the size of a cursor, so the first sizing already leaves room for it.
    sized = {**envelope, "next_cursor": "x" * 80}
    response, _ = fit_read_page(sized, body, start, window.end, max_bytes, finalize=finalize)
    return response
