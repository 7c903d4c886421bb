"""Request serializers: every instance validates with fields of its own."""

from __future__ import annotations

import pytest

from bailing_knowledge import constants
from bailing_knowledge.serializers import (
    ReadRequestSerializer,
    SearchRequestSerializer,
    TurnRequestSerializer,
)


@pytest.mark.parametrize(
    "serializer_class", [SearchRequestSerializer, ReadRequestSerializer, TurnRequestSerializer]
)
def test_each_instance_binds_fields_of_its_own(serializer_class):
    first, second = serializer_class(data={}), serializer_class(data={})
    declared = serializer_class._declared_fields
    assert set(first.fields) == set(second.fields) == set(declared)
    for name in declared:
        assert first.fields[name] is not second.fields[name]
        assert first.fields[name] is not declared[name]
        assert first.fields[name].parent is first and second.fields[name].parent is second
        assert declared[name].parent is None  # the class's own fields stay unbound


def test_nesting_fields_are_copied_through():
    first, second = TurnRequestSerializer(data={}), TurnRequestSerializer(data={})
    binding = first.fields["task_binding"]
    assert binding is not second.fields["task_binding"]
    assert binding.fields["task_id"] is not second.fields["task_binding"].fields["task_id"]
    context = first.fields["page_context"]
    assert context.child is not second.fields["page_context"].child
    assert context.child.parent is context


def test_one_request_s_errors_do_not_reach_the_next():
    too_long = "x" * (constants.SEARCH_MAX_QUERY_CHARS + 1)
    refused = SearchRequestSerializer(data={"query": too_long, "limit": 9})
    assert not refused.is_valid()
    assert set(refused.errors) == {"query", "limit"}
    accepted = SearchRequestSerializer(data={"query": "refunds", "limit": 2})
    assert accepted.is_valid(), accepted.errors
    assert accepted.validated_data == {"query": "refunds", "limit": 2}
    blank = SearchRequestSerializer(data={"query": "   "})
    assert not blank.is_valid()
    assert blank.errors["query"] == ["The query must not be blank."]
