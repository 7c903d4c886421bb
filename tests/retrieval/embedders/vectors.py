"""Vector arithmetic shared by the embedder tests."""

from __future__ import annotations

import math

import pytest


def dot(a: list[float], b: list[float]) -> float:
    return math.fsum(x * y for x, y in zip(a, b, strict=True))


def norm(vector: list[float]) -> float:
    return math.sqrt(dot(vector, vector))


def fake_vector(text: str, dimensions: int) -> list[float]:
    """What the test server answers for `text`: distinct per text, never zero."""
    source = (text or "?") * dimensions
    return [float(ord(char) % 7 + 1) for char in source[:dimensions]]


def unit(vector: list[float]) -> list[float]:
    length = norm(vector)
    return [x / length for x in vector]


def assert_vectors(actual: list[list[float]], expected: list[list[float]]) -> None:
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        assert got == pytest.approx(want, rel=1e-12, abs=1e-15)
