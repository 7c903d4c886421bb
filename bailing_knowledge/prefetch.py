"""Related objects already at hand, held where Django's related managers look for them.

The access check of every agent request reads a route's knowledge bases in the same
statement as the route. `prefetch_related` would hold them as a queryset filtered on the
route, and building one takes a related manager and two ORM queries' worth of objects tied
to the route in a reference cycle; with the manager each `route.knowledge_bases` access
builds, that was about a third of what a `capabilities` request spends above a bare DRF
view (docs/performance.md). The app's own code only needs the list
(`prefetched_list`); `PrefetchedLists` builds the queryset the first time something asks
for it, so that `route.knowledge_bases.all()` and any refinement of it behave exactly as
after `prefetch_related`.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any

from django.db.models import Model, QuerySet


class PrefetchedLists(MutableMapping[str, QuerySet]):
    """An instance's `_prefetched_objects_cache`, given lists of related objects by name.

    Django reads it with `[]`, `in`, `get`, `pop` and `del`. A name's queryset is built from
    its list on first access, as `prefetch_related` would have left it: the related
    manager's queryset of the instance, its results already in.
    """

    def __init__(self, instance: Model, **lists: list[Any]) -> None:
        self._instance = instance
        self._lists = lists
        self._built: dict[str, QuerySet] = {}

    def listed(self, name: str) -> list[Any] | None:
        """A copy of the objects under `name` (None if there are none), built or not."""
        if name in self._lists:
            return list(self._lists[name])
        built = self._built.get(name)
        return None if built is None else list(built)

    def __getitem__(self, name: str) -> QuerySet:
        if name not in self._built:
            objects = self._lists.pop(name)  # KeyError: nothing under `name`
            # The manager asks this mapping first; with the list taken out it finds nothing
            # and builds its own queryset, filtered on the instance.
            queryset = getattr(self._instance, name).get_queryset()
            queryset._result_cache = objects
            queryset._prefetch_done = True
            self._built[name] = queryset
        return self._built[name]

    def __setitem__(self, name: str, queryset: QuerySet) -> None:
        self._lists.pop(name, None)
        self._built[name] = queryset

    def __delitem__(self, name: str) -> None:
        if self._lists.pop(name, None) is None:
            del self._built[name]

    def __contains__(self, name: object) -> bool:
        return name in self._lists or name in self._built

    def __iter__(self) -> Iterator[str]:
        return iter([*self._lists, *self._built])

    def __len__(self) -> int:
        return len(self._lists) + len(self._built)


def prefetched_list(instance: Model, name: str) -> list[Any] | None:
    """The related objects `name` of `instance` if they were prefetched (by
    `prefetch_related` or `PrefetchedLists`), as a new list; None if they were not."""
    cache = getattr(instance, "_prefetched_objects_cache", None)
    if isinstance(cache, PrefetchedLists):
        return cache.listed(name)
    if cache is None or name not in cache:
        return None
    return list(cache[name])
