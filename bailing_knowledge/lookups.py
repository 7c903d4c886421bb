"""Model instances from arguments that are either an instance or its public key.

Every layer accepts a knowledge base as an instance or its slug, a route as an instance or
its `route_key`, and so on. The rule for turning one into the other lives here, below the
services and the ingestion pipeline, so that both can apply it without importing each other.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from django.core.exceptions import ValidationError
from django.db import models

from .models import AgentSession, Client, KnowledgeBase, Route, Task

M = TypeVar("M", bound=models.Model)


def resolve(model: type[M], field: str, value: M | str) -> M:
    """`value` itself if it is a `model`, else the row whose `field` equals it.

    Anything but an instance or a non-empty string raises `ValidationError`; an unknown key
    raises the model's `DoesNotExist`, naming the key.
    """
    if isinstance(value, model):
        return value
    if not isinstance(value, str) or not value:
        name = model._meta.verbose_name
        article = "an" if name[:1].lower() in "aeiou" else "a"
        raise ValidationError(f"Expected {article} {name} or its {field}.")
    try:
        return model._default_manager.get(**{field: value})
    except model.DoesNotExist:
        raise model.DoesNotExist(f"No {model._meta.verbose_name} with {field} {value!r}.") from None


def resolve_all(model: type[M], field: str, values: Iterable[M | str]) -> list[M]:
    """`resolve` over `values`, duplicates dropped, first occurrence order kept."""
    return [resolve(model, field, value) for value in dict.fromkeys(values)]


def get_knowledge_base(kb: KnowledgeBase | str) -> KnowledgeBase:
    return resolve(KnowledgeBase, "slug", kb)


def get_route(route: Route | str) -> Route:
    return resolve(Route, "route_key", route)


def get_client(client: Client | str) -> Client:
    return resolve(Client, "app_id", client)


def get_session(session: AgentSession | str) -> AgentSession:
    return resolve(AgentSession, "session_id", session)


def get_task(task: Task | str) -> Task:
    return resolve(Task, "task_id", task)
