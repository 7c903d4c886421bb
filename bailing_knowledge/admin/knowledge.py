"""Knowledge bases, their documents and the documents' chunks.

A knowledge base's new language or embedder goes through the services that re-index it
(`services.reindex`); uploads go through the `ingest_paths` service that `knowledge_ingest`
uses.
Documents and chunks are written by ingestion only: the admin shows them, re-indexes and
deletes documents, and never edits either.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.core.files.uploadedfile import UploadedFile
from django.db.models import OuterRef, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from .. import services
from ..ingestion.loaders import supported_suffixes
from ..models import Chunk, Document, KnowledgeBase, Route
from ..services.ingest import FileOutcome, ingest_paths
from .actions import toggle_action
from .display import (
    ListMedia,
    OwnerAdmin,
    ReadOnlyAdmin,
    changelist_link,
    count_of,
    short_time,
)
from .forms import DocumentUploadForm, KnowledgeBaseForm
from .playground import document_chunks
from .reindexing import ReindexQueuedFilter, documents, report_reindex, status_with_reindex


class KnowledgeBaseAdmin(OwnerAdmin):
    form = KnowledgeBaseForm
    list_display = (
        "slug",
        "title",
        "enabled",
        "tenant",
        "embedder",
        "language",
        "document_count",
        "route_count",
        "updated",
    )
    list_display_links = ("slug", "title")
    list_filter = ("enabled", "embedder", "language", "tenant")
    search_fields = ("slug", "title", "description", "tenant")
    readonly_fields = ("documents_link", "routes_list", "created_at", "updated_at")
    prepopulated_fields = {"slug": ("title",)}
    Media = ListMedia
    actions = ("enable_knowledge_bases", "disable_knowledge_bases")
    fieldsets = (
        (None, {"fields": ("slug", "title", "description", "enabled")}),
        ("Retrieval", {"fields": ("embedder", "language", "tenant")}),
        ("Contents", {"fields": ("documents_link", "routes_list", "created_at", "updated_at")}),
    )

    def save_model(self, request: HttpRequest, obj: KnowledgeBase, form: Any, change: bool) -> None:
        """A new language or embedder means a new index: switch through the services.

        The other fields are saved first, with the old values of these two; the services
        then change them and re-index. The language goes first: its re-index only recomputes
        lexical terms, while re-embedding recomputes everything, in the new language. The
        language's re-index is done before the page returns; re-embedding is too with the
        immediate task backend, and is queued for a worker with any other: the message says
        which.
        """
        switches = [field for field in ("embedder", "language") if field in form.changed_data]
        if not change or not switches:
            super().save_model(request, obj, form, change)
            return
        new = {field: getattr(obj, field) for field in switches}
        for field in switches:
            setattr(obj, field, form.initial[field])
        super().save_model(request, obj, form, change)
        if "language" in new:
            services.set_knowledge_base_language(obj, new["language"])
            self.message_user(
                request,
                f"Documents of {obj.slug} were re-indexed for the language {new['language']!r}.",
            )
        if "embedder" in new:
            report = services.set_knowledge_base_embedder(obj, new["embedder"])
            report_reindex(
                self,
                request,
                report,
                subject=f"{obj.slug} now embeds with {new['embedder']!r}",
                done="re-embedded",
                doing="re-embedding",
            )

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return (
            super()
            .get_queryset(request)
            .annotate(
                document_count=count_of(Document.objects.all(), "knowledge_base"),
                reindex_waiting=count_of(
                    Document.objects.all(), "knowledge_base", reindex_queued_at__isnull=False
                ),
                route_count=count_of(Route.knowledge_bases.through.objects.all(), "knowledgebase"),
            )
        )

    @admin.display(description="documents", ordering="document_count")
    def document_count(self, obj: KnowledgeBase) -> str:
        if not obj.reindex_waiting:
            return str(obj.document_count)
        return format_html(
            "{}<br><small>{} waiting for re-index</small>", obj.document_count, obj.reindex_waiting
        )

    @admin.display(description="routes", ordering="route_count")
    def route_count(self, obj: KnowledgeBase) -> int:
        return obj.route_count

    @admin.display(description="updated", ordering="updated_at")
    def updated(self, obj: KnowledgeBase) -> str:
        return short_time(obj.updated_at)

    @admin.display(description="documents")
    def documents_link(self, obj: KnowledgeBase) -> str:
        if obj.pk is None:
            return "-"
        listed = changelist_link(
            self.admin_site,
            Document,
            f"knowledge_base__id__exact={obj.pk}",
            f"{obj.document_count} document(s)",
        )
        if obj.reindex_waiting:
            waiting = changelist_link(
                self.admin_site,
                Document,
                f"knowledge_base__id__exact={obj.pk}&{ReindexQueuedFilter.parameter_name}="
                f"{ReindexQueuedFilter.QUEUED}",
                f"{obj.reindex_waiting} of {documents(obj.document_count)} waiting for re-index",
            )
            listed = format_html("{} &middot; {}", listed, waiting)
        upload = reverse(f"{self.admin_site.name}:bailing_knowledge_document_upload")
        return format_html(
            '{} &middot; <a href="{}?knowledge_base={}">Upload documents</a>',
            listed,
            upload,
            obj.pk,
        )

    @admin.display(description="used by routes")
    def routes_list(self, obj: KnowledgeBase) -> str:
        if obj.pk is None:
            return "-"
        routes = obj.routes.order_by("route_key")
        if not routes:
            return "No route uses this knowledge base."
        return format_html_join(
            ", ",
            '<a href="{}">{}</a>',
            (
                (reverse(f"{self.admin_site.name}:bailing_knowledge_route_change", args=(r.pk,)), r)
                for r in routes
            ),
        )

    enable_knowledge_bases = toggle_action(
        "enable_knowledge_bases",
        "Enable selected knowledge bases",
        service=services.set_knowledge_base_enabled,
        attr="enabled",
        value=True,
        label="enabled",
    )

    disable_knowledge_bases = toggle_action(
        "disable_knowledge_bases",
        "Disable selected knowledge bases",
        service=services.set_knowledge_base_enabled,
        attr="enabled",
        value=False,
        label="disabled",
    )


def ingest_uploads(kb: KnowledgeBase, files: list[UploadedFile]) -> list[FileOutcome]:
    """Ingest uploaded files through `ingest_paths`, as `knowledge_ingest` ingests a folder.

    A file's name (without folders) is its source key. Each upload is written into a folder
    of its own, so two files of the same name are both ingested, the second one updating
    the first, as two separate uploads would.
    """
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for number, upload in enumerate(files):
            name = Path(upload.name or "").name or "upload"
            target = Path(folder) / str(number) / name
            target.parent.mkdir()
            with target.open("wb") as handle:
                for piece in upload.chunks():
                    handle.write(piece)
            paths.append((target, name))
        return list(ingest_paths(kb, paths))


class DocumentAdmin(OwnerAdmin):
    """Documents come from ingestion: the admin shows them and may delete them."""

    list_display = (
        "source_key",
        "title",
        "knowledge_base",
        "indexing_status",
        "revision",
        "chunk_count",
        "updated",
    )
    list_display_links = ("source_key", "title")
    Media = ListMedia
    list_filter = ("status", ReindexQueuedFilter, "knowledge_base")
    list_select_related = ("knowledge_base",)
    search_fields = ("source_key", "title", "=knowledge_base__slug")
    fieldsets = (
        (None, {"fields": ("knowledge_base", "source_key", "title")}),
        (
            "Indexing",
            {
                "fields": (
                    "status",
                    "reindex_queued_at",
                    "revision",
                    "last_error",
                    "content_hash",
                    "chunk_count",
                )
            },
        ),
        ("Content", {"fields": ("metadata_json", "body")}),
        ("Chunks", {"fields": ("chunks",)}),
        ("History", {"fields": ("created_at", "updated_at")}),
    )
    # Every field shown is read-only: documents are written by ingestion only.
    readonly_fields = tuple(field for _, options in fieldsets for field in options["fields"])
    show_full_result_count = False

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return (
            super()
            .get_queryset(request)
            .annotate(
                chunk_count=count_of(Chunk.objects.all(), "document", revision=OuterRef("revision"))
            )
        )

    actions = ("reindex_documents",)
    change_list_template = "admin/bailing_knowledge/document/change_list.html"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_ingest_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("bailing_knowledge.add_document") and request.user.has_perm(
            "bailing_knowledge.change_document"
        )

    def get_urls(self) -> list:
        urls = super().get_urls()
        upload = path(
            "upload/",
            self.admin_site.admin_view(self.upload_view),
            name="bailing_knowledge_document_upload",
        )
        return [upload, *urls]

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> Any:
        extra_context = {**(extra_context or {}), "can_upload": self.has_ingest_permission(request)}
        return super().changelist_view(request, extra_context)

    def upload_view(self, request: HttpRequest) -> HttpResponse:
        """Upload files into a KB: each is loaded and upserted like `knowledge_ingest` does."""
        if not self.has_ingest_permission(request):
            raise PermissionDenied
        form = DocumentUploadForm(
            request.POST or None,
            request.FILES or None,
            initial={"knowledge_base": request.GET.get("knowledge_base")},
        )
        if request.method == "POST" and form.is_valid():
            kb = form.cleaned_data["knowledge_base"]
            outcomes = ingest_uploads(kb, form.cleaned_data["files"])
            for file in outcomes:
                if file.error:
                    # Not the name first: the admin capitalises a message's first letter.
                    text = f"Not loaded: {file.name}: {file.error}"
                    self.message_user(request, text, messages.ERROR)
            counts = Counter(file.outcome for file in outcomes)
            summary = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
            self.message_user(request, f"Uploaded into {kb.slug}: {summary}.", messages.INFO)
            return HttpResponseRedirect(reverse("admin:bailing_knowledge_document_changelist"))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Upload documents",
            "form": form,
            "supported": ", ".join(sorted(supported_suffixes())),
        }
        return TemplateResponse(request, "admin/bailing_knowledge/document/upload.html", context)

    @admin.action(description="Reindex selected documents", permissions=["ingest"])
    def reindex_documents(self, request: HttpRequest, queryset: QuerySet) -> None:
        """Now with the immediate task backend, else queued: the message says which."""
        report = services.reindex_documents(queryset.order_by("pk").defer("body"))
        report_reindex(
            self, request, report, subject="Reindex", done="re-indexed", doing="re-indexing"
        )

    @admin.display(description="status", ordering="status")
    def indexing_status(self, obj: Document) -> str:
        return status_with_reindex(obj)

    @admin.display(description="chunks", ordering="chunk_count")
    def chunk_count(self, obj: Document) -> int:
        return obj.chunk_count

    @admin.display(description="updated", ordering="updated_at")
    def updated(self, obj: Document) -> str:
        return short_time(obj.updated_at)

    @admin.display(description="chunks of this revision")
    def chunks(self, obj: Document) -> str:
        return document_chunks(self.admin_site, obj)

    @admin.display(description="metadata")
    def metadata_json(self, obj: Document) -> str:
        return format_html("<pre>{}</pre>", json.dumps(obj.metadata, indent=2, sort_keys=True))


class ChunkAdmin(ReadOnlyAdmin):
    """Chunks are cut and embedded by ingestion: read-only, embeddings never shown."""

    list_display = (
        "__str__",
        "document",
        "knowledge_base",
        "revision",
        "ordinal",
        "start",
        "end",
        "embedding_dimensions",
        "text_preview",
    )
    list_filter = ("knowledge_base", "embedding_dimensions")
    list_select_related = ("document", "knowledge_base")
    search_fields = ("document__source_key", "document__title", "=knowledge_base__slug")
    readonly_fields = (
        "document",
        "knowledge_base",
        "revision",
        "ordinal",
        "start",
        "end",
        "text_hash",
        "embedding_dimensions",
        "text",
    )
    fields = readonly_fields
    show_full_result_count = False

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).defer("embedding", "search_vector")

    @admin.display(description="text")
    def text_preview(self, obj: Chunk) -> str:
        return obj.text if len(obj.text) <= 80 else obj.text[:79] + "…"
