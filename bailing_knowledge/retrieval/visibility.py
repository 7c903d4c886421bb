"""What a principal may see: the one definition, as SQL and as a per-document check.

Both legs of a search put the SQL conditions in their own WHERE clause, before any ranking,
so a hidden document never takes a candidate slot, a rank or a share of a score. A read
fetches one document and applies `Visibility.admits` to its metadata: the same rule, which
tests/retrieval/test_visibility.py checks against the SQL over generated metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..models import AgentSession, KnowledgeBase
from .arrays import id_array, text_array

# Metadata keys that restrict who sees a document: lists of strings, absent for everyone.
VISIBILITY_KEYS = ("audiences", "roles")

# A chunk `c` of a document `d` is visible: current revision of a ready document, and the
# principal's audience and roles admitted by the document's metadata.
DOCUMENT_VISIBLE_SQL = """
    d.id = c.document_id
    AND d.status = 'ready'
    AND c.revision = d.revision
    AND (NOT d.metadata ? 'audiences' OR d.metadata -> 'audiences' ? %(audience)s)
    AND (NOT d.metadata ? 'roles' OR d.metadata -> 'roles' ?| %(roles)s::text[])
"""
# The same for a document open to everyone (ready, no audience or role restriction): true or
# no row. The partial index `bk_document_open` answers it alone, an index-only scan, where
# `DOCUMENT_VISIBLE_SQL` reads the document's row; a chunk it does not admit still needs
# that check (its document may admit the principal through its audiences and roles).
OPEN_DOCUMENT_SQL = """
    d.id = c.document_id
    AND d.revision = c.revision
    AND d.status = 'ready'
    AND NOT d.metadata ? 'audiences'
    AND NOT d.metadata ? 'roles'
"""
# ... and in one of the KBs searched (the route's enabled KBs for this tenant).
VISIBLE_SQL = "c.knowledge_base_id = ANY(%(kbs)s::bigint[]) AND " + DOCUMENT_VISIBLE_SQL


@dataclass(frozen=True)
class Visibility:
    """Who is searching: used in SQL to hide what they may not see."""

    tenant: str = ""
    audience: str = ""
    roles: tuple[str, ...] = ()

    def params(self, kb_ids: Sequence[int]) -> dict[str, Any]:
        """The parameters `VISIBLE_SQL` and `DOCUMENT_VISIBLE_SQL` expect (array literals)."""
        return {"kbs": id_array(kb_ids), "audience": self.audience, "roles": text_array(self.roles)}

    def admits(self, metadata: dict[str, Any]) -> bool:
        """Whether a document with this metadata is visible: the audience and role part of
        `DOCUMENT_VISIBLE_SQL`, with PostgreSQL's `?` and `?|` semantics, so that a key
        present with any value (`null` included) restricts exactly as it does in SQL."""
        if "audiences" in metadata and not _jsonb_has_any(metadata["audiences"], [self.audience]):
            return False
        return "roles" not in metadata or _jsonb_has_any(metadata["roles"], self.roles)


def narrowest(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The restricting keys of metadata that admits no principal that `old` or `new` refuses.

    For a document that keeps serving old text while new text waits (queued) or failed to
    index: a restriction the edit adds must hold at once, and one it lifts must not open the
    old text to principals that were refused it. Exact for a principal with at most one role;
    one holding several may be refused when each list names a different one of its roles."""
    restricted: dict[str, Any] = {}
    for key in VISIBILITY_KEYS:
        if key in old and key in new and old[key] != new[key]:
            admitted = _names(old[key])
            restricted[key] = [name for name in _names(new[key]) if name in admitted]
        elif key in old or key in new:
            restricted[key] = new[key] if key in new else old[key]
    return restricted


def _names(value: Any) -> list[str]:
    """The names a restricting key's value admits (`_jsonb_has_any`), in order, once each."""
    if isinstance(value, list):
        return list(dict.fromkeys(item for item in value if isinstance(item, str)))
    if isinstance(value, dict):
        return list(value)
    return [value] if isinstance(value, str) else []


def _jsonb_has_any(value: Any, keys: Sequence[str]) -> bool:
    """PostgreSQL's `value ?| keys`: a key is an element string of an array, a key of an
    object, or the string itself; nothing else (numbers, null, nested values) matches."""
    if isinstance(value, list):
        return any(isinstance(item, str) and item in keys for item in value)
    if isinstance(value, dict):
        return any(key in value for key in keys)
    return isinstance(value, str) and value in keys


def visibility_for(session: AgentSession) -> Visibility:
    """The principal an agent session acts for, as searches and reads see it."""
    return Visibility(
        tenant=session.principal_tenant,
        audience=session.principal_audience,
        roles=tuple(session.principal_roles),
    )


def searchable_knowledge_bases(
    kbs: Sequence[KnowledgeBase], visibility: Visibility
) -> list[KnowledgeBase]:
    """Enabled KBs whose tenant binding (if any) matches the principal's tenant."""
    return [kb for kb in kbs if kb.enabled and (not kb.tenant or kb.tenant == visibility.tenant)]


def group_knowledge_bases(
    kbs: Sequence[KnowledgeBase], attribute: str
) -> list[tuple[str, list[KnowledgeBase]]]:
    """KBs grouped by `attribute` ("language", "embedder"): each group is one search leg."""
    groups: dict[str, list[KnowledgeBase]] = {}
    for kb in kbs:
        groups.setdefault(getattr(kb, attribute), []).append(kb)
    return sorted(groups.items())
