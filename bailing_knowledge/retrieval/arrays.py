"""Array parameters as PostgreSQL array literals: one string for the driver to quote.

Bound on the client, a Python list goes through the driver's array adaptation element by
element (about 15 µs for a list of one to three ids, against 1 µs for a string), and a
search sends lists with every statement. Each statement casts its literal to the array type
it compares with (`%(kbs)s::bigint[]`), so a caller may still pass a list.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable


def array_literal(elements: Iterable[str]) -> str:
    """The literal of elements already written as array elements (`array_element`, or
    numbers)."""
    return "{" + ",".join(elements) + "}"


def array_element(item: str) -> str:
    """`item` as an element of an array literal: in double quotes, its own escaped."""
    return '"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"'


def id_array(*groups: Iterable[int]) -> str:
    """An array literal of ids (`{1,2,3}`), for a `bigint[]`."""
    return array_literal(map(str, itertools.chain(*groups)))


def text_array(items: Iterable[str]) -> str:
    """An array literal of strings, for a `text[]`, whatever quotes, backslashes, braces or
    commas they hold."""
    return array_literal(map(array_element, items))
