"""Array parameters sent as literals read back as the lists they were made from."""

from __future__ import annotations

import pytest
from django.db import connection
from hypothesis import given
from hypothesis import strategies as st

from bailing_knowledge.retrieval.arrays import id_array, text_array

pytestmark = pytest.mark.django_db

# PostgreSQL text holds no NUL; surrogates are not text in UTF-8.
TEXT = st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]))


@given(st.lists(TEXT))
def test_a_text_array_reads_back_as_its_strings(items):
    """Quotes, backslashes, braces, commas, blanks, `NULL` and the empty string survive."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::text[]", [text_array(items)])
        assert cursor.fetchone()[0] == items


@given(st.lists(st.integers(-(2**63), 2**63 - 1)), st.lists(st.integers(0, 2**40)))
def test_an_id_array_reads_back_as_its_ids_in_order(first, second):
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::bigint[]", [id_array(first, second)])
        assert cursor.fetchone()[0] == [*first, *second]


def test_the_strings_that_look_like_array_syntax_stay_strings():
    assert text_array(["NULL", "", "a,b", "{x}", 'say "hi"', "back\\slash"]) == (
        '{"NULL","","a,b","{x}","say \\"hi\\"","back\\\\slash"}'
    )
