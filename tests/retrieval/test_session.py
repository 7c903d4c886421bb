"""The search transaction and statements whose rows are used as they arrive
(`session.stream_rows`), on the real server: every row in order, in batches, within the
request's database deadline, with Django's errors; and a search's statements planned once
where the deployment prepares statements."""

from __future__ import annotations

import time

import pytest
from django.db import OperationalError, connection, transaction

from bailing_knowledge import services
from bailing_knowledge.deadline import bounded_database_wait
from bailing_knowledge.ingestion.documents import upsert_document
from bailing_knowledge.retrieval import session
from bailing_knowledge.retrieval.hybrid import HybridSearch, Visibility
from bailing_knowledge.retrieval.session import stream_rows

SERIES = "SELECT g, repeat('x', g) FROM generate_series(1, %(n)s) AS g"


@pytest.fixture(params=["chunked", "libpq older than 17"])
def libpq(request, monkeypatch):
    """Rows read by batches (libpq 17+), or all at once where libpq cannot."""
    if request.param != "chunked":
        monkeypatch.setattr(session.capabilities, "has_stream_chunked", lambda: False)
    return request.param


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


@pytest.fixture
def prepared_statements():
    """Django's connection as a deployment without a transaction pooler may set it: parameters
    bound on the server (`server_side_binding`) and each statement prepared at its first run
    (psycopg's `prepare_threshold` 0). Yields a function that switches it on."""
    options = connection.settings_dict["OPTIONS"]
    saved = dict(options)

    def switch_on() -> None:
        connection.close()
        options.update(server_side_binding=True, prepare_threshold=0)

    yield switch_on
    connection.close()
    options.clear()
    options.update(saved)


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
    # are streamed, which psycopg does not prepare): one plan each, for every value.
    assert {"bk:vector", "bk:lexicon", "bk:fetch"} <= {step for step, _, _ in plans}, plans
    assert all(generic == 3 and custom == 0 for _, generic, custom in plans), plans
