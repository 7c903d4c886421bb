"""Ingestion's bridge to Django's task framework: one import for both Django versions.

Django 6.0 ships `django.tasks`; on 5.2 the `django-tasks` backport provides the same API.
Which backend runs the work is the project's `TASKS` setting: with the immediate backend
(the default) indexing runs inline, in the caller's process, and returns its outcome; with
any other (database, RQ, Celery) it is enqueued and a worker runs it.
"""

from __future__ import annotations

import warnings
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

try:
    from django.tasks import task  # type: ignore[import-not-found,unused-ignore]
    from django.tasks.backends.immediate import (  # type: ignore[import-not-found,unused-ignore]
        ImmediateBackend,
    )
    from django.tasks.base import Task  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # Django 5.2
    from django_tasks import task
    from django_tasks.backends.immediate import ImmediateBackend
    from django_tasks.base import Task

__all__ = ["Task", "run_task", "runs_inline", "task"]


def runs_inline(job: Task) -> bool:
    """The task's backend runs it at once: call the work directly and keep its result.

    Calling the function rather than enqueueing it on the immediate backend gives the same
    result without a JSON round trip of the arguments (a body may be megabytes).
    """
    return isinstance(job.get_backend(), ImmediateBackend)


# The names the old task layer gave its tasks: work a project queued with its own runner
# before the upgrade still runs through `run_task`.
_LEGACY_TASKS = {
    "bailing_knowledge.ingestion.documents.index_document": (
        "bailing_knowledge.ingestion.pipeline.index_document"
    ),
    "bailing_knowledge.ingestion.documents.reindex_document_task": (
        "bailing_knowledge.ingestion.maintenance.reindex_document_task"
    ),
}


def run_task(name: str, kwargs: dict[str, Any]) -> Any:
    """Run work queued by the removed `TASK_RUNNER` layer; deprecated.

    Keep the worker that called it until its queue is drained, then drop it: new work goes
    through Django's task framework (docs/ingestion.md).
    """
    warnings.warn(
        "run_task() only drains work queued before the TASK_RUNNER setting was removed; "
        "ingestion now runs on Django's task framework.",
        DeprecationWarning,
        stacklevel=2,
    )
    try:
        path = _LEGACY_TASKS[name]
    except KeyError:
        raise ImproperlyConfigured(f"Unknown bailing_knowledge task {name!r}.") from None
    return import_string(path)(**kwargs)
