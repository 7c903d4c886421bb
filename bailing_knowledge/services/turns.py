"""Agent turns: idempotent runs with a frozen context, and knowledge delivered with them.

`start_turn` resolves a turn request to its run: the same session, route, conversation, turn
and user message always give the same run and the same context, and a replay that differs in
any accepted field is refused. Knowledge is retrieved while the run is `preparing` (hints
issued then are bound to the run), frozen into the context, and the run becomes
`context_ready`. Knowledge failures never fail the turn: the delivery status reports them.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, transaction
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from .. import constants
from ..access import admitted_route, task_admits
from ..budget import cut_to_bytes, escaped_len, fit_search_response
from ..conf import knowledge_settings
from ..exceptions import IdempotencyConflict, RouteNotAllowed, RunNotCurrent, log_database_error
from ..models import AgentSession, Route, Run, Task
from .read import pinned_bodies
from .runs import task_allows
from .search import find_hits, search_hints, sign_hits
from .tasks import task_scope_hash

logger = logging.getLogger("bailing_knowledge")

# Keys of the turn context the host hook may not replace.
RESERVED_KEYS = frozenset(
    {
        "schema_version",
        "run_id",
        "route",
        "knowledge_scope_revision",
        "knowledge",
        "knowledge_refs",
        "context",
    }
)


def canonical_hash(data: Any) -> str:
    """SHA-256 of canonical JSON: the idempotency fingerprint of a request."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass
class TurnKnowledge:
    """What a turn carries of knowledge, for either delivery mode."""

    status: str
    knowledge: list[dict[str, Any]] = field(default_factory=list)
    knowledge_refs: list[dict[str, Any]] = field(default_factory=list)
    delivery: dict[str, Any] | None = None


def _inline_items(
    session: AgentSession, route: Route, query: str, run: Run | None
) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """Reference-only bodies of the best hits under the route's settings, size-bounded."""
    whole_documents = route.knowledge_mode == Route.Mode.DOCUMENT
    status, hits = find_hits(
        session,
        route,
        query,
        max_hits=route.max_docs if whole_documents else route.top_k,
        per_document=1 if whole_documents else route.top_k,
        max_documents=route.max_docs,
    )
    hints = sign_hits(session, route, hits, run=run)
    # A document changed since the search found it gives its hit's text, as a deleted one.
    bodies = pinned_bodies(session, route, hits) if whole_documents else {}
    room = int(knowledge_settings.INLINE_MAX_BYTES)
    knowledge, refs = [], []
    for hit, hint in zip(hits, hints, strict=True):
        text = bodies.get(hit.document_id, hit.text) if whole_documents else hit.text
        if room <= 0:
            break
        content = cut_to_bytes(text, room)
        room -= escaped_len(content)
        knowledge.append(
            {
                "ref": hint["ref"],
                "title": hit.title,
                "revision": hit.revision,
                "score": hit.score,
                "kind": "document" if whole_documents else "chunk",
                "content": content,
                "truncated": len(content) < len(text),
                "trust": constants.TRUST_REFERENCE_ONLY,
            }
        )
        refs.append(
            {
                "ref": hint["ref"],
                "title": hit.title,
                "revision": hit.revision,
                "expires_at": hint["expires_at"],
            }
        )
    return status, knowledge, refs


def prepare_turn_knowledge(
    session: AgentSession,
    route: Route,
    query: str,
    *,
    delivery: str | None,
    run: Run | None = None,
) -> TurnKnowledge:
    """Knowledge for a turn, for hosts that keep their own turn endpoint too.

    `delivery` is None (legacy) or "inline": bodies in `knowledge`; "on_demand": empty
    arrays and a delivery block with at most three run-bound hints in 4096 bytes.
    """
    try:
        if delivery == Run.Delivery.ON_DEMAND:
            status, hints = search_hints(session, route, query, run=run)
            envelope = {
                "schema_version": constants.SCHEMA_DELIVERY,
                "mode": "on_demand",
                "protocol": constants.PROTOCOL,
                "knowledge_scope_revision": route.knowledge_scope_revision,
                "status": status,
                "truncated": False,
            }
            block, _ = fit_search_response(envelope, hints)
            return TurnKnowledge(status=status, delivery=block)
        status, knowledge, refs = _inline_items(session, route, query, run)
        return TurnKnowledge(status=status, knowledge=knowledge, knowledge_refs=refs)
    except DatabaseError as exc:
        log_database_error(logger, "Knowledge retrieval failed while preparing a turn", exc)
    except Exception:
        logger.exception("Unexpected error while preparing turn knowledge")
    if delivery == Run.Delivery.ON_DEMAND:
        block = {
            "schema_version": constants.SCHEMA_DELIVERY,
            "mode": "on_demand",
            "protocol": constants.PROTOCOL,
            "knowledge_scope_revision": route.knowledge_scope_revision,
            "status": "unavailable",
            "hints": [],
            "truncated": False,
        }
        return TurnKnowledge(status="unavailable", delivery=block)
    return TurnKnowledge(status="unavailable")


def _bound_task(session: AgentSession, binding: dict[str, Any] | None) -> Task | None:
    if binding is None:
        return None
    task = Task.objects.filter(task_id=binding["task_id"]).first()
    if not task_admits(task, session):
        raise RunNotCurrent()
    if binding["scope_hash"] != task_scope_hash(task):
        raise ValidationError({"task_binding": ["The scope hash is not the task's current one."]})
    return task


def _host_extras(run: Run, data: dict[str, Any]) -> dict[str, Any]:
    hook_path = knowledge_settings.TURN_CONTEXT_HOOK
    if not hook_path:
        return {}
    hook = knowledge_settings.import_from(hook_path)
    extras = hook(run=run, session=run.session, route=run.route, request=data) or {}
    clash = RESERVED_KEYS & set(extras)
    if clash:
        raise ValueError(f"TURN_CONTEXT_HOOK may not set {', '.join(sorted(clash))}.")
    return dict(extras)


def _build_context(run: Run, data: dict[str, Any]) -> dict[str, Any]:
    route, session = run.route, run.session
    delivery = data.get("knowledge_delivery")
    knowledge = prepare_turn_knowledge(
        session, route, data["user_input"], delivery=delivery, run=run
    )
    context: dict[str, Any] = {}
    for key in ("page_context", "renderers", "task_binding"):
        if key in data:
            context[key] = data[key]
    if knowledge.delivery is not None:
        context["knowledge_delivery"] = knowledge.delivery
    body = {
        "schema_version": constants.SCHEMA_TURN_CONTEXT,
        "run_id": run.run_id,
        "route": route.route_key,
        "knowledge_scope_revision": route.knowledge_scope_revision,
        "knowledge": knowledge.knowledge,
        "knowledge_refs": knowledge.knowledge_refs,
        "context": context,
    }
    body.update(_host_extras(run, data))
    return body


def start_turn(session: AgentSession, route: Route, data: dict[str, Any]) -> dict[str, Any]:
    """The frozen context of the turn described by `data` (validated request fields)."""
    fingerprint = canonical_hash(data)
    task = _bound_task(session, data.get("task_binding"))
    with transaction.atomic():
        # The unique constraint makes concurrent identical requests share one run.
        run, _ = Run.objects.get_or_create(
            session=session,
            route=route,
            client_conversation_id=data["client_conversation_id"],
            client_turn_id=data["client_turn_id"],
            user_message_id=data["user_message_id"],
            defaults={
                "client_id": session.client_id,
                "request_hash": fingerprint,
                "delivery_mode": data.get("knowledge_delivery") or Run.Delivery.LEGACY,
                "task": task,
            },
        )
    if run.request_hash != fingerprint:
        raise IdempotencyConflict()
    with transaction.atomic():
        # Whoever holds the lock prepares; identical requests wait, then read the result.
        run = (
            Run.objects.select_for_update(of=("self",))
            .select_related("route", "session__client")
            .get(pk=run.pk)
        )
        if run.state == Run.State.PREPARING:
            run.context = _build_context(run, data)
            run.state = Run.State.CONTEXT_READY
            run.save(update_fields=["context", "state", "updated_at"])
    # Served from the stored form, so a replay is byte-identical to the first answer.
    return Run.objects.values_list("context", flat=True).get(pk=run.pk)


COMPLETION_FIELDS = ("assistant_message_id", "status", "content", "model", "runtime", "usage")


def complete_run(session: AgentSession, run_id: str, data: dict[str, Any]) -> dict[str, Any]:
    """Close a run (idempotently); only the session that owns it may, while it is current
    (`context_ready`, and its task, if any, active with the session a member). Replaying a
    completion answers as the first time did, whatever became of the task since."""
    fingerprint = canonical_hash({key: data.get(key) for key in COMPLETION_FIELDS})
    if "\x00" in run_id:  # no run has one, and PostgreSQL refuses it in a text value
        raise RunNotCurrent()
    with transaction.atomic():
        run = (
            Run.objects.select_for_update(of=("self",))
            .select_related("route", "task")
            .filter(run_id=run_id, session=session, client_id=session.client_id)
            .first()
        )
        if run is None:
            raise RunNotCurrent()
        if admitted_route(session, run.route.route_key) is None:
            raise RouteNotAllowed()
        if run.completion_hash:
            if run.completion_hash != fingerprint:
                raise IdempotencyConflict()
        elif run.state != Run.State.CONTEXT_READY or not task_allows(run, session):
            raise RunNotCurrent()
        else:
            run.state = data["status"]
            run.completion_hash = fingerprint
            run.completion = {key: data.get(key) for key in COMPLETION_FIELDS}
            run.completed_at = timezone.now()
            run.save(
                update_fields=[
                    "state",
                    "completion_hash",
                    "completion",
                    "completed_at",
                    "updated_at",
                ]
            )
    return {
        "schema_version": constants.SCHEMA_RUN_COMPLETION,
        "run_id": run.run_id,
        "state": run.state,
        "completed_at": run.completed_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    }
