"""The credential filter for access logs."""

from __future__ import annotations

import logging

import pytest

from bailing_knowledge.logging_filters import CredentialQueryFilter, redact_query_strings

TOKEN = "bka_" + "x" * 43


def _filtered(msg, args):
    record = logging.LogRecord("django.server", logging.INFO, __file__, 1, msg, args, None)
    assert CredentialQueryFilter().filter(record) is True
    return record.getMessage()


@pytest.mark.parametrize(
    "query",
    [
        f"access_token={TOKEN}",
        f"x=1&token={TOKEN}",
        "api_key=abc",
        "Authorization=Bearer%20abc",
        "password=hunter2&user=u",
        f"q={TOKEN}",
        "client_secret=s;x=1",
    ],
)
def test_runserver_lines_lose_credential_query_strings(query):
    line = _filtered('"%s" %s %s', (f"POST /agent-api/v1/x?{query} HTTP/1.1", 200, 12))
    assert line == '"POST /agent-api/v1/x?[redacted] HTTP/1.1" 200 12'


def test_gunicorn_style_records_with_dict_arguments():
    atoms = {"r": f"GET /agent-api/v1/x?access_token={TOKEN} HTTP/1.1", "s": "200"}
    line = _filtered("%(r)s %(s)s", atoms)
    assert TOKEN not in line and "?[redacted]" in line


@pytest.mark.parametrize(
    "line",
    ["GET /agent-api/v1/x?page=2&sort=title HTTP/1.1", "no query here", "what? nothing"],
)
def test_other_lines_are_left_alone(line):
    assert redact_query_strings(line) == line
    assert _filtered("%s", (line,)) == line


def test_a_record_with_mismatched_arguments_is_kept():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "%s %s", ("one",), None)
    assert CredentialQueryFilter().filter(record) is True
