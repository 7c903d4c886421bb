"""A route's knowledge bases, held as the access check read them: behaving as prefetched."""

from __future__ import annotations

import pickle

import pytest
from django.db import connection
from django.db.models import prefetch_related_objects
from django.test.utils import CaptureQueriesContext

from bailing_knowledge import services
from bailing_knowledge.models import AgentSession, Route
from bailing_knowledge.permissions import allowed_route
from bailing_knowledge.prefetch import PrefetchedLists, prefetched_list

pytestmark = pytest.mark.django_db


@pytest.fixture
def found(issued, route, kb):
    """The route as the access check hands it to a view, with a second, disabled KB."""
    services.bind_knowledge_bases(route, [services.create_knowledge_base("archive")])
    services.set_knowledge_base_enabled("archive", False)
    session = AgentSession.objects.select_related("client").get(pk=issued.session.pk)
    return allowed_route(session, "orders")


def _slugs(kbs) -> list[str]:
    return [kb.slug for kb in kbs]


def test_the_list_the_related_manager_and_a_refinement_agree_without_a_query(found):
    with CaptureQueriesContext(connection) as queries:
        bound = found.bound_knowledge_bases()
        listed = list(found.knowledge_bases.all())
        again = found.bound_knowledge_bases()
    assert len(queries) == 0
    assert _slugs(bound) == _slugs(listed) == _slugs(again) == ["archive", "handbook"]
    assert [kb.pk for kb in bound] == [kb.pk for kb in listed]
    # A refinement is a query, still of this route's knowledge bases only.
    services.create_knowledge_base("elsewhere")
    assert _slugs(found.knowledge_bases.filter(enabled=True)) == ["handbook"]


def test_the_list_handed_out_is_a_copy(found):
    found.bound_knowledge_bases().clear()
    assert _slugs(found.bound_knowledge_bases()) == ["archive", "handbook"]


def test_django_sees_them_as_prefetched(found):
    with CaptureQueriesContext(connection) as queries:
        prefetch_related_objects([found], "knowledge_bases")
        assert "knowledge_bases" in found._prefetched_objects_cache
        assert _slugs(found.knowledge_bases.all()) == ["archive", "handbook"]
    assert len(queries) == 0


@pytest.mark.parametrize("built", [False, True], ids=["as listed", "after .all()"])
def test_a_change_through_the_manager_drops_them(found, built):
    if built:
        list(found.knowledge_bases.all())
    found.knowledge_bases.add(services.create_knowledge_base("added"))
    with CaptureQueriesContext(connection) as queries:
        assert _slugs(found.bound_knowledge_bases()) == ["added", "archive", "handbook"]
    assert len(queries) == 1
    assert _slugs(found.knowledge_bases.all()) == ["added", "archive", "handbook"]


@pytest.mark.parametrize("fields", [None, ["knowledge_bases"]], ids=["every field", "by name"])
def test_a_refresh_drops_them(found, route, fields):
    services.update_route(route, knowledge_bases=["handbook"])
    found.refresh_from_db(fields=fields)
    assert _slugs(found.bound_knowledge_bases()) == ["handbook"]
    assert _slugs(found.knowledge_bases.all()) == ["handbook"]


def test_a_pickled_route_keeps_them(found):
    copy = pickle.loads(pickle.dumps(found))  # noqa: S301 (bytes made just above)
    with CaptureQueriesContext(connection) as queries:
        assert _slugs(copy.bound_knowledge_bases()) == ["archive", "handbook"]
        assert _slugs(copy.knowledge_bases.all()) == ["archive", "handbook"]
    assert len(queries) == 0


def test_the_mapping_reads_like_a_dict(route, kb):
    cache = PrefetchedLists(route, knowledge_bases=[kb])
    assert len(cache) == 1 and list(cache) == ["knowledge_bases"]
    assert "knowledge_bases" in cache and "clients" not in cache
    assert cache.get("clients") is None
    with pytest.raises(KeyError):
        cache["clients"]
    queryset = cache.get("knowledge_bases")
    assert queryset is cache["knowledge_bases"] and list(queryset) == [kb]
    assert cache.pop("knowledge_bases") is queryset
    assert len(cache) == 0 and cache.listed("knowledge_bases") is None
    cache = PrefetchedLists(route, knowledge_bases=[])
    del cache["knowledge_bases"]  # never built
    assert "knowledge_bases" not in cache
    with pytest.raises(KeyError):
        del cache["knowledge_bases"]


def test_prefetched_list_reads_prefetch_related_too(route):
    loaded = Route.objects.prefetch_related("knowledge_bases").get(pk=route.pk)
    with CaptureQueriesContext(connection) as queries:
        assert _slugs(prefetched_list(loaded, "knowledge_bases")) == ["handbook"]
        assert _slugs(loaded.bound_knowledge_bases()) == ["handbook"]
    assert len(queries) == 0
    plain = Route.objects.get(pk=route.pk)
    assert prefetched_list(plain, "knowledge_bases") is None
    with CaptureQueriesContext(connection) as queries:
        assert _slugs(plain.bound_knowledge_bases()) == ["handbook"]
    assert len(queries) == 1
