"""Why a search answered what it did: per-leg ranks, fused scores, and what was hidden.

This serves the admin's retrieval playground. It is read-only and built from the public
functions of the retrieval layer (the lexical ranking, the hybrid search with one leg or
both, the visibility SQL), so it explains the search the API runs instead of imitating it.

A document hidden from the principal is named by its id, its knowledge base and the reason;
its title, source key and text never leave this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import connection
from django.db.models import Q

from ..conf import knowledge_settings
from ..models import AgentSession, Chunk, Client, Document, KnowledgeBase, Route
from ..retrieval.embedders import EmbedderError, get_embedder
from ..retrieval.hybrid import Hit, HybridSearch, searchable_knowledge_bases
from ..retrieval.lexical import lexical_ranking
from ..retrieval.vector import vector_literal
from ..retrieval.visibility import (
    VISIBLE_SQL,
    Visibility,
    group_knowledge_bases,
    visibility_for,
)
from ..signing import Identity, SignatureError, verify_reference
from .capabilities import knowledge_available

__all__ = [
    "Candidate",
    "Explanation",
    "Hidden",
    "NotReady",
    "explain_search",
    "principal_session",
]

# Candidates and hidden documents listed, best first.
DEPTH = 10
# Audiences tried when looking for documents hidden by their audience or roles.
MAX_AUDIENCES = 8
_NO_RANK = 2**31

# A client id no real client can have (app ids are slugs): refs signed for a hand-built
# principal are never valid for an agent's session.
PLAYGROUND_CLIENT = "admin playground"
PLAYGROUND_SESSION = "admin playground"

_VISIBLE_CHUNKS = f"""
SELECT c.id FROM bailing_knowledge_chunk c, bailing_knowledge_document d
WHERE c.id = ANY(%(ids)s) AND {VISIBLE_SQL}
"""  # noqa: S608
_SIMILARITY = """
SELECT c.id, 1 - (c.embedding <=> %(vector)s::vector)
FROM bailing_knowledge_chunk c
WHERE c.id = ANY(%(ids)s) AND c.embedding_dimensions = %(dimensions)s
"""


@dataclass(frozen=True)
class Candidate:
    """A chunk the principal may see, as the fusion ranked it, and what became of it."""

    chunk_id: int
    document_id: int
    knowledge_base: str
    title: str
    start: int
    end: int
    text: str
    fused_score: float
    lexical_rank: int | None
    lexical_score: float | None
    vector_rank: int | None
    vector_similarity: float | None
    # "returned", "below_min_score", "same_document" (a better chunk of it was returned) or
    # "over_limit" (the hint limit was reached before it).
    outcome: str


@dataclass(frozen=True)
class Hidden:
    """A document that matched the query but that the principal may not see."""

    document_id: int
    knowledge_base: str
    reason: str
    # Its best rank in a leg run without the restriction that hid it.
    lexical_rank: int | None
    vector_rank: int | None


@dataclass(frozen=True)
class NotReady:
    """A document of the route's knowledge bases that no search reaches right now."""

    document_id: int
    knowledge_base: str
    status: str


@dataclass
class Explanation:
    status: str
    knowledge_available: bool
    searched: list[str] = field(default_factory=list)
    candidates: list[Candidate] = field(default_factory=list)
    hidden: list[Hidden] = field(default_factory=list)
    not_ready: list[NotReady] = field(default_factory=list)
    # Chunks a leg found but the final check dropped: changed since they were indexed.
    stale_chunks: list[int] = field(default_factory=list)


def principal_session(
    *, principal_id: str = "", tenant: str = "", roles: Sequence[str] = (), audience: str = ""
) -> AgentSession:
    """An unsaved session for a hand-built principal, to search and read as it would.

    Its identity (client and session id) cannot be any agent's, so the refs it gets are
    useless outside the playground.
    """
    session = AgentSession(
        session_id=PLAYGROUND_SESSION,
        principal_id=principal_id or "playground",
        principal_tenant=tenant,
        principal_roles=[role for role in roles if role],
        principal_audience=audience,
    )
    session.client = Client(app_id=PLAYGROUND_CLIENT)
    return session


def explain_search(
    session: AgentSession, route: Route, query: str, hints: Iterable[dict[str, Any]] = ()
) -> Explanation:
    """What the search on `route` for `session`'s principal considered for `query`.

    `hints` are the hints the search answered (their refs tell which candidates they are).
    """
    visibility = visibility_for(session)
    available = knowledge_available(route)
    route_kbs = route.bound_knowledge_bases()
    kbs = searchable_knowledge_bases(route_kbs, visibility) if available else []
    status = "disabled"
    candidates: list[Candidate] = []
    stale: list[int] = []
    if kbs:
        fused = HybridSearch(query, kbs, visibility)
        width = 2 * int(knowledge_settings.SEARCH_CANDIDATES)
        result = fused.run(max_hits=width, per_document=width, max_documents=width)
        status = result.status
        returned = _returned(session, route, hints)
        candidates = _candidates(query, kbs, visibility, result.hits, returned, route.min_score)
        stale = sorted(set(fused.documents) - {hit.chunk_id for hit in result.hits})
    excluded = [kb for kb in route_kbs if kb not in kbs]
    hidden = _hidden_in(query, excluded, visibility, _kb_reasons(route, excluded))
    hidden += _hidden_by_metadata(query, kbs, visibility)
    hidden.sort(key=_best_rank)
    return Explanation(
        status=status,
        knowledge_available=available,
        searched=[kb.slug for kb in kbs],
        candidates=candidates,
        hidden=hidden[:DEPTH],
        not_ready=_not_ready(route_kbs),
        stale_chunks=stale,
    )


def _returned(
    session: AgentSession, route: Route, hints: Iterable[dict[str, Any]]
) -> set[tuple[int, int, int]]:
    """(document, start, end) of each hint, read from its ref."""
    identity = Identity.for_session(session, route.route_key)
    found = set()
    for hint in hints:
        try:
            claims = verify_reference(hint["ref"], identity, run_id=None)
        except SignatureError:
            continue
        found.add((claims.document_id, claims.hit_start, claims.hit_end))
    return found


def _candidates(
    query: str,
    kbs: list[KnowledgeBase],
    visibility: Visibility,
    hits: list[Hit],
    returned: set[tuple[int, int, int]],
    min_score: float,
) -> list[Candidate]:
    top = hits[:DEPTH]
    lexical = _lexical(query, kbs, visibility)
    vector = _vector_ranks(query, kbs, visibility)
    similarity = _similarities(query, kbs, [hit.chunk_id for hit in top])
    slugs = {kb.pk: kb.slug for kb in kbs}
    documents_returned = {document for document, _, _ in returned}
    candidates = []
    for hit in top:
        if (hit.document_id, hit.start, hit.end) in returned:
            outcome = "returned"
        elif hit.score < min_score:
            outcome = "below_min_score"
        elif hit.document_id in documents_returned:
            outcome = "same_document"
        else:
            outcome = "over_limit"
        rank, score = lexical.get(hit.chunk_id, (None, None))
        candidates.append(
            Candidate(
                chunk_id=hit.chunk_id,
                document_id=hit.document_id,
                knowledge_base=slugs[hit.knowledge_base_id],
                title=hit.title,
                start=hit.start,
                end=hit.end,
                text=hit.text,
                fused_score=hit.score,
                lexical_rank=rank,
                lexical_score=None if score is None else round(score, 4),
                vector_rank=vector.get(hit.chunk_id),
                vector_similarity=similarity.get(hit.chunk_id),
                outcome=outcome,
            )
        )
    return candidates


def _lexical(
    query: str, kbs: list[KnowledgeBase], visibility: Visibility
) -> dict[int, tuple[int, float]]:
    """chunk -> (rank, BM25 score) in the lexical leg."""
    ranking = lexical_ranking(query, kbs, visibility, int(knowledge_settings.SEARCH_CANDIDATES))
    return {chunk: (rank, score) for rank, (chunk, score) in enumerate(ranking, start=1)}


def _vector_ranks(query: str, kbs: list[KnowledgeBase], visibility: Visibility) -> dict[int, int]:
    """chunk -> rank in the vector leg (the search run with that leg alone)."""
    width = int(knowledge_settings.SEARCH_CANDIDATES)
    result = HybridSearch(query, kbs, visibility, use_lexical=False).run(
        max_hits=width, per_document=width, max_documents=width
    )
    return {hit.chunk_id: rank for rank, hit in enumerate(result.hits, start=1)}


def _similarities(query: str, kbs: list[KnowledgeBase], chunk_ids: list[int]) -> dict[int, float]:
    """Cosine similarity of the query's vector to each chunk's, per embedder of the KBs."""
    similarities: dict[int, float] = {}
    if not chunk_ids:
        return similarities
    for alias, _group in group_knowledge_bases(kbs, "embedder"):
        try:
            embedder = get_embedder(alias)
            vector = embedder.embed_query(query)
        except EmbedderError:
            continue
        params = {"vector": vector_literal(vector), "ids": chunk_ids, "dimensions": len(vector)}
        with connection.cursor() as cursor:
            cursor.execute(_SIMILARITY, params)
            similarities.update((chunk, round(value, 4)) for chunk, value in cursor.fetchall())
    return similarities


def _kb_reasons(route: Route, excluded: list[KnowledgeBase]) -> dict[int, str]:
    reasons = {}
    for kb in excluded:
        if not route.knowledge_enabled:
            reasons[kb.pk] = "knowledge is switched off on this route"
        elif not kb.enabled:
            reasons[kb.pk] = f"knowledge base {kb.slug} is disabled"
        else:
            reasons[kb.pk] = f"knowledge base {kb.slug} belongs to another tenant ({kb.tenant})"
    return reasons


def _found(
    query: str, kbs: list[KnowledgeBase], visibility: Visibility
) -> tuple[dict[int, int], dict[int, int]]:
    """Each leg's ranks over `kbs` for `visibility`: (lexical, vector), chunk -> rank."""
    lexical = {chunk: rank for chunk, (rank, _) in _lexical(query, kbs, visibility).items()}
    return lexical, _vector_ranks(query, kbs, visibility)


def _hidden_in(
    query: str, kbs: list[KnowledgeBase], visibility: Visibility, reasons: dict[int, str]
) -> list[Hidden]:
    """Documents of knowledge bases the principal may not search that match the query."""
    if not kbs:
        return []
    lexical, vector = _found(query, kbs, visibility)
    slugs = {kb.pk: kb.slug for kb in kbs}
    return _by_document(lexical, vector, lambda document, kb: (slugs[kb], reasons[kb]))


def _hidden_by_metadata(
    query: str, kbs: list[KnowledgeBase], visibility: Visibility
) -> list[Hidden]:
    """Documents of searchable KBs that match the query but whose audience or roles hide
    them: found by searching as the audiences and roles the documents name."""
    if not kbs:
        return []
    restricted = (
        Document.objects.filter(knowledge_base__in=kbs, status=Document.Status.READY)
        .filter(Q(metadata__has_key="audiences") | Q(metadata__has_key="roles"))
        .values_list("metadata__audiences", "metadata__roles")
        .distinct()[:200]
    )
    audiences: set[str] = {visibility.audience}
    roles: set[str] = set(visibility.roles)
    for document_audiences, document_roles in restricted:
        audiences.update(str(a) for a in document_audiences or ())
        roles.update(str(r) for r in document_roles or ())
    if audiences == {visibility.audience} and roles == set(visibility.roles):
        return []
    lexical: dict[int, int] = {}
    vector: dict[int, int] = {}
    for audience in sorted(audiences)[:MAX_AUDIENCES]:
        wider = Visibility(tenant=visibility.tenant, audience=audience, roles=tuple(sorted(roles)))
        found_lexical, found_vector = _found(query, kbs, wider)
        for chunk, rank in found_lexical.items():
            lexical[chunk] = min(rank, lexical.get(chunk, rank))
        for chunk, rank in found_vector.items():
            vector[chunk] = min(rank, vector.get(chunk, rank))
    visible = _visible_chunks([*lexical, *vector], kbs, visibility)
    lexical = {chunk: rank for chunk, rank in lexical.items() if chunk not in visible}
    vector = {chunk: rank for chunk, rank in vector.items() if chunk not in visible}
    owners = {document for document, _ in _documents_of([*lexical, *vector]).values()}
    documents = {
        pk: (slug, metadata)
        for pk, slug, metadata in Document.objects.filter(pk__in=owners).values_list(
            "pk", "knowledge_base__slug", "metadata"
        )
    }

    def describe(document: int, kb: int) -> tuple[str, str]:
        slug, metadata = documents[document]
        return slug, _metadata_reason(metadata, visibility)

    return _by_document(lexical, vector, describe)


def _metadata_reason(metadata: dict[str, Any], visibility: Visibility) -> str:
    """Which of the document's restrictions the principal fails (the SQL decided it does)."""
    reasons = []
    audiences = metadata.get("audiences")
    if isinstance(audiences, list) and visibility.audience not in audiences:
        shown = ", ".join(str(a) for a in audiences) or "none"
        reasons.append(f"its audiences ({shown}) do not include '{visibility.audience}'")
    roles = metadata.get("roles")
    if isinstance(roles, list) and not set(roles) & set(visibility.roles):
        shown = ", ".join(str(r) for r in roles) or "none"
        reasons.append(f"it requires one of the roles {shown}")
    return "; ".join(reasons) or "its audience or roles exclude the principal"


def _visible_chunks(
    chunk_ids: list[int], kbs: list[KnowledgeBase], visibility: Visibility
) -> set[int]:
    if not chunk_ids:
        return set()
    params = {**visibility.params([kb.pk for kb in kbs]), "ids": chunk_ids}
    with connection.cursor() as cursor:
        cursor.execute(_VISIBLE_CHUNKS, params)
        return {row[0] for row in cursor.fetchall()}


def _documents_of(chunk_ids: list[int]) -> dict[int, tuple[int, int]]:
    """chunk -> (document, knowledge base)."""
    rows = Chunk.objects.filter(pk__in=chunk_ids).values_list(
        "pk", "document_id", "knowledge_base_id"
    )
    return {pk: (document, kb) for pk, document, kb in rows}


def _by_document(lexical: dict[int, int], vector: dict[int, int], describe: Any) -> list[Hidden]:
    """One `Hidden` per document, with its chunks' best rank in each leg."""
    owners = _documents_of([*lexical, *vector])
    best: dict[int, list[int | None]] = {}
    kb_of: dict[int, int] = {}
    for leg, ranks in enumerate((lexical, vector)):
        for chunk, rank in ranks.items():
            if chunk not in owners:
                continue
            document, kb = owners[chunk]
            kb_of[document] = kb
            slot = best.setdefault(document, [None, None])
            slot[leg] = rank if slot[leg] is None else min(rank, slot[leg])
    hidden = []
    for document, (lexical_rank, vector_rank) in best.items():
        slug, reason = describe(document, kb_of[document])
        hidden.append(Hidden(document, slug, reason, lexical_rank, vector_rank))
    return hidden


def _best_rank(hidden: Hidden) -> tuple[int, int]:
    ranks = [rank for rank in (hidden.lexical_rank, hidden.vector_rank) if rank is not None]
    return (min(ranks) if ranks else _NO_RANK, hidden.document_id)


def _not_ready(kbs: list[KnowledgeBase]) -> list[NotReady]:
    rows = (
        Document.objects.filter(knowledge_base__in=kbs)
        .exclude(status=Document.Status.READY)
        .order_by("-updated_at")
        .values_list("pk", "knowledge_base__slug", "status")[:DEPTH]
    )
    return [NotReady(pk, slug, status) for pk, slug, status in rows]
