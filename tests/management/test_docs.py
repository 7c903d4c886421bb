"""docs/cli.md lists every management command and every subcommand each one has."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from django.core.management import get_commands, load_command_class

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
COMMANDS = sorted(name for name, app in get_commands().items() if app == "bailing_knowledge")


def _table() -> dict[str, str]:
    """The overview table: command name -> its subcommands cell."""
    rows = {}
    for line in DOCS.read_text().splitlines():
        match = re.match(r"\|\s*`(\w+)`\s*\|[^|]*\|(.*)\|\s*$", line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


def _subcommands(name: str) -> list[str]:
    parser = load_command_class("bailing_knowledge", name).create_parser("manage.py", name)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return sorted(action.choices)
    return []


def test_the_count_in_the_introduction_is_right():
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
    assert f"{words[len(COMMANDS) - 1].capitalize()} management commands" in DOCS.read_text()


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_and_subcommand_is_in_the_table(name):
    table = _table()
    assert name in table, f"docs/cli.md has no row for {name}"
    for subcommand in _subcommands(name):
        assert f"`{subcommand}`" in table[name], (name, subcommand)
