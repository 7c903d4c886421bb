"""The settings reference in docs/configuration.md against the defaults in `conf.py`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from bailing_knowledge.conf import DEFAULTS, nearest_name

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
ROW = re.compile(r"^\| `([A-Z0-9_]+)` \| `([^`]+)` \|", re.MULTILINE)


def _python(literal: str):
    return ast.literal_eval(literal.replace("null", "None"))


def test_the_reference_documents_every_key_with_its_default():
    documented = {key: _python(default) for key, default in ROW.findall(REFERENCE.read_text())}
    assert set(documented) == set(DEFAULTS)
    for key, default in DEFAULTS.items():
        assert documented[key] == default, key


def test_nearest_name_suggests_only_close_names():
    assert nearest_name("SESION_DEFAULT_LIFETIME", DEFAULTS) == "SESSION_DEFAULT_LIFETIME"
    assert nearest_name("throttle_rate", DEFAULTS) == "THROTTLE_RATES"
    assert nearest_name("sesion", ["session", "client"]) == "session"
    assert nearest_name("COLOUR", DEFAULTS) is None
