"""Knowledge delivery negotiation: may a turn ask for `knowledge_delivery: "on_demand"`?

The rule, from the protocol's host side:

* `on_demand` only after the capabilities answer says `supported` and `enabled` and lists
  `on_demand` among its `delivery_modes`;
* a server that answers capabilities with 404, 405 or 501 predates the protocol: fall back
  to `inline` (the legacy turn, bodies included);
* knowledge disabled on the route (or not supported, or `on_demand` not offered): `inline`;
* 401, 403, any other 4xx, any 5xx, a redirect, a body that is not JSON or an unknown
  `schema_version` are errors and are raised: a failure is never read as "inline" or as
  success, since that would hide a broken deployment behind a quietly degraded agent.

`delivery_from_capabilities` is the rule itself as a pure function of an HTTP status and
body, so turn code (and tests) can apply it to any answer; `negotiate_delivery` and
`anegotiate_delivery` fetch the answer with a client first. `turn_knowledge` reads a turn's
answer back and never drops the bodies an inline turn carries.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import constants
from ._http import AsyncKnowledgeClient, KnowledgeClient, RawResponse
from .errors import ProtocolError, decode_json, error_from_response
from .models import DeliveryMode, Hint, parse_capabilities, parse_hint

__all__ = [
    "LEGACY_STATUSES",
    "TurnKnowledge",
    "anegotiate_delivery",
    "delivery_from_capabilities",
    "negotiate_delivery",
    "turn_knowledge",
    "turn_request_options",
]

# Statuses with which a server that predates the protocol answers the capabilities path.
LEGACY_STATUSES = frozenset({404, 405, 501})


def delivery_from_capabilities(
    status: int,
    body: bytes | str | Mapping[str, Any] | None,
    headers: Mapping[str, str] | None = None,
    *,
    route: str | None = None,
) -> DeliveryMode:
    """The delivery mode a capabilities answer allows, or raise its `KnowledgeError`.

    `body` may be the raw bytes, their text, or the already decoded JSON object. `route`,
    when given, must be the route the answer names.
    """
    if status in LEGACY_STATUSES:
        return "inline"
    if status != 200:
        content = _as_bytes(body)
        raise error_from_response(status, content, headers)
    if isinstance(body, Mapping):
        decoded: Any = body
    else:
        try:
            decoded = decode_json(_as_bytes(body))
        except ValueError:
            raise ProtocolError(reason="The capabilities answer is not JSON.", status=200) from None
    capabilities = parse_capabilities(decoded, route=route)
    return "on_demand" if capabilities.on_demand else "inline"


def _as_bytes(body: bytes | str | Mapping[str, Any] | None) -> bytes:
    if body is None:
        return b""
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    return json.dumps(body).encode("utf-8")


def _from_raw(raw: RawResponse, route: str) -> DeliveryMode:
    return delivery_from_capabilities(raw.status, raw.content, raw.headers, route=route)


def negotiate_delivery(client: KnowledgeClient) -> DeliveryMode:
    """Ask the server's capabilities and apply the negotiation rule (may raise)."""
    return _from_raw(client.capabilities_response(), client.route)


async def anegotiate_delivery(client: AsyncKnowledgeClient) -> DeliveryMode:
    """`negotiate_delivery` for the async client."""
    return _from_raw(await client.capabilities_response(), client.route)


def turn_request_options(mode: DeliveryMode) -> dict[str, str]:
    """The fields to add to a turn request for `mode`.

    `inline` adds nothing: the legacy request means inline, and a server that predates the
    protocol rejects the unknown field `knowledge_delivery` with 400.
    """
    if mode == "on_demand":
        return {"knowledge_delivery": "on_demand"}
    if mode == "inline":
        return {}
    raise ValueError(f"Unknown delivery mode {mode!r}.")


@dataclass(frozen=True)
class TurnKnowledge:
    """The knowledge a turn answer delivered, in whichever mode the server actually used.

    `mode` is what was delivered, not what was asked: an `inline` answer keeps its
    `knowledge` bodies and `knowledge_refs` verbatim, and the host must pass them on.
    With `on_demand`, `hints` are run-bound: use them with `run_id` for search and read.
    """

    mode: DeliveryMode
    run_id: str | None
    knowledge_scope_revision: str | None
    status: str | None
    hints: tuple[Hint, ...]
    knowledge: tuple[Any, ...]
    knowledge_refs: tuple[Any, ...]
    trust: str = constants.TRUST_REFERENCE_ONLY


def turn_knowledge(body: Mapping[str, Any], requested: DeliveryMode) -> TurnKnowledge:
    """Read the knowledge part of a decoded turn answer (`bailing.agent-turn-context.v1`).

    Raises `ProtocolError` for an unknown schema, and when a turn that asked for `inline`
    comes back `on_demand` (its bodies would be missing without anyone noticing).
    """
    if not isinstance(body, Mapping) or body.get("schema_version") != constants.SCHEMA_TURN_CONTEXT:
        found = body.get("schema_version") if isinstance(body, Mapping) else None
        raise ProtocolError(reason=f"Unknown turn schema_version {found!r}.", status=200)
    knowledge = body.get("knowledge") or []
    refs = body.get("knowledge_refs") or []
    if not isinstance(knowledge, list) or not isinstance(refs, list):
        raise ProtocolError(reason="Turn knowledge has the wrong type.", status=200)
    run_id = body.get("run_id") if isinstance(body.get("run_id"), str) else None
    context = body.get("context")
    delivery = context.get("knowledge_delivery") if isinstance(context, Mapping) else None
    if delivery is None:
        return TurnKnowledge(
            mode="inline",
            run_id=run_id,
            knowledge_scope_revision=body.get("knowledge_scope_revision"),
            status=None,
            hints=(),
            knowledge=tuple(knowledge),
            knowledge_refs=tuple(refs),
        )
    if (
        not isinstance(delivery, Mapping)
        or delivery.get("schema_version") != constants.SCHEMA_DELIVERY
        or delivery.get("mode") != "on_demand"
    ):
        raise ProtocolError(reason="Unknown knowledge_delivery in the turn.", status=200)
    if requested != "on_demand":
        raise ProtocolError(reason="The turn is on_demand although inline was asked.", status=200)
    hints = delivery.get("hints")
    if not isinstance(hints, list):
        raise ProtocolError(reason="knowledge_delivery.hints has the wrong type.", status=200)
    return TurnKnowledge(
        mode="on_demand",
        run_id=run_id,
        knowledge_scope_revision=delivery.get("knowledge_scope_revision"),
        status=delivery.get("status"),
        hints=tuple(parse_hint(item) for item in hints),
        # Kept even here: an on_demand answer should carry none, but none is ever dropped.
        knowledge=tuple(knowledge),
        knowledge_refs=tuple(refs),
    )
