"""The search transaction and statements whose rows are used as they arrive
(`session.stream_rows`), on the real server: every row in order, in batches, within the
request's database deadline, with Django's errors; and a search's statements planned once
where the deployment prepares statements."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import (
    DataError,
    OperationalError,
    ProgrammingError,
    connection,
    connections,
    transaction,
)
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext
from psycopg import ClientCursor, pq
from psycopg.adapt import Loader
from psycopg.pq import TransactionStatus

from bailing_knowledge import services, statements
from bailing_knowledge.deadline import bounded_database_wait
from bailing_knowledge.ingestion.documents import upsert_document
from bailing_knowledge.retrieval import session, statistics
from bailing_knowledge.retrieval.hybrid import HybridSearch, Visibility
from bailing_knowledge.retrieval.session import stream_rows

SERIES = "SELECT g, repeat('x', g) FROM generate_series(1, %(n)s) AS g"


@pytest.mark.django_db
@pytest.mark.parametrize(("n", "batch"), [(0, 3), (1, 3), (7, 3), (9, 3), (500, 50)])
def test_every_row_arrives_once_in_order_in_batches(n, batch, libpq):
    batches: list[list[tuple]] = []
    with connection.cursor() as cursor:
        stream_rows(cursor, SERIES, {"n": n}, lambda rows: batches.append(list(rows)), batch)
    assert [row for rows in batches for row in rows] == [(g, "x" * g) for g in range(1, n + 1)]
    assert all(len(rows) == batch for rows in batches[:-1])
    assert all(0 < len(rows) <= batch for rows in batches)


@pytest.mark.django_db
def test_the_rows_are_consumed_inside_the_connections_execute_wrappers(libpq):
    seen: list[str] = []
    inside = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        inside.append(True)
        try:
            return execute(sql, params, many, context)
        finally:
            inside.pop()

    def consume(rows):
        assert inside, "rows handed over outside the execute wrappers"

    with connection.execute_wrapper(wrapper), connection.cursor() as cursor:
        stream_rows(cursor, SERIES, {"n": 120}, consume, 50)
    assert seen == [SERIES]


@pytest.mark.django_db
def test_the_wrappers_get_the_connection_as_django_passes_it():
    contexts = []

    def wrapper(execute, sql, params, many, context):
        contexts.append(context)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper), connection.cursor() as cursor:
        stream_rows(cursor, SERIES, {"n": 3}, lambda rows: None, 50)
        statements.run_each(cursor, "SELECT 1", lambda place, answer: None)
        cursor.execute("SELECT 1")
    assert len(contexts) == 3
    assert all(context["connection"] is connections["default"] for context in contexts)


@pytest.mark.django_db
def test_a_transaction_that_must_roll_back_refuses_a_statement_as_djangos_cursor_does():
    with transaction.atomic(), connection.cursor() as cursor:
        with pytest.raises(DataError), transaction.atomic(savepoint=False):
            cursor.execute("SELECT 1 / 0")  # no savepoint: the outer block must roll back
        with pytest.raises(TransactionManagementError):
            stream_rows(cursor, SERIES, {"n": 3}, lambda rows: None, 50)
        with pytest.raises(TransactionManagementError):
            statements.run_each(cursor, "SELECT 1", lambda place, answer: None)


@pytest.mark.django_db
def test_a_server_error_mid_answer_is_djangos_error(libpq):
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL statement_timeout = '100ms'")
        with pytest.raises(OperationalError, match="statement timeout"):
            stream_rows(
                cursor,
                "SELECT g, pg_sleep(0.05) FROM generate_series(1, 100) AS g",
                {},
                lambda rows: None,
                1,
            )
        transaction.set_rollback(True)


@pytest.mark.django_db(transaction=True)
def test_a_slow_answer_is_cut_at_the_requests_database_budget(settings, libpq):
    settings.BAILING_KNOWLEDGE = {"DATABASE_WAIT_MS": 300}
    batches = []
    started = time.monotonic()
    with (
        bounded_database_wait(),
        connection.cursor() as cursor,
        pytest.raises(OperationalError, match="budget is exhausted"),
    ):
        # Rows larger than the server's 8 kB output buffer leave it one by one.
        stream_rows(
            cursor,
            "SELECT g, repeat('x', 20000), pg_sleep(0.1) FROM generate_series(1, 100) AS g",
            {},
            batches.append,
            1,
        )
    elapsed = time.monotonic() - started
    connection.close()
    assert elapsed < 2.0
    if libpq == "chunked":
        # Rows came until the budget ran out: the deadline watched the whole answer.
        assert 0 < len(batches) < 10


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("n", "batch"), [(0, 3), (7, 3), (500, 50)])
def test_with_server_side_binding_the_rows_arrive_the_same_way(
    n, batch, libpq, prepared_statements
):
    """Bound on the server (and prepared), a statement's rows come in the same batches."""
    prepared_statements()
    batches: list[list[tuple]] = []
    with connection.cursor() as cursor:
        assert not isinstance(cursor.cursor, ClientCursor)
        stream_rows(cursor, SERIES, {"n": n}, lambda rows: batches.append(list(rows)), batch)
    assert [row for rows in batches for row in rows] == [(g, "x" * g) for g in range(1, n + 1)]
    assert all(len(rows) == batch for rows in batches[:-1])
    assert all(0 < len(rows) <= batch for rows in batches)


def _prepared() -> list[tuple[str, int, int]]:
    """(step, generic plans, custom plans) of this connection's prepared `bk:` statements."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
        rows = cursor.fetchall()
    return [
        (statement.split("*/")[0].removeprefix("/*").strip(), generic, custom)
        for statement, generic, custom in rows
        if statement.startswith("/* bk:")
    ]


@pytest.mark.django_db(transaction=True)
def test_with_prepared_statements_a_search_is_planned_once_and_finds_the_same(
    prepared_statements,
):
    kb = services.create_knowledge_base("handbook", title="Handbook")
    for i, topic in enumerate(["refund", "parcel", "warranty", "voucher", "refund parcel"]):
        upsert_document(kb, f"{i}.md", f"Note {i}", f"# Note {i}\n\nA {topic} note, number {i}.")

    def search() -> list[tuple[int, float]]:
        hits = HybridSearch("refund parcel", [kb], Visibility()).run(max_hits=3).hits
        return [(hit.chunk_id, hit.score) for hit in hits]

    expected = search()
    assert expected
    prepared_statements()
    assert [search() for _ in range(3)] == [expected] * 3
    plans = _prepared()
    # The vector leg, the term statistics and the fetch among them (a lexical round's rows
    # are streamed, which psycopg does not prepare): one plan each, for every value. The
    # settings statement runs before its own `plan_cache_mode` applies; it reads no table.
    assert {"bk:vector", "bk:lexicon", "bk:fetch"} <= {step for step, _, _ in plans}, plans
    assert all(
        generic == 3 and custom == 0 for step, generic, custom in plans if step != "bk:configure"
    ), plans


# --------------------------------------------------------------------------------------------
# The search transaction and its batches


def _handbook():
    kb = services.create_knowledge_base("handbook", title="Handbook")
    for i, topic in enumerate(["refund", "parcel", "warranty"]):
        upsert_document(kb, f"{i}.md", f"Note {i}", f"# Note {i}\n\nA {topic} note, number {i}.")
    return kb


@contextmanager
def _protocol_trace() -> Iterator[list[str]]:
    """The libpq protocol messages of Django's connection inside the block, one per line."""
    connection.ensure_connection()
    raw = connection.connection
    lines: list[str] = []
    with tempfile.TemporaryFile() as trace:
        raw.pgconn.trace(trace.fileno())
        raw.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield lines
        finally:
            raw.pgconn.untrace()
            trace.seek(0)
            lines.extend(trace.read().decode(errors="replace").splitlines())


def _round_trips(lines: list[str]) -> int:
    return sum(1 for line in lines if "\tReadyForQuery\t" in line)


@pytest.mark.django_db(transaction=True)
def test_a_search_writes_its_begin_and_commit_into_its_first_and_last_statements():
    kb = _handbook()
    statistics.forget()
    connection.ensure_connection()
    sent: list[str] = []

    def record(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    with _protocol_trace() as lines, connection.execute_wrapper(record):
        result = HybridSearch("refund", [kb], Visibility()).run(max_hits=3)
    assert result.status == "ok" and result.hits
    # The opening statements (settings, term statistics, vector leg) in one query string, one
    # lexical round, then the fetch with the COMMIT: three round trips in all.
    assert sent[0].startswith("BEGIN ISOLATION LEVEL REPEATABLE READ\n;\n/* bk:configure */")
    assert "/* bk:lexicon */" in sent[0] and "/* bk:vector */" in sent[0]
    assert sent[-1].startswith("/* bk:fetch */") and sent[-1].endswith("\n;\nCOMMIT")
    assert len(sent) == 3
    assert _round_trips(lines) == 3
    # Django's view of the connection is untouched, and the server's transaction is over.
    assert connection.get_autocommit() and not connection.in_atomic_block
    assert connection.connection.info.transaction_status == TransactionStatus.IDLE
    assert connection.connection.isolation_level is None
    # The process now knows the statistics of the query's terms: the next search plans its
    # first lexical round from them and sends it last among the opening statements, after
    # the vector leg: one round trip fewer.
    sent.clear()
    with _protocol_trace() as lines, connection.execute_wrapper(record):
        again = HybridSearch("refund", [kb], Visibility()).run(max_hits=3)
    assert again.hits == result.hits
    assert sent[0].index("/* bk:lexicon */") < sent[0].index("/* bk:lexical */")
    assert sent[0].index("/* bk:vector */") < sent[0].index("/* bk:lexical */")
    assert len(sent) == 2 and _round_trips(lines) == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("binding", ["client", "server"])
def test_the_statements_of_a_search_are_logged_as_djangos_own(prepared_statements, binding):
    kb = _handbook()
    statistics.forget()
    if binding == "server":
        prepared_statements()
    with CaptureQueriesContext(connection) as queries:
        assert HybridSearch("refund", [kb], Visibility()).run(max_hits=3).hits
    # Django logs None for a statement it cannot compose.
    logged = [query["sql"] or "" for query in queries.captured_queries]
    rounds = [sql for sql in logged if sql.startswith("/* bk:lexical */")]
    assert rounds and all("%(" not in sql and "'refund|" in sql for sql in rounds)
    if binding == "client":
        assert "/* bk:vector */" in logged[0]  # the opening statements, in one query string
        assert logged[-1].startswith("/* bk:fetch */")  # with the COMMIT
    else:
        assert not any(session.SEPARATOR in sql for sql in logged)  # each statement alone


@pytest.mark.django_db
def test_a_statement_that_fails_is_logged_and_its_error_is_what_is_raised(caplog):
    with (
        caplog.at_level("DEBUG", logger="django.db.backends"),
        CaptureQueriesContext(connection) as queries,
        connection.cursor() as cursor,
        pytest.raises(DataError),
        transaction.atomic(),
    ):
        stream_rows(cursor, "SELECT 1 / %(n)s", {"n": 0}, lambda rows: None, 50)
    assert "SELECT 1 / 0" in [query["sql"] for query in queries.captured_queries]
    assert any(
        record.getMessage().endswith("SELECT 1 / 0; args={'n': 0}; alias=default")
        for record in caplog.records
    )


@pytest.mark.django_db(transaction=True)
def test_a_search_without_hits_commits_on_its_own():
    kb = _handbook()
    connection.ensure_connection()
    with _protocol_trace() as lines:
        result = HybridSearch("qevadudi", [kb], Visibility(), use_vector=False).run(max_hits=3)
    assert result.hits == [] and result.status == "ok"
    assert _round_trips(lines) == 2  # the opening statements, then COMMIT
    assert connection.connection.info.transaction_status == TransactionStatus.IDLE


@pytest.mark.django_db(transaction=True)
def test_an_error_inside_the_search_rolls_its_transaction_back(monkeypatch):
    kb = _handbook()

    def broken(self, *args):
        with connection.cursor() as cursor:
            cursor.execute("SELECT no_such_column FROM bailing_knowledge_chunk")

    monkeypatch.setattr(HybridSearch, "_lexical", broken)
    with pytest.raises(ProgrammingError):
        HybridSearch("refund", [kb], Visibility()).run(max_hits=3)
    assert connection.connection.info.transaction_status == TransactionStatus.IDLE
    monkeypatch.undo()
    # The connection goes on serving, in autocommit as before.
    assert HybridSearch("refund", [kb], Visibility()).run(max_hits=3).hits
    assert connection.get_autocommit() and not connection.in_atomic_block


@pytest.mark.django_db(transaction=True)
def test_a_timeout_among_the_opening_statements_fails_the_vector_leg_only(settings, monkeypatch):
    """The vector leg travels with the opening statements; when they time out, it is the leg
    that failed, and the lexical leg answers from a new transaction."""
    kb = _handbook()
    settings.BAILING_KNOWLEDGE = {"SEARCH_STATEMENT_TIMEOUT_MS": 300}
    monkeypatch.setattr(
        HybridSearch, "_vector_statement", lambda self, leg: ("SELECT pg_sleep(1.5)", None)
    )
    result = HybridSearch("refund", [kb], Visibility()).run(max_hits=3)
    assert result.status == "partial"
    assert (result.legs_ok, result.legs_failed) == (1, 1)
    assert [hit.title for hit in result.hits] == ["Note 0"]
    assert connection.connection.info.transaction_status == TransactionStatus.IDLE


@pytest.mark.django_db
def test_a_batch_answers_each_of_its_statements_in_order():
    statements = [
        ("SELECT %(n)s::int AS n, %(text)s::text", {"n": 1, "text": "it's; a\n%s"}),
        ("SELECT set_config('application_name', %s, true)", ["batch"]),
        ("SELECT g FROM generate_series(1, %s) AS g WHERE false", [3]),
        ("SET LOCAL work_mem = '8MB'", None),  # answers no rows at all
        ("SELECT current_setting('work_mem')", None),
    ]
    tx = session.SearchTransaction(batches=True, own=False)
    with transaction.atomic(), connection.cursor() as cursor:
        assert tx.run(cursor, statements) == [
            [(1, "it's; a\n%s")],
            [("batch",)],
            [],
            None,
            [("8MB",)],
        ]


@pytest.mark.django_db
def test_an_answer_of_a_batch_after_a_streamed_statement_comes_whole():
    tx = session.SearchTransaction(batches=True, own=False)
    with transaction.atomic(), connection.cursor() as cursor:
        stream_rows(cursor, SERIES, {"n": 120}, lambda rows: None, 50)
        answers = tx.run(cursor, [(SERIES, {"n": 120}), ("SELECT 2", None)])
    assert [row[0] for row in answers[0]] == list(range(1, 121)) and answers[1] == [(2,)]


@pytest.mark.django_db
def test_an_error_in_handing_an_answer_on_comes_once_the_server_has_answered_them_all():
    def arrived(place, answer):
        raise ValueError(f"cannot take answer {place}")

    tx = session.SearchTransaction(batches=True, own=False)
    with transaction.atomic(), connection.cursor() as cursor:
        with pytest.raises(ValueError, match="answer 0"):
            tx.run(cursor, [("SELECT 1", None), ("SELECT pg_sleep(0.05)", None)], arrived=arrived)
        cursor.execute("SELECT 2")  # the connection is ready for its next statement
        assert cursor.fetchone() == (2,)


class _Unreadable(Loader):
    def load(self, data):
        raise ValueError("cannot read this value")


@pytest.mark.django_db
def test_an_answer_that_cannot_be_read_is_raised_once_the_server_has_answered_them_all():
    tx = session.SearchTransaction(batches=True, own=False)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.cursor.adapters.register_loader("numeric", _Unreadable)
        with pytest.raises(ValueError, match="cannot read"):
            tx.run(cursor, [("SELECT 1.5::numeric", None), ("SELECT pg_sleep(0.05)", None)])
        cursor.execute("SELECT 2")  # the connection is ready for its next statement
        assert cursor.fetchone() == (2,)


@pytest.mark.django_db(transaction=True)
def test_an_own_transaction_begins_with_the_first_batch_and_commits_with_the_last():
    connection.ensure_connection()
    raw = connection.connection
    tx = session.SearchTransaction(batches=True, own=True)
    with connection.cursor() as cursor:
        first = tx.run(cursor, [("SELECT current_setting('transaction_isolation')", None)])
        assert raw.info.transaction_status == TransactionStatus.INTRANS
        last = tx.run(cursor, [("SELECT %s::int", [7])], last=True)
        assert raw.info.transaction_status == TransactionStatus.IDLE
        with pytest.raises(RuntimeError, match="has ended"):
            tx.run(cursor, [("SELECT 1", None)])
    assert first == [[("repeatable read",)]] and last == [[(7,)]]


@pytest.mark.django_db
def test_an_error_in_a_batch_stops_the_statements_after_it():
    tx = session.SearchTransaction(batches=True, own=False)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE marks (n int)")
        with pytest.raises(DataError), transaction.atomic():
            tx.run(
                cursor,
                [
                    ("INSERT INTO marks VALUES (%s)", [1]),
                    ("SELECT 1 / %s", [0]),
                    ("INSERT INTO marks VALUES (%s)", [2]),
                ],
            )
        assert tx.answered == 1  # the statement that failed was the second
        cursor.execute("SELECT count(*) FROM marks")
        assert cursor.fetchone() == (0,)  # the savepoint rolled back the first; no second


@pytest.mark.django_db(transaction=True)
def test_with_server_side_binding_each_statement_goes_by_itself(prepared_statements):
    kb = _handbook()
    prepared_statements()
    sent: list[str] = []

    def record(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        assert HybridSearch("refund", [kb], Visibility()).run(max_hits=3).hits
    assert not any(sql.startswith("BEGIN") or session.SEPARATOR in sql for sql in sent)
    assert sent[0].startswith("/* bk:configure */")
    assert connection.connection.info.transaction_status == TransactionStatus.IDLE


def _fail_on(statement: str):
    """An execute wrapper that fails `statement` as a lost server would."""

    def wrapper(execute, sql, params, many, context):
        if sql == statement:
            raise OperationalError(f"server closed the connection during {statement}")
        return execute(sql, params, many, context)

    return wrapper


@pytest.mark.django_db(transaction=True)
def test_a_commit_that_fails_closes_the_connection_rather_than_hand_it_on():
    kb = _handbook()
    with connection.execute_wrapper(_fail_on("COMMIT")), pytest.raises(OperationalError):
        # No hits: the COMMIT goes alone, at the end.
        HybridSearch("qevadudi", [kb], Visibility(), use_vector=False).run(max_hits=3)
    assert connection.connection is None
    assert HybridSearch("refund", [kb], Visibility()).run(max_hits=3).hits


@pytest.mark.django_db(transaction=True)
def test_a_rollback_that_fails_after_a_timeout_closes_the_connection(settings, monkeypatch):
    kb = _handbook()
    settings.BAILING_KNOWLEDGE = {"SEARCH_STATEMENT_TIMEOUT_MS": 300}
    monkeypatch.setattr(
        HybridSearch, "_vector_statement", lambda self, leg: ("SELECT pg_sleep(1.5)", None)
    )
    with connection.execute_wrapper(_fail_on("ROLLBACK")), pytest.raises(OperationalError):
        HybridSearch("refund", [kb], Visibility()).run(max_hits=3)
    assert connection.connection is None


@pytest.mark.django_db(transaction=True)
def test_a_lexical_timeout_keeps_the_vector_answer_already_received(settings, monkeypatch):
    """The vector leg answered with the opening statements: the new transaction after the
    lexical leg's timeout neither embeds the query again nor runs the leg again."""
    kb = _handbook()
    settings.BAILING_KNOWLEDGE = {"SEARCH_STATEMENT_TIMEOUT_MS": 300}
    built = []
    vector_statement = HybridSearch._vector_statement

    def counted(self, leg):
        built.append(leg.embedder)
        return vector_statement(self, leg)

    def slow_lexical(self, *args):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(1.5)")

    monkeypatch.setattr(HybridSearch, "_vector_statement", counted)
    monkeypatch.setattr(HybridSearch, "_lexical", slow_lexical)
    result = HybridSearch("refund", [kb], Visibility()).run(max_hits=3)
    assert built == ["default"]
    assert (result.legs_ok, result.legs_failed) == (1, 1)
    assert result.status == "partial" and result.hits


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("one_by_one", [True, False])
def test_a_timeout_fails_the_leg_whose_statement_it_was(
    settings, monkeypatch, prepared_statements, one_by_one
):
    """Statements sent one by one or together, the failed one is known."""
    kb = _handbook()
    if one_by_one:
        prepared_statements()
    settings.BAILING_KNOWLEDGE = {"SEARCH_STATEMENT_TIMEOUT_MS": 300}
    monkeypatch.setattr(
        statistics.Statistics,
        "statement",
        staticmethod(lambda kb_ids, terms: ("SELECT pg_sleep(1.5)", None)),
    )
    result = HybridSearch("refund", [kb], Visibility()).run(max_hits=3)
    # The term statistics timed out, not the vector leg: the vector leg answers.
    assert (result.legs_ok, result.legs_failed) == (1, 1)
    assert result.hits and result.status == "partial"


@pytest.mark.django_db
def test_inside_a_callers_transaction_the_search_leaves_no_setting_behind():
    kb = _handbook()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('statement_timeout'), current_setting('jit')")
        before = cursor.fetchone()
        assert HybridSearch("refund", [kb], Visibility()).run(max_hits=3).hits
        cursor.execute("SELECT current_setting('statement_timeout'), current_setting('jit')")
        assert cursor.fetchone() == before
        cursor.execute("SELECT current_setting('enable_seqscan')")
        assert cursor.fetchone() == ("on",)


@pytest.fixture
def autocommit_off():
    """Django's connection with `AUTOCOMMIT` off, as a project may configure it."""
    saved = connection.settings_dict["AUTOCOMMIT"]
    connection.close()
    connection.settings_dict["AUTOCOMMIT"] = False
    yield
    connection.close()
    connection.settings_dict["AUTOCOMMIT"] = saved


@pytest.mark.django_db(transaction=True)
def test_with_autocommit_off_searches_run_in_the_drivers_transaction(autocommit_off):
    kb = _handbook()
    transaction.commit()
    connection.close()
    for _ in range(2):
        assert HybridSearch("refund", [kb], Visibility()).run(max_hits=3).hits
    raw = connection.connection
    assert not raw.autocommit and raw.isolation_level is None
    transaction.rollback()
