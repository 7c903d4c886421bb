"""Re-indexing in the admin: what a re-index did, and which documents still wait for one.

With the immediate task backend a re-index is done when the page returns; with a queue it
is only queued, and each document keeps serving its old chunks, `ready`, until a worker
runs it. The messages say which of the two happened, and the lists show the documents
whose re-index is queued (`Document.reindex_queued_at`).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from ..models import Document
from ..services.reindex import ReindexReport
from .display import short_time


def documents(n: int) -> str:
    return f"{n} document" if n == 1 else f"{n} documents"


def report_reindex(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    report: ReindexReport,
    *,
    subject: str,
    done: str,
    doing: str,
) -> None:
    """Tell the user what `report` came to: "<subject>: 3 documents re-embedded.", or
    "... queued for re-embedding; a worker will index them.", with each failure's reason."""
    parts = []
    if report.indexed:
        parts.append(f"{documents(report.indexed)} {done}")
    if report.queued:
        them = "it" if report.queued == 1 else "them"
        parts.append(f"{documents(report.queued)} queued for {doing}; a worker will index {them}")
    if report.unchanged:
        parts.append(f"{documents(report.unchanged)} left alone: newer content was indexed")
    failed = report.failed
    if failed:
        parts.append(f"{documents(len(failed))} failed")
    level = messages.SUCCESS
    if failed:
        level = messages.WARNING if len(failed) < len(report.results) else messages.ERROR
    summary = "; ".join(parts) or "there are no documents to re-index"
    modeladmin.message_user(request, f"{subject}: {summary}.", level)
    for result in failed:
        # Not the key first: the admin capitalises a message's first letter.
        text = f"Failed: {result.source_key}: {result.error}"
        modeladmin.message_user(request, text, messages.ERROR)


class ReindexQueuedFilter(admin.SimpleListFilter):
    """The documents whose queued re-index has not run yet."""

    title = "re-index"
    parameter_name = "reindex"
    QUEUED = "queued"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(self.QUEUED, "Queued, waiting for a worker")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == self.QUEUED:
            return queryset.filter(reindex_queued_at__isnull=False)
        return queryset


def status_with_reindex(document: Document) -> str:
    """The document's status, and below it when its queued re-index was queued."""
    status = document.get_status_display()
    if document.reindex_queued_at is None:
        return status
    return format_html(
        "{}<br><small>re-index queued {}</small>", status, short_time(document.reindex_queued_at)
    )
