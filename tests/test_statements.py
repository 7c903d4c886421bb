"""Statements read answer by answer, and work done while the server runs them."""

from __future__ import annotations

import time

import psycopg
import pytest
from django.db import DatabaseError, OperationalError, connection, transaction
from psycopg import ClientCursor
from psycopg.pq import TransactionStatus

from bailing_knowledge import statements
from bailing_knowledge.retrieval.session import SEPARATOR

pytestmark = pytest.mark.django_db

TWO = "SELECT 1\n;\nSELECT 2"


def _in_flight() -> bool:
    """Whether the connection has sent a statement whose answer is not read yet."""
    return connection.connection.info.transaction_status == TransactionStatus.ACTIVE


def test_meanwhile_runs_once_the_statements_are_sent_and_before_any_answer_is_read():
    seen: list[tuple[bool, list]] = []
    answers: list = []
    with connection.cursor() as cursor:
        statements.run_each(
            cursor,
            TWO,
            lambda place, answer: answers.append(answer),
            meanwhile=lambda: seen.append((_in_flight(), list(answers))),
        )
    assert seen == [(True, [])]
    assert answers == [[(1,)], [(2,)]]


def test_an_error_of_meanwhile_is_raised_once_the_server_has_answered():
    def meanwhile() -> None:
        raise ValueError("cannot work meanwhile")

    answers: list = []
    with connection.cursor() as cursor:
        with pytest.raises(ValueError, match="meanwhile"):
            statements.run_each(
                cursor, TWO, lambda place, answer: answers.append(answer), meanwhile=meanwhile
            )
        assert answers == []  # nothing handed on after a failure
        cursor.execute("SELECT 3")  # the connection is ready for its next statement
        assert cursor.fetchone() == (3,)


def test_a_statement_sent_meanwhile_on_the_busy_connection_fails_instead_of_waiting():
    """The connection's lock is not held while `meanwhile` runs: a statement it sends on the
    same connection is refused by the driver at once, and the first statement's answer is
    still read, so the connection stays usable."""

    def meanwhile() -> None:
        with connection.cursor() as other:
            other.execute("SELECT 4")

    with connection.cursor() as cursor:
        with pytest.raises(DatabaseError, match="another command is already in progress"):
            statements.run_each(cursor, "SELECT 1", lambda place, answer: None, meanwhile=meanwhile)
        cursor.execute("SELECT 5")
        assert cursor.fetchone() == (5,)


def test_first_row_works_meanwhile_where_parameters_are_bound_on_the_client():
    seen: list[bool] = []
    with connection.cursor() as cursor:
        assert isinstance(cursor.cursor, ClientCursor)
        cursor.execute("SELECT 0")  # the test's transaction is begun (as autocommit would be)
        row = statements.first_row(
            cursor, "SELECT %s::int, %s", [7, "it's"], meanwhile=lambda: seen.append(_in_flight())
        )
        empty = statements.first_row(cursor, "SELECT 1 WHERE false", None, meanwhile=lambda: None)
    assert row == (7, "it's") and empty is None
    assert seen == [True]


def test_first_row_without_meanwhile_is_the_cursors_own_fetch(django_assert_num_queries):
    with django_assert_num_queries(1), connection.cursor() as cursor:
        assert statements.first_row(cursor, "SELECT %s::text", ["x"]) == ("x",)


@pytest.mark.django_db(transaction=True)
def test_first_row_works_before_the_statement_where_parameters_are_bound_on_the_server(
    prepared_statements,
):
    prepared_statements()
    seen: list[bool] = []
    with connection.cursor() as cursor:
        assert not isinstance(cursor.cursor, ClientCursor)
        assert not statements.client_binding(connection)
        row = statements.first_row(
            cursor, "SELECT %s::int", [8], meanwhile=lambda: seen.append(_in_flight())
        )
    assert row == (8,)
    assert seen == [False]


def test_statements_sent_with_work_meanwhile_are_logged_as_django_logs_queries(
    django_assert_num_queries,
):
    with django_assert_num_queries(1) as captured, connection.cursor() as cursor:
        statements.first_row(cursor, "SELECT %s::int", [9], meanwhile=lambda: None)
    assert captured.captured_queries[0]["sql"] == "SELECT 9::int"


@pytest.mark.django_db(transaction=True)
def test_first_row_in_a_transaction_not_begun_yet_runs_in_it():
    """With autocommit off and no statement sent yet, the driver's own `execute` begins the
    transaction; `first_row` leaves the statement to it (and does the work first)."""
    seen: list[bool] = []
    with transaction.atomic(), connection.cursor() as cursor:
        row = statements.first_row(
            cursor,
            "SELECT set_config('bk.place', %s, true)",
            ["inside"],
            meanwhile=lambda: seen.append(_in_flight()),
        )
        cursor.execute("SELECT current_setting('bk.place')")
        assert cursor.fetchone() == ("inside",)
    assert row == ("inside",) and seen == [False]


@pytest.mark.django_db(transaction=True)
def test_a_connection_that_breaks_after_the_work_failed_is_raised_as_djangos_error():
    """Django discards a connection whose statement raised one of its database errors; the
    work's own error stays the cause."""

    def meanwhile() -> None:
        raise ValueError("the work failed")

    with connection.cursor() as cursor, pytest.raises(OperationalError) as raised:
        statements.run_each(
            cursor,
            "SELECT pg_terminate_backend(pg_backend_pid())",
            lambda place, answer: None,
            meanwhile=meanwhile,
        )
    assert connection.errors_occurred
    assert isinstance(raised.value.__cause__.__cause__, ValueError)
    connection.close()


@pytest.mark.django_db
def test_the_rows_of_the_last_statement_of_a_batch_come_as_the_server_finds_them(libpq):
    parts: list[tuple[int, list[int], float]] = []
    answers: list[tuple[int, object, float]] = []
    started = time.monotonic()
    # Rows larger than the server's 8 kB output buffer leave it one by one.
    text = SEPARATOR.join(
        ["SELECT 1", "SELECT g, repeat('x', 20000), pg_sleep(0.1) FROM generate_series(1, 5) g"]
    )
    with connection.cursor() as cursor:
        statements.run_each(
            cursor,
            text,
            lambda place, answer: answers.append((place, answer, time.monotonic() - started)),
            lambda place, rows: parts.append(
                (place, [row[0] for row in rows], time.monotonic() - started)
            ),
            batch=1,
        )
    assert [(place, len(answer)) for place, answer, _ in answers] == [(0, 1), (1, 5)]
    assert [row for place, rows, _ in parts if place == 1 for row in rows] == [1, 2, 3, 4, 5]
    if libpq == "chunked":
        # The first row came while the server was still finding the others.
        first = next(at for place, _, at in parts if place == 1)
        assert answers[1][2] - first >= 0.25


@pytest.mark.django_db(transaction=True)
def test_a_server_that_ends_the_session_is_raised_with_its_own_reason():
    with connection.cursor() as cursor, pytest.raises(OperationalError) as raised:
        statements.run_each(
            cursor,
            "SELECT pg_terminate_backend(pg_backend_pid())" + SEPARATOR + "SELECT 1",
            lambda place, answer: None,
        )
    connection.close()
    assert isinstance(raised.value.__cause__, psycopg.errors.AdminShutdown)
