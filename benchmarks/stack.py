"""The two sides of every latency comparison: the full Django stack and the raw SQL.

"Full stack" is an in-process `django.test.Client` request with a real bearer token: the
middleware, URL routing, authentication, the route re-check, DRF, the service, the budgets
and the JSON rendering all run; no socket or HTTP server is involved. The test client keeps
Django's connection open by itself, so each request is wrapped in `close_old_connections()`
as a WSGI server's `request_started`/`request_finished` signals do: persistent connections
(`CONN_MAX_AGE`) and their health checks then behave as they do in production.

"Raw SQL" is the same hybrid query without anything around it: the statements
`HybridSearch` sends for a query (transaction settings, term statistics, lexical leg, vector
leg, candidate fetch, validation) are recorded once with their exact parameters, then
replayed on a plain psycopg connection that binds parameters on the client as Django does.
The replay leaves out the savepoints around each leg, the embedder call, the Python around
the SQL (scoring between lexical rounds, fusion, signing, budgets) and the framework.
Recording instead of re-implementing keeps the comparison exact whatever the hybrid query
looks like; a part of it (the vector leg alone, the lexical leg alone) is replayed by
picking its statements by step.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bailing_knowledge.statements import answer_rows

from .common import raw_connection, use_database

API = "/agent-api/v1/workspaces/{route}/knowledge/{action}"
# `benchmarks.floor.FloorView`, as `benchmarks.urls` routes it.
FLOOR = "/bench/floor/{route}/capabilities"


class Agent:
    """An agent calling the API in-process with a bearer token, one request at a time."""

    def __init__(self, token: str, route: str) -> None:
        from django.test import Client

        self.http = Client()
        self.headers = {"Authorization": f"Bearer {token}"}
        self.route = route

    def call(
        self, method: str, action: str, body: dict[str, Any] | None = None
    ) -> tuple[float, dict[str, Any]]:
        """(seconds, decoded JSON) of one request to an agent API action."""
        return self.request(method, API.format(route=self.route, action=action), body)

    def request(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> tuple[float, dict[str, Any]]:
        """(seconds, decoded JSON) of one request; the JSON is decoded outside the timing."""
        from django.db import close_old_connections

        kwargs: dict[str, Any] = {"headers": self.headers}
        if body is not None:
            kwargs.update(data=json.dumps(body), content_type="application/json")
        start = time.perf_counter()
        close_old_connections()  # request_started
        response = getattr(self.http, method)(path, **kwargs)
        elapsed = time.perf_counter() - start
        close_old_connections()  # request_finished: after the response is out
        if response.status_code != 200:
            raise RuntimeError(f"{path}: HTTP {response.status_code} {response.content[:300]!r}")
        return elapsed, json.loads(response.content)

    def post(self, action: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        return self.call("post", action, body)


# The statements of a search, by what they do. The product marks each statement with a
# comment at its start (`/* bk:<step> */`); the substrings after the markers recognise the
# statements of the code before the markers (and its df probe, a part of "lexicon").
STEP_MARKERS = (
    ("configure", "set_config('statement_timeout'"),
    ("lexicon", "/* bk:lexicon */"),
    ("lexical", "/* bk:lexical */"),
    ("vector", "/* bk:vector */"),
    ("fetch", "/* bk:fetch */"),
    ("lexicon", "most_common_elems"),
    ("lexicon", "unnest(%(terms)s::text[])"),
    ("lexicon", "'bailing_knowledge_chunk'::regclass"),
    ("lexical", "ts_rank_cd"),
    ("vector", "<=>"),
    ("fetch", "c.id = ANY(%(ids)s)"),
)
STEPS = ("configure", "lexicon", "lexical", "vector", "fetch", "other")
# What the targets replay of a search: the vector leg alone, the lexical leg alone.
VECTOR_STEPS = ("configure", "vector")
LEXICAL_STEPS = ("lexicon", "lexical")


def step_of(sql: str) -> str:
    for step, marker in STEP_MARKERS:
        if marker in sql:
            return step
    return "other"


def split_batch(sql: str) -> list[str]:
    """The statements of a query string as `HybridSearch` sends it, without BEGIN and COMMIT.

    A search sends several statements in one query string where it can (its opening
    statements, its fetch with the COMMIT), each after its `/* bk:` marker."""
    from bailing_knowledge.retrieval.session import SEPARATOR

    separator = re.escape(SEPARATOR) + r"(?=/\* bk:|COMMIT\Z)"
    return [part for part in re.split(separator, sql) if not part.startswith(("BEGIN", "COMMIT"))]


@dataclass(frozen=True)
class CapturedSearch:
    """The SQL one search runs: each statement with its parameters, in order (`statements`),
    and the query strings as they were sent, several statements in one where the search
    batched them, BEGIN and COMMIT included when it wrote them itself (`sent`)."""

    query: str
    statements: tuple[tuple[str, Any], ...]
    sent: tuple[tuple[str, Any], ...] = ()

    @property
    def batched(self) -> bool:
        """The search wrote its own BEGIN (and COMMIT) into query strings it batched."""
        return bool(self.sent) and self.sent[0][0].startswith("BEGIN")

    def of(self, *steps: str) -> list[tuple[str, Any]]:
        """The statements of these steps, in the order the search sent them."""
        return [(sql, params) for sql, params in self.statements if step_of(sql) in steps]


def capture_search(session: Any, route: Any, query: str) -> CapturedSearch:
    """Run the search service for `query` and record the statements `HybridSearch` sends.

    The ORM queries before the search (the route's KBs) and the savepoints around each leg
    are left out: what remains is the hybrid query itself, with the exact parameters the
    service computed (terms, weights, the query vector, candidate ids).
    """
    from django.db import connection

    from bailing_knowledge import constants
    from bailing_knowledge.services.search import find_hits

    log: list[tuple[str, Any]] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        log.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        find_hits(session, route, query, max_hits=min(constants.SEARCH_MAX_RESULTS, route.max_docs))
    first = next(i for i, (sql, _) in enumerate(log) if step_of(sql) == "configure")
    sent = tuple(
        (sql, params)
        for sql, params in log[first:]
        if not sql.lstrip().upper().startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))
    )
    statements = tuple((part, params) for sql, params in sent for part in split_batch(sql))
    return CapturedSearch(query, statements, sent)


class RawSQL:
    """Replays captured searches on a plain psycopg connection, one transaction each."""

    def __init__(self, dbname: str) -> None:
        self.conn = raw_connection(dbname)

    def close(self) -> None:
        self.conn.close()

    def replay(self, search: CapturedSearch, spent: dict[str, float] | None = None) -> None:
        with self.conn.cursor() as cursor:
            for sql, params in search.statements:
                start = time.perf_counter()
                cursor.execute(sql, params)
                answer_rows(cursor)
                if spent is not None:
                    step = step_of(sql)
                    spent[step] = spent.get(step, 0.0) + time.perf_counter() - start
        self.conn.commit()

    def timed(self, search: CapturedSearch) -> float:
        """Seconds of the search's SQL sent as the search sent it: the same query strings,
        so the same round trips."""
        if not search.batched:
            # Statements sent one by one, in a transaction the driver began.
            start = time.perf_counter()
            self.replay(search)
            return time.perf_counter() - start
        # The search wrote its BEGIN and COMMIT into its query strings.
        return self._timed_sent(search.sent)

    def timed_together(self, search: CapturedSearch, steps: Sequence[str]) -> float:
        """Seconds of the statements of `steps` sent as the search sends its opening ones:
        in one query string after the transaction's BEGIN, then COMMIT. A search that sent
        its statements one by one (`server_side_binding`) has them replayed one by one."""
        from bailing_knowledge.retrieval import session

        if not search.batched:
            return self.timed_steps(search, steps)
        with self.conn.cursor() as cursor:
            parts = [cursor.mogrify(sql, params) for sql, params in search.of(*steps)]
        text = session.SEPARATOR.join([session.BEGIN, *parts])
        return self._timed_sent([(text, None), ("COMMIT", None)])

    def _timed_sent(self, sent: Sequence[tuple[str, Any]]) -> float:
        """Seconds of query strings that hold their own BEGIN and COMMIT, in autocommit,
        every answer of each read."""
        self.conn.autocommit = True
        try:
            with self.conn.cursor() as cursor:
                start = time.perf_counter()
                for sql, params in sent:
                    cursor.execute(sql, params)
                    while True:
                        answer_rows(cursor)
                        if not cursor.nextset():
                            break
                return time.perf_counter() - start
        finally:
            self.conn.autocommit = False

    def timed_steps(
        self, search: CapturedSearch, steps: Sequence[str], *, untimed: Sequence[str] = ()
    ) -> float:
        """Seconds of the statements of `steps`, replayed in one transaction after those of
        `untimed` (e.g. the configure statement, so the settings are the search's)."""
        with self.conn.cursor() as cursor:
            for sql, params in search.of(*untimed):
                cursor.execute(sql, params)
            start = time.perf_counter()
            for sql, params in search.of(*steps):
                cursor.execute(sql, params)
                answer_rows(cursor)
            self.conn.commit()
        return time.perf_counter() - start


@dataclass
class Bench:
    """One benchmark database with a fresh agent session and two raw connections."""

    dbname: str
    agent: Agent
    raw: RawSQL
    session: Any
    route: Any
    #: The vector leg's SQL, timed as the baseline of the search targets, on a connection of
    #: its own: replayed on `raw` right after the whole search's SQL, which holds the same
    #: statement, it found that server process warm from running it a moment before (about
    #: 12 % faster at 100k chunks), an advantage the full stack's connection never has.
    vector: RawSQL

    def capture(self, query: str) -> CapturedSearch:
        return capture_search(self.session, self.route, query)

    def close(self) -> None:
        from django.db import connection

        self.raw.close()
        self.vector.close()
        connection.close()


def open_bench(dbname: str) -> Bench:
    from bailing_knowledge import services
    from bailing_knowledge.models import AgentSession, Route

    from .build import CLIENT_APP_ID, ROUTE_KEY

    use_database(dbname)
    AgentSession.objects.filter(client__app_id=CLIENT_APP_ID).delete()  # earlier runs'
    issued = services.issue_session(
        CLIENT_APP_ID, principal_id="bench-user", routes=[ROUTE_KEY], lifetime=3600
    )
    return Bench(
        dbname,
        Agent(issued.access_token, ROUTE_KEY),
        RawSQL(dbname),
        issued.session,
        Route.objects.get(route_key=ROUTE_KEY),
        RawSQL(dbname),
    )
