"""What the changelists show: counted columns, short timestamps and links between lists.

Changelists annotate their counts with one subquery each (`count_of`), so a page costs the
same number of queries for 1 row as for 100.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Count, IntegerField, Model, OuterRef, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.urls import reverse
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.timezone import localtime


def count_of(queryset: QuerySet, field: str, **filters: Any) -> Coalesce:
    """A correlated `COUNT(*)` of `queryset` rows whose `field` points at the outer row.

    A subquery per count (rather than `Count()` over joins) keeps several counts on one
    changelist from multiplying each other's rows.
    """
    counted = (
        queryset.filter(**{field: OuterRef("pk")}, **filters)
        .order_by()
        .values(field)
        .annotate(n=Count("*"))
        .values("n")
    )
    return Coalesce(Subquery(counted, output_field=IntegerField()), Value(0))


def short_time(value: Any) -> str:
    """A timestamp short enough for a list column: changelists must fit a laptop screen."""
    return "-" if value is None else date_format(localtime(value), "Y-m-d H:i")


class ListMedia:
    """Long values (source keys, principal ids) wrap inside their column."""

    css = {"all": ("bailing_knowledge/admin.css",)}


def changelist_link(admin_site: admin.AdminSite, model: type[Model], query: str, text: str) -> str:
    opts = model._meta
    url = reverse(f"{admin_site.name}:{opts.app_label}_{opts.model_name}_changelist")
    return format_html('<a href="{}?{}">{}</a>', url, query, text)


class ReadOnlyAdmin(admin.ModelAdmin):
    """An admin that shows rows written only by the services (chunks, runs)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class OwnerAdmin(admin.ModelAdmin):
    """An admin whose objects own rows that only the services write (a `ReadOnlyAdmin`'s:
    chunks, runs). Deleting an object deletes those with it, as the models cascade; their
    lack of a delete permission of their own must not forbid deleting their owner."""

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> tuple[Any, Any, Any, Any]:
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        owned = {
            str(model._meta.verbose_name)
            for model, model_admin in self.admin_site._registry.items()
            if isinstance(model_admin, ReadOnlyAdmin)
        }
        return deleted, counts, set(perms_needed) - owned, protected
