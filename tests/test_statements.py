"""Statements read answer by answer, and work done while the server runs them."""

from __future__ import annotations

import threading
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


# --- Statements sent behind a first one (`first_row`'s `follow`) -------------------------


def _status():
    return connection.connection.info.transaction_status


def _behind(followers, *, meanwhile=None):
    """`first_row` of `SELECT 7` with `followers` sent behind it; what `follow` was given."""
    given = []

    def follow(cursor):
        given.append(cursor)
        return [followers]

    with connection.cursor() as cursor:
        row = statements.first_row(cursor, "SELECT %s", [7], meanwhile=meanwhile, follow=follow)
    return row, given


@pytest.mark.django_db(transaction=True)
def test_statements_sent_behind_a_first_one_wait_for_the_caller_that_claims_them():
    order = []
    followers = ["BEGIN", "SELECT 1", "SELECT 'two'"]
    row, given = _behind(followers, meanwhile=lambda: order.append(_status()))
    assert row == (7,) and len(given) == 1
    assert order == [TransactionStatus.ACTIVE]  # `meanwhile` ran with them in flight
    assert statements.pending_statements(connection) == tuple(followers)
    answers = []
    with connection.cursor() as cursor:
        pending = statements.claim(connection, followers)
        assert pending is not None and statements.pending_statements(connection) is None
        statements.read_claimed(cursor, pending, lambda place, a: answers.append((place, a)))
        assert answers == [(0, None), (1, [(1,)]), (2, [("two",)])]
        assert _status() == TransactionStatus.INTRANS  # their BEGIN is the caller's now
        cursor.execute("ROLLBACK")
        cursor.execute("SELECT 8")
        assert cursor.fetchone() == (8,)


@pytest.mark.django_db(transaction=True)
def test_each_group_behind_leaves_as_soon_as_it_is_composed():
    """The server runs the first group while the next one is still being composed."""
    seen = []
    sleep = "SELECT pg_sleep(1)"
    watch = "SELECT query FROM pg_stat_activity WHERE pid = %s AND state = 'active'"

    def follow(cursor):
        yield ["BEGIN", sleep]
        pid = cursor.connection.info.backend_pid
        with psycopg.connect(**connection.get_connection_params(), autocommit=True) as other:
            for _ in range(400):  # the first group runs by now, or it never left
                row = other.execute(watch, [pid]).fetchone()
                if row == (sleep,):
                    break
                time.sleep(0.002)
        seen.append(row)
        yield []  # nothing in a group: nothing sent
        yield ["SELECT 'two'"]

    with connection.cursor() as cursor:
        assert statements.first_row(cursor, "SELECT 7", None, follow=follow) == (7,)
        assert seen == [(sleep,)]
        sent = ["BEGIN", sleep, "SELECT 'two'"]
        assert statements.pending_statements(connection) == tuple(sent)
        answers = []
        pending = statements.claim(connection, sent)
        statements.read_claimed(cursor, pending, lambda place, a: answers.append(a))
        assert answers == [None, [("",)], [("two",)]]
        cursor.execute("ROLLBACK")


@pytest.mark.django_db(transaction=True)
def test_an_error_between_groups_drops_what_was_sent_and_is_raised():
    def follow(cursor):
        yield ["BEGIN", "CREATE TEMPORARY TABLE behind (x int)"]
        raise ValueError("cannot compose the rest")

    with connection.cursor() as cursor:
        with pytest.raises(ValueError, match="the rest"):
            statements.first_row(cursor, "SELECT 1", None, follow=follow)
        assert statements.pending_statements(connection) is None
        assert _status() == TransactionStatus.IDLE
        cursor.execute("SELECT to_regclass('pg_temp.behind')")
        assert cursor.fetchone() == (None,)  # rolled back


@pytest.mark.django_db(transaction=True)
def test_statements_claimed_with_other_text_are_discarded_and_rolled_back():
    _behind(["BEGIN", "CREATE TEMPORARY TABLE behind (x int)"])
    assert statements.claim(connection, ["BEGIN", "SELECT 1"]) is None
    assert statements.pending_statements(connection) is None
    assert _status() == TransactionStatus.IDLE
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('pg_temp.behind')")
        assert cursor.fetchone() == (None,)  # rolled back, never committed


@pytest.mark.django_db(transaction=True)
def test_any_other_statement_first_discards_the_statements_waiting_behind():
    """Nothing ever runs, or fails, behind statements nobody claimed: Django's own next
    statement reads and drops them, rolls their transaction back, then runs."""
    _behind(["BEGIN", "CREATE TEMPORARY TABLE behind (x int)"])
    wrappers = list(connection.execute_wrappers)
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('pg_temp.behind')")
        assert cursor.fetchone() == (None,)
    assert statements.pending_statements(connection) is None
    assert connection.execute_wrappers == wrappers[:-1]
    assert _status() == TransactionStatus.IDLE


@pytest.mark.django_db(transaction=True)
def test_a_failing_first_statement_leaves_nothing_behind():
    with connection.cursor() as cursor:
        with pytest.raises(DatabaseError, match="division by zero"):
            statements.first_row(
                cursor, "SELECT 1 / %s", [0], follow=lambda c: [["BEGIN", "SELECT 1"]]
            )
        assert statements.pending_statements(connection) is None
        assert _status() == TransactionStatus.IDLE
        cursor.execute("SELECT 9")
        assert cursor.fetchone() == (9,)


@pytest.mark.django_db(transaction=True)
def test_an_error_of_follow_or_meanwhile_is_raised_once_the_first_has_answered():
    def follow(cursor):
        raise ValueError("cannot compose")

    with connection.cursor() as cursor:
        with pytest.raises(ValueError, match="compose"):
            statements.first_row(cursor, "SELECT 1", None, follow=follow)
        assert statements.pending_statements(connection) is None
        cursor.execute("SELECT 10")
        assert cursor.fetchone() == (10,)
    with pytest.raises(ValueError, match="meanwhile"):
        _behind(["SELECT 1"], meanwhile=lambda: (_ for _ in ()).throw(ValueError("meanwhile")))
    assert statements.pending_statements(connection) is None
    assert _status() == TransactionStatus.IDLE


@pytest.mark.django_db(transaction=True)
def test_a_failing_statement_behind_is_raised_by_the_claim_and_the_rest_not_run():
    followers = ["BEGIN", "SELECT 1 / 0", "SELECT 2"]
    _behind(followers)
    answers = []
    with connection.cursor() as cursor:
        pending = statements.claim(connection, followers)
        with pytest.raises(DatabaseError, match="division by zero"):
            statements.read_claimed(cursor, pending, lambda place, a: answers.append(place))
        assert answers == [0]  # the BEGIN only: the error aborted the rest
        assert _status() == TransactionStatus.INERROR
        cursor.execute("ROLLBACK")
        cursor.execute("SELECT 11")
        assert cursor.fetchone() == (11,)


def test_nothing_is_sent_behind_inside_a_transaction():
    """Inside `atomic` (as here) the first statement goes alone, `follow` is not called."""
    row, given = _behind(["SELECT 1"])
    assert row == (7,) and given == []
    assert statements.pending_statements(connection) is None


@pytest.mark.django_db(transaction=True)
def test_nothing_is_sent_behind_where_parameters_are_bound_on_the_server(prepared_statements):
    prepared_statements()
    row, given = _behind(["SELECT 1"])
    assert row == (7,) and given == []


@pytest.mark.django_db(transaction=True)
def test_statements_behind_are_read_under_the_connections_execute_wrappers():
    """Claimed, their answers are read inside the execute wrappers (the request's deadline
    among them) and logged where Django logs queries; discarded, too."""
    seen = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        _behind(["SELECT 1", "SELECT 2"])
        with connection.cursor() as cursor:
            pending = statements.claim(connection, ["SELECT 1", "SELECT 2"])
            statements.read_claimed(cursor, pending, lambda place, a: None)
        _behind(["SELECT 3"])
        statements.discard(connection)
    assert seen == ["SELECT 7", "SELECT 1\n;\nSELECT 2", "SELECT 7", "ROLLBACK"]


@pytest.mark.django_db(transaction=True)
def test_statements_behind_a_connection_django_closed_are_forgotten():
    _behind(["BEGIN", "SELECT 1"])
    connection.close()
    with connection.cursor() as cursor:  # a new connection: nothing waits on it
        cursor.execute("SELECT 12")
        assert cursor.fetchone() == (12,)
    assert statements.pending_statements(connection) is None


@pytest.mark.django_db(transaction=True)
def test_a_statement_behind_that_times_out_is_raised_as_djangos_with_its_cause():
    """As a search's leg that times out (`HybridSearch._timed_out`): the cause is the
    driver's `QueryCanceled`, and the answers before it were handed on."""
    followers = ["BEGIN", "SET LOCAL statement_timeout = 50", "SELECT pg_sleep(2)", "SELECT 2"]
    _behind(followers)
    answers = []
    with connection.cursor() as cursor:
        pending = statements.claim(connection, followers)
        with pytest.raises(OperationalError) as raised:
            statements.read_claimed(cursor, pending, lambda place, a: answers.append(place))
        assert isinstance(raised.value.__cause__, psycopg.errors.QueryCanceled)
        assert answers == [0, 1]
        cursor.execute("ROLLBACK")


def test_most_of_the_last_writes_stalling_pause_sending_ahead(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(statements.time, "monotonic", lambda: clock[0])
    overlap = statements._Overlap()
    quick, stalled = 0.00001, statements.AHEAD_STALLED_SECONDS
    for _ in range(statements.AHEAD_WINDOW * 4):
        overlap.note(quick)
    assert overlap.pays()  # writes that take microseconds never pause it
    for _ in range(statements.AHEAD_STALLS - 1):
        overlap.note(stalled)
        overlap.note(quick)
    assert overlap.pays()  # fewer than AHEAD_STALLS of the last AHEAD_WINDOW
    overlap.note(stalled)
    assert not overlap.pays() and not overlap.recent
    clock[0] += statements.AHEAD_PAUSE_SECONDS - 0.001
    assert not overlap.pays()
    clock[0] += 0.001
    assert overlap.pays()


def test_old_stalls_leave_the_window():
    overlap = statements._Overlap()
    for _ in range(statements.AHEAD_STALLS - 1):
        overlap.note(statements.AHEAD_STALLED_SECONDS)
    for _ in range(statements.AHEAD_WINDOW):
        overlap.note(0.0)
    overlap.note(statements.AHEAD_STALLED_SECONDS)
    assert overlap.pays()


def test_threads_note_their_writes_at_once():
    overlap = statements._Overlap()
    failures = []

    def note(stalled):
        try:
            for n in range(3000):
                overlap.note(statements.AHEAD_STALLED_SECONDS if stalled and n % 3 else 0.0)
        except Exception as exc:  # a window counted while another thread appends
            failures.append(exc)

    threads = [threading.Thread(target=note, args=(i % 2,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == [] and len(overlap.recent) <= statements.AHEAD_WINDOW
