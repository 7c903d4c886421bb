"""Figures the fault suite measures, printed as `STRESS <name> <value> <limit> PASS|FAIL`.

`make stress` sets `BAILING_STRESS=1`: every test then runs its long form. The quick forms
run in `make test` and print the same lines from fewer requests.
"""

from __future__ import annotations

import os

LONG = os.environ.get("BAILING_STRESS") == "1"

_lines: list[str] = []


def scale(quick: int, long: int) -> int:
    """How many of something to do: `long` under `make stress`, else `quick`."""
    return long if LONG else quick


def record(name: str, value: float, limit: float, *, at_least: bool = False) -> bool:
    """Record one figure against its limit (an upper bound unless `at_least`)."""
    passed = value >= limit if at_least else value <= limit
    _lines.append(f"STRESS {name} {_format(value)} {_format(limit)} {'PASS' if passed else 'FAIL'}")
    return passed


def count(name: str, value: int) -> None:
    """Record how many requests a category tried (no limit: always PASS when above 0)."""
    record(name, value, 1, at_least=True)


def lines() -> list[str]:
    return list(_lines)


def _format(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:.2f}"
