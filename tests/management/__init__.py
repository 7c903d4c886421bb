"""Tests of the management commands, run through `call_command` as a script would."""

from __future__ import annotations

import io
import json
from typing import Any

from django.core.management import call_command


def run(*args: str) -> str:
    """Run a command and return what it wrote to stdout."""
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def run_json(*args: str) -> Any:
    """Run a command with `--json` and parse its output, which must be one JSON document."""
    return json.loads(run(*args, "--json"))
