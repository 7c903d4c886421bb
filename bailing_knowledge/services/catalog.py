"""Knowledge bases, routes and clients: create, change, enable and disable them.

Functions accept either a model instance or its public key (slug, `route_key`, `app_id`).
Bad input raises `django.core.exceptions.ValidationError`; an unknown key raises the model's
`DoesNotExist`. Every change runs in one transaction: it happens whole or not at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from django.core.exceptions import ValidationError
from django.db import models, transaction

from .. import signals
from ..conf import check_embedder_alias
from ..lookups import get_client, get_knowledge_base, get_route, resolve_all
from ..models import Client, KnowledgeBase, Route
from ..retrieval.analysis import DEFAULT_LANGUAGE, check_language
from ..signals import send_on_commit

M = TypeVar("M", bound=models.Model)


def _save(instance: M) -> M:
    instance.full_clean()
    instance.save()
    return instance


def _clean_audiences(audiences: Iterable[str]) -> list[str]:
    cleaned = list(dict.fromkeys(a.strip() for a in audiences))
    if any(not a for a in cleaned):
        raise ValidationError({"allowed_audiences": "Audiences must be non-empty strings."})
    return cleaned


@transaction.atomic
def create_knowledge_base(
    slug: str,
    *,
    title: str = "",
    description: str = "",
    embedder: str = "default",
    tenant: str = "",
    enabled: bool = True,
    language: str = DEFAULT_LANGUAGE,
) -> KnowledgeBase:
    """Create a KB; `tenant` binds it to the principals of one tenant.

    `language` (a code of `retrieval.analysis.LANGUAGES`) decides how its documents and the
    queries against them are cut into lexical terms; change it later with
    `services.set_knowledge_base_language`, which re-indexes the documents.
    """
    check_embedder_alias(embedder)
    check_language(language)
    kb = _save(
        KnowledgeBase(
            slug=slug,
            title=title or slug[:200],  # an overlong slug is its own error, not the title's
            description=description,
            embedder=embedder,
            tenant=tenant,
            enabled=enabled,
            language=language,
        )
    )
    send_on_commit(
        signals.knowledge_base_changed, KnowledgeBase, knowledge_base=kb, change="created"
    )
    return kb


@transaction.atomic
def set_knowledge_base_enabled(kb: KnowledgeBase | str, enabled: bool) -> KnowledgeBase:
    kb = get_knowledge_base(kb)
    if kb.enabled != enabled:
        kb.enabled = enabled
        kb.save(update_fields=["enabled", "updated_at"])
        send_on_commit(
            signals.knowledge_base_changed,
            KnowledgeBase,
            knowledge_base=kb,
            change="enabled" if enabled else "disabled",
        )
    return kb


@transaction.atomic
def create_route(
    route_key: str,
    *,
    name: str = "",
    knowledge_bases: Iterable[KnowledgeBase | str] = (),
    audiences: Iterable[str] = (),
    enabled: bool = True,
    agent_client_enabled: bool = True,
    knowledge_enabled: bool = True,
    top_k: int = 5,
    min_score: float = 0.0,
    max_docs: int = 3,
    knowledge_mode: str = Route.Mode.CHUNK,
) -> Route:
    """Create a route (workspace) and bind its knowledge bases."""
    kbs = resolve_all(KnowledgeBase, "slug", knowledge_bases)
    route = _save(
        Route(
            route_key=route_key,
            name=name or route_key[:200],
            allowed_audiences=_clean_audiences(audiences),
            enabled=enabled,
            agent_client_enabled=agent_client_enabled,
            knowledge_enabled=knowledge_enabled,
            top_k=top_k,
            min_score=min_score,
            max_docs=max_docs,
            knowledge_mode=knowledge_mode,
        )
    )
    route.knowledge_bases.set(kbs)
    return route


_ROUTE_FIELDS = (
    "name",
    "enabled",
    "agent_client_enabled",
    "knowledge_enabled",
    "top_k",
    "min_score",
    "max_docs",
    "knowledge_mode",
)


@transaction.atomic
def update_route(
    route: Route | str,
    *,
    knowledge_bases: Iterable[KnowledgeBase | str] | None = None,
    add_knowledge_bases: Iterable[KnowledgeBase | str] = (),
    remove_knowledge_bases: Iterable[KnowledgeBase | str] = (),
    audiences: Iterable[str] | None = None,
    **changes: Any,
) -> Route:
    """Change a route; arguments left as None keep their value.

    `knowledge_bases` replaces the bound set; `add_`/`remove_knowledge_bases` edit it.
    """
    unknown = set(changes) - set(_ROUTE_FIELDS)
    if unknown:
        raise ValidationError(f"Unknown route setting(s): {', '.join(sorted(unknown))}.")
    route = Route.objects.select_for_update().get(pk=get_route(route).pk)
    for field, value in changes.items():
        if value is not None:
            setattr(route, field, value)
    if audiences is not None:
        route.allowed_audiences = _clean_audiences(audiences)
    _save(route)
    if knowledge_bases is not None:
        route.knowledge_bases.set(resolve_all(KnowledgeBase, "slug", knowledge_bases))
    if add_knowledge_bases:
        route.knowledge_bases.add(*resolve_all(KnowledgeBase, "slug", add_knowledge_bases))
    if remove_knowledge_bases:
        route.knowledge_bases.remove(*resolve_all(KnowledgeBase, "slug", remove_knowledge_bases))
    return route


def bind_knowledge_bases(route: Route | str, kbs: Iterable[KnowledgeBase | str]) -> Route:
    return update_route(route, add_knowledge_bases=kbs)


def unbind_knowledge_bases(route: Route | str, kbs: Iterable[KnowledgeBase | str]) -> Route:
    return update_route(route, remove_knowledge_bases=kbs)


def set_route_enabled(route: Route | str, enabled: bool) -> Route:
    return update_route(route, enabled=enabled)


def set_agent_client_enabled(route: Route | str, enabled: bool) -> Route:
    """Toggle the route's Agent Client runtime switch (`agent_client.enabled`)."""
    return update_route(route, agent_client_enabled=enabled)


@transaction.atomic
def create_client(
    app_id: str,
    *,
    name: str = "",
    routes: Iterable[Route | str] = (),
    enabled: bool = True,
) -> Client:
    """Register an agent application and the routes it may use."""
    resolved = resolve_all(Route, "route_key", routes)
    client = _save(Client(app_id=app_id, name=name or app_id[:200], enabled=enabled))
    client.allowed_routes.set(resolved)
    return client


@transaction.atomic
def update_client(
    client: Client | str,
    *,
    name: str | None = None,
    routes: Iterable[Route | str] | None = None,
) -> Client:
    client = Client.objects.select_for_update().get(pk=get_client(client).pk)
    if name is not None:
        client.name = name
        client.full_clean()
        client.save(update_fields=["name", "updated_at"])
    if routes is not None:
        client.allowed_routes.set(resolve_all(Route, "route_key", routes))
    return client


@transaction.atomic
def set_client_enabled(client: Client | str, enabled: bool) -> Client:
    """Disabling a client locks out every one of its sessions on their next request."""
    client = get_client(client)
    if client.enabled != enabled:
        client.enabled = enabled
        client.save(update_fields=["enabled", "updated_at"])
    return client
