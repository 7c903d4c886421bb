"""The host side of the agent knowledge protocol: a Python client, LLM tools, an MCP server.

Agents (LLM hosts) use this package to reach a business system's knowledge over HTTP with
a bearer token. It imports neither Django nor the server side of this app, so a host
installs `bailing-knowledge[client]` and nothing of the server runs or needs configuring.

* `KnowledgeClient` / `AsyncKnowledgeClient`: capabilities, search, read and whole read
  chains, with typed results and one exception class per protocol error family;
* `negotiate_delivery` / `delivery_from_capabilities`: may a turn ask for on-demand delivery;
* `HostSession` / `TurnGuard`: per-turn discipline (late answers dropped, per-turn caches);
* `bailing_knowledge.client.tools`: tool definitions and the tool-call executor;
* `bailing_knowledge.client.mcp_server` (extra `mcp`): the MCP server.
"""

from ._http import DEFAULT_API_PREFIX, AsyncKnowledgeClient, KnowledgeClient, RawResponse
from .errors import (
    Conflict,
    IdempotencyConflict,
    InvalidRequest,
    KnowledgeChanged,
    KnowledgeError,
    MethodNotAllowed,
    NotFound,
    ProtocolError,
    RateLimited,
    ReferenceExpired,
    ReferenceInvalid,
    ReferenceRejected,
    RouteNotAllowed,
    RunNotCurrent,
    ScopeChanged,
    ServerError,
    StaleTurn,
    Unauthorized,
    Unavailable,
    Unreachable,
)
from .host import AsyncHostSession, HostSession, Turn, TurnCache, TurnGuard
from .models import Capabilities, DeliveryMode, Hint, Limits, ReadChain, ReadPage, SearchResult
from .negotiation import (
    TurnKnowledge,
    anegotiate_delivery,
    delivery_from_capabilities,
    negotiate_delivery,
    turn_knowledge,
    turn_request_options,
)
from .tools import aexecute_tool_call, anthropic_tools, execute_tool_call, openai_tools

__all__ = [
    "DEFAULT_API_PREFIX",
    "AsyncHostSession",
    "AsyncKnowledgeClient",
    "Capabilities",
    "Conflict",
    "DeliveryMode",
    "Hint",
    "HostSession",
    "IdempotencyConflict",
    "InvalidRequest",
    "KnowledgeChanged",
    "KnowledgeClient",
    "KnowledgeError",
    "Limits",
    "MethodNotAllowed",
    "NotFound",
    "ProtocolError",
    "RateLimited",
    "RawResponse",
    "ReadChain",
    "ReadPage",
    "ReferenceExpired",
    "ReferenceInvalid",
    "ReferenceRejected",
    "RouteNotAllowed",
    "RunNotCurrent",
    "ScopeChanged",
    "SearchResult",
    "ServerError",
    "StaleTurn",
    "Turn",
    "TurnCache",
    "TurnGuard",
    "TurnKnowledge",
    "Unauthorized",
    "Unavailable",
    "Unreachable",
    "aexecute_tool_call",
    "anegotiate_delivery",
    "anthropic_tools",
    "delivery_from_capabilities",
    "execute_tool_call",
    "negotiate_delivery",
    "openai_tools",
    "turn_knowledge",
    "turn_request_options",
]
