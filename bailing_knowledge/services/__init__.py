"""The Python API for every operation; the admin, the CLI and the HTTP views all call it."""

from .capabilities import capabilities, knowledge_available
from .catalog import (
    bind_knowledge_bases,
    create_client,
    create_knowledge_base,
    create_route,
    get_client,
    get_knowledge_base,
    get_route,
    set_agent_client_enabled,
    set_client_enabled,
    set_knowledge_base_enabled,
    set_route_enabled,
    unbind_knowledge_bases,
    update_client,
    update_route,
)
from .reindex import (
    ReindexReport,
    reindex_documents,
    reindex_knowledge_base,
    set_knowledge_base_embedder,
    set_knowledge_base_language,
)
from .sessions import IssuedSession, get_session, issue_session, list_sessions, revoke_session

__all__ = [
    "IssuedSession",
    "ReindexReport",
    "bind_knowledge_bases",
    "capabilities",
    "create_client",
    "create_knowledge_base",
    "create_route",
    "get_client",
    "get_knowledge_base",
    "get_route",
    "get_session",
    "issue_session",
    "knowledge_available",
    "list_sessions",
    "reindex_documents",
    "reindex_knowledge_base",
    "revoke_session",
    "set_agent_client_enabled",
    "set_client_enabled",
    "set_knowledge_base_embedder",
    "set_knowledge_base_enabled",
    "set_knowledge_base_language",
    "set_route_enabled",
    "unbind_knowledge_bases",
    "update_client",
    "update_route",
]
