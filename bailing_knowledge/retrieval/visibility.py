"""Who is searching, and the SQL that hides from them what they may not see.

Both legs of a search put these conditions in their own WHERE clause, before any ranking, so
a hidden document never takes a candidate slot, a rank or a share of a score.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..models import KnowledgeBase

# A chunk `c` of a document `d` is visible: current revision of a ready document, and the
# principal's audience and roles admitted by the document's metadata.
DOCUMENT_VISIBLE_SQL = """
    d.id = c.document_id
    AND d.status = 'ready'
    AND c.revision = d.revision
    AND (NOT d.metadata ? 'audiences' OR d.metadata -> 'audiences' ? %(audience)s)
    AND (NOT d.metadata ? 'roles' OR d.metadata -> 'roles' ?| %(roles)s::text[])
"""
# ... and in one of the KBs searched (the route's enabled KBs for this tenant).
VISIBLE_SQL = "c.knowledge_base_id = ANY(%(kbs)s) AND " + DOCUMENT_VISIBLE_SQL


@dataclass(frozen=True)
class Visibility:
    """Who is searching: used in SQL to hide what they may not see."""

    tenant: str = ""
    audience: str = ""
    roles: tuple[str, ...] = ()

    def params(self, kb_ids: Sequence[int]) -> dict[str, Any]:
        """The parameters `VISIBLE_SQL` and `DOCUMENT_VISIBLE_SQL` expect."""
        return {"kbs": list(kb_ids), "audience": self.audience, "roles": list(self.roles)}


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
