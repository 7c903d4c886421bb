"""The helpers the commands share: argument types, error formatting, rendering and help."""

from __future__ import annotations

import argparse
import io
import socket
from datetime import timedelta

import pytest
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import OperationalError, connection

from bailing_knowledge import services
from bailing_knowledge.management.base import (
    ServiceCommand,
    finite_float,
    lifetime,
    on_off,
    render_table,
    text,
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("on", True), ("OFF", False), ("true", True), ("no", False), (" yes ", True)],
)
def test_on_off(value, expected):
    assert on_off(value) is expected


@pytest.mark.parametrize("value", ["", "1", "enabled", "of"])
def test_on_off_rejects_other_words(value):
    with pytest.raises(argparse.ArgumentTypeError):
        on_off(value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0", timedelta(0)),
        ("45", timedelta(seconds=45)),
        ("45s", timedelta(seconds=45)),
        ("30m", timedelta(minutes=30)),
        (" 8H ", timedelta(hours=8)),
        ("7d", timedelta(days=7)),
        ("1w", timedelta(weeks=1)),
    ],
)
def test_lifetime(value, expected):
    assert lifetime(value) == expected


@pytest.mark.parametrize("value", ["", "h", "1.5h", "-1", "8 hours", "3y", "1h30m"])
def test_lifetime_rejects_other_forms(value):
    with pytest.raises(argparse.ArgumentTypeError):
        lifetime(value)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "x"])
def test_finite_float_rejects_non_numbers(value):
    with pytest.raises(argparse.ArgumentTypeError):
        finite_float(value)


def test_finite_float():
    assert finite_float("0.25") == 0.25


class _Command(ServiceCommand):
    field_options = {"top_k": "--top-k"}


def test_validation_errors_name_the_option():
    exc = ValidationError(
        {
            "top_k": ["Too small.", "Really."],
            "slug": "Bad slug.",
            NON_FIELD_ERRORS: "Whole thing is wrong.",
        }
    )
    lines = _Command().format_validation_error(exc).splitlines()
    assert sorted(lines) == sorted(
        ["--top-k: Too small.", "--top-k: Really.", "slug: Bad slug.", "Whole thing is wrong."]
    )


def test_validation_errors_without_fields():
    exc = ValidationError(["One.", "Two."])
    assert _Command().format_validation_error(exc) == "One.\nTwo."


def test_text_and_table():
    assert text(True) == "yes"
    assert text(False) == "no"
    assert text([]) == "-"
    assert text("") == "-"
    assert text(["a", "b"]) == "a, b"
    assert render_table(["A", "LONG"], [["xyz", 1]]).splitlines() == ["A    LONG", "xyz  1"]


def test_control_characters_are_printed_escaped_not_obeyed(db):
    # A title stored through the admin or a script: the listing must not clear the screen,
    # recolour it, break a row in two or reverse what follows.
    assert text("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert text(["x\ny", "\u202eevil"]) == "x\\x0ay, \\u202eevil"
    assert text("退款\tpolicy\x9b") == "退款\\x09policy\\x9b"
    services.create_knowledge_base("help", title="Help\x1b]0;owned\x07\r")
    out = io.StringIO()
    call_command("knowledge_base", "list", stdout=out)
    listing = out.getvalue()
    assert "Help\\x1b]0;owned\\x07\\x0d" in listing
    assert not any(ord(c) < 0x20 and c != "\n" for c in listing)


@pytest.mark.parametrize(
    "args",
    [
        ("knowledge_base", "create"),
        ("knowledge_base", "list"),
        ("knowledge_base", "enable"),
        ("knowledge_route", "create"),
        ("knowledge_route", "update"),
        ("agent_client", "create"),
        ("agent_client", "update"),
        ("agent_session", "issue"),
        ("agent_session", "list"),
        ("agent_session", "revoke"),
        ("agent_session",),
    ],
)
def test_help_renders(args, capsys):
    # argparse prints help to sys.stdout and exits: a malformed help string would raise here.
    with pytest.raises(SystemExit) as exit_info:
        call_command(*args, "--help")
    assert exit_info.value.code == 0
    assert "--json" in capsys.readouterr().out or len(args) == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "args",
    [
        ("knowledge_base", "list"),
        ("agent_session", "list"),
        ("knowledge_ingest", "handbook", "."),
        ("knowledge_vector_index", "--check", "--dimensions", "256"),
    ],
)
def test_a_database_that_cannot_be_reached_is_one_line_not_a_traceback(monkeypatch, args):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    connection.close()
    monkeypatch.setitem(connection.settings_dict, "HOST", "127.0.0.1")
    monkeypatch.setitem(connection.settings_dict, "PORT", str(port))
    with pytest.raises(CommandError) as raised:
        call_command(*args)
    message = str(raised.value)
    assert message.startswith("The database failed: ") and "\n" not in message, message
    assert isinstance(raised.value.__cause__, OperationalError)


@pytest.mark.django_db(transaction=True)
def test_a_statement_the_database_refuses_is_one_line_not_a_traceback(tmp_path):
    """A read-only standby (or a revoked privilege) refuses statements of a live database."""
    services.create_knowledge_base("handbook")
    (tmp_path / "a.md").write_text("# A\n\nText.", encoding="utf-8")
    with connection.cursor() as cursor:
        cursor.execute("SET default_transaction_read_only = on")
    try:
        ingest = ("knowledge_ingest", "handbook", str(tmp_path))
        for args in (ingest, ("knowledge_base", "create", "x")):
            with pytest.raises(CommandError) as raised:
                call_command(*args, stdout=io.StringIO(), stderr=io.StringIO())
            message = str(raised.value)
            assert message.startswith("The database failed: ") and "read-only" in message
            assert "\n" not in message
    finally:
        connection.close()  # the setting goes with the session


@pytest.mark.parametrize(
    "args",
    [
        ("knowledge_base", "create", "menus", "--title", "Caf\udce9"),  # Latin-1 in argv
        ("knowledge_base", "enable", "caf\udce9"),
        ("knowledge_route", "create", "r", "--audience", "st\udcaff"),
        ("knowledge_ingest", "caf\udce9", "."),
    ],
)
def test_an_argument_that_is_not_utf8_is_one_line_before_any_work(db, args):
    with pytest.raises(CommandError, match=r"^Argument '.*' is not valid UTF-8 text"):
        call_command(*args, stdout=io.StringIO(), stderr=io.StringIO())
