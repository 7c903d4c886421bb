"""Knowledge search: hybrid retrieval, validated hits, signed references, a 4096-byte answer."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .. import constants
from ..budget import fit_search_response
from ..models import AgentSession, KnowledgeBase, Route, Run
from ..retrieval.hybrid import Hit, HybridSearch, searchable_knowledge_bases
from ..retrieval.visibility import Visibility, visibility_for
from ..signing import Identity, ReferenceClaims, sign_reference
from .capabilities import knowledge_available


@dataclass(frozen=True)
class SearchOptions:
    """Switches for tests and benchmarks: one leg alone, or both (the default)."""

    use_vector: bool = True
    use_lexical: bool = True


def _rfc3339(timestamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))


def sign_hits(
    session: AgentSession,
    route: Route,
    hits: list[Hit],
    *,
    run: Run | None = None,
    now: float | None = None,
    scope_revision: str | None = None,
) -> list[dict[str, Any]]:
    """Hint dicts with signed refs for hits; `summary` is the whole hit text (budgets cut it).

    `scope_revision`: the route's `knowledge_scope_revision`, when the caller has it (it is
    a hash of the route's configuration, computed anew on each access)."""
    issued_at = int(time.time() if now is None else now)
    expires_at = _rfc3339(issued_at + constants.REFERENCE_TTL_SECONDS)
    identity = Identity.for_session(session, route.route_key)
    if scope_revision is None:
        scope_revision = route.knowledge_scope_revision
    hints = []
    for hit in hits:
        claims = ReferenceClaims(
            run_id=run.run_id if run is not None else None,
            knowledge_scope_revision=scope_revision,
            document_id=hit.document_id,
            revision=hit.revision,
            content_hash=hit.content_hash,
            hit_start=hit.start,
            hit_end=hit.end,
            issued_at=issued_at,
        )
        hints.append(
            {
                "ref": sign_reference(identity, claims, now=issued_at),
                "title": hit.title,
                "summary": hit.text,
                "revision": hit.revision,
                "score": hit.score,
                "expires_at": expires_at,
            }
        )
    return hints


#: What the last search of a token on a route searched (its knowledge bases and their
#: visibility), from which its next search's opening statements are composed and sent
#: behind the token's check (`early_search`); and how many a process remembers (past it, it
#: forgets them all). Dict operations are atomic: threads share it without a lock.
EARLY_MEMORY_SIZE = 4096
_searched: dict[tuple[str, str], tuple[list[KnowledgeBase], Visibility]] = {}


def early_search(
    cursor: Any, token_hash: str, route_key: str, query: str
) -> Iterator[list[str]] | None:
    """The opening statements of a search for `query`, composed before the token is checked
    from what its last search on the route searched, to be sent right behind the check (in
    groups, as they are composed: `HybridSearch.early_statements`).

    The search claims them only if it would send exactly these once the token, the route
    and the body have passed (`SearchTransaction.run`): the same knowledge bases, the same
    visibility, the same query and settings. Else they are discarded unread, and a refused
    request also drops what is remembered (`forget_early_search`), so a token that stops
    passing costs the server one such opening at most."""
    known = _searched.get((token_hash, route_key))
    if known is None:
        return None
    kbs, visibility = known
    return HybridSearch(query, kbs, visibility).early_statements(cursor)


def forget_early_search(token_hash: str, route_key: str) -> None:
    """Forget what a token last searched on a route (`early_search`)."""
    _searched.pop((token_hash, route_key), None)


def _remember_search(
    session: AgentSession, route: Route, kbs: list[KnowledgeBase], visibility: Visibility
) -> None:
    if len(_searched) >= EARLY_MEMORY_SIZE:
        _searched.clear()
    _searched[(session.token_hash, route.route_key)] = (kbs, visibility)


def find_hits(
    session: AgentSession,
    route: Route,
    query: str,
    *,
    max_hits: int,
    per_document: int = 1,
    max_documents: int | None = None,
    options: SearchOptions = SearchOptions(),
) -> tuple[str, list[Hit]]:
    """`(status, hits)` in the route's visible scope, with its `min_score` applied."""
    if not knowledge_available(route):
        forget_early_search(session.token_hash, route.route_key)
        return "disabled", []
    visibility = visibility_for(session)
    kbs = searchable_knowledge_bases(route.bound_knowledge_bases(), visibility)
    if kbs and options == SearchOptions():
        _remember_search(session, route, kbs, visibility)
    else:
        forget_early_search(session.token_hash, route.route_key)
    result = HybridSearch(
        query, kbs, visibility, use_vector=options.use_vector, use_lexical=options.use_lexical
    ).run(
        max_hits=max_hits,
        min_score=route.min_score,
        per_document=per_document,
        max_documents=max_documents,
    )
    return result.status, result.hits


def search_hints(
    session: AgentSession,
    route: Route,
    query: str,
    *,
    limit: int = constants.SEARCH_MAX_RESULTS,
    run: Run | None = None,
    now: float | None = None,
    options: SearchOptions = SearchOptions(),
    scope_revision: str | None = None,
) -> tuple[str, list[dict[str, Any]]]:
    """`(status, hints)` for a query: best first, one per document, at most three.

    Used by the search endpoint and by server-side turn preparation alike.
    """
    max_hits = min(limit, constants.SEARCH_MAX_RESULTS, route.max_docs)
    status, hits = find_hits(session, route, query, max_hits=max_hits, options=options)
    return status, sign_hits(session, route, hits, run=run, now=now, scope_revision=scope_revision)


def search(
    session: AgentSession,
    route: Route,
    query: str,
    *,
    limit: int = constants.SEARCH_MAX_RESULTS,
    run: Run | None = None,
    now: float | None = None,
    options: SearchOptions = SearchOptions(),
) -> dict[str, Any]:
    """The search response body, rendered size ≤ 4096 bytes."""
    scope_revision = route.knowledge_scope_revision
    status, hints = search_hints(
        session,
        route,
        query,
        limit=limit,
        run=run,
        now=now,
        options=options,
        scope_revision=scope_revision,
    )
    envelope: dict[str, Any] = {
        "schema_version": constants.SCHEMA_SEARCH,
        "route": route.route_key,
    }
    if run is not None:
        envelope["run_id"] = run.run_id
    envelope.update(
        {
            "knowledge_scope_revision": scope_revision,
            "status": status,
            "trust": constants.TRUST_REFERENCE_ONLY,
            "truncated": False,
        }
    )
    response, _ = fit_search_response(envelope, hints)
    return response
