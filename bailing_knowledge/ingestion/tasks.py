"""A small task layer for slow ingestion work: inline by default, a real worker when needed.

Ingestion functions decorated with `@task` are called through `enqueue(...)`, which hands
`(task_name, kwargs)` to the runner named by `BAILING_KNOWLEDGE["TASK_RUNNER"]`. Arguments
are plain JSON values (ids, strings), so any queue can carry them. A worker executes a task
with `run_task(task_name, kwargs)`. See docs/ingestion.md for Celery and Django tasks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, overload

from django.core.exceptions import ImproperlyConfigured

from ..conf import knowledge_settings

F = TypeVar("F", bound=Callable[..., Any])

_TASKS: dict[str, Callable[..., Any]] = {}
_NAMES: dict[Callable[..., Any], str] = {}


@overload
def task(func: F, /) -> F: ...


@overload
def task(*, name: str) -> Callable[[F], F]: ...


def task(func: F | None = None, /, *, name: str = "") -> F | Callable[[F], F]:
    """Register `func` as a task under its dotted path, or under `name`.

    A name is what queues carry: `name` keeps it stable when a task moves to another
    module, so that work queued before an upgrade still runs after it.
    """

    def register(func: F) -> F:
        registered = name or f"{func.__module__}.{func.__qualname__}"
        _TASKS[registered] = func
        _NAMES[func] = registered
        return func

    return register if func is None else register(func)


def task_name(func: Callable[..., Any]) -> str:
    return _NAMES.get(func) or f"{func.__module__}.{func.__qualname__}"


def run_task(name: str, kwargs: dict[str, Any]) -> Any:
    """Execute a registered task now; what a worker calls."""
    if name not in _TASKS:
        # Importing the module registers its tasks (a worker may not have imported it yet).
        module = name.rsplit(".", 1)[0]
        __import__(module)
    try:
        func = _TASKS[name]
    except KeyError:
        raise ImproperlyConfigured(f"Unknown bailing_knowledge task {name!r}.") from None
    return func(**kwargs)


def run_inline(name: str, kwargs: dict[str, Any]) -> Any:
    """The default runner: execute in the calling process and return the task's result."""
    return run_task(name, kwargs)


def enqueue(func: Callable[..., Any], **kwargs: Any) -> Any:
    """Hand a task to the configured runner; returns what the runner returns.

    With the inline runner that is the task's own result; a queueing runner returns
    whatever it likes (usually None), and callers then report the work as queued.
    """
    runner = knowledge_settings.import_from(knowledge_settings.TASK_RUNNER)
    return runner(task_name(func), kwargs)


def runs_inline() -> bool:
    return knowledge_settings.TASK_RUNNER == "bailing_knowledge.ingestion.tasks.run_inline"
