"""A frozen database and an immediate restart, under a loop of real HTTP requests.

The server under test runs in its own process on a PostgreSQL of the test's own, with
persistent health-checked connections. Frozen (SIGSTOP of every PostgreSQL process), it must
answer 503 `knowledge_unavailable` with `Retry-After` within the database wait budget, and
answer 200 again soon after the database is back, without a restart.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import httpx
import pytest

from . import figures

SEARCH = "/workspaces/orders/knowledge/search"
# The default database wait budget is 2.5 s; the promise to agents is 3 s.
LONGEST_WAIT_LIMIT = 3.0
RECOVERY_LIMIT = 2.0


@dataclass
class Outcome:
    started: float
    ended: float
    status: int
    body: dict | None
    retry_after: str | None
    worker: int


class RequestLoop:
    """Workers searching in a loop: some on kept-alive connections, one opening a new one
    for every request (a new server thread, so a new database connection)."""

    def __init__(self, server, workers: int = 4) -> None:
        self.server = server
        self.outcomes: list[Outcome] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._work, args=(n, n == 0), daemon=True)
            for n in range(workers)
        ]

    def __enter__(self) -> RequestLoop:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _work(self, worker: int, fresh: bool) -> None:
        headers = {"Authorization": f"Bearer {self.server.token}"}
        http = httpx.Client(timeout=30, headers=headers)
        try:
            while not self._stop.is_set():
                if fresh:
                    http.close()
                    http = httpx.Client(timeout=30, headers=headers)
                started = time.monotonic()
                try:
                    response = http.post(self.server.url + SEARCH, json={"query": "refunds"})
                except httpx.HTTPError as exc:
                    with self._lock:
                        self.errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                ended = time.monotonic()
                try:
                    body = response.json()
                except ValueError:
                    body = None
                with self._lock:
                    self.outcomes.append(
                        Outcome(
                            started,
                            ended,
                            response.status_code,
                            body,
                            response.headers.get("retry-after"),
                            worker,
                        )
                    )
                time.sleep(0.02)
        finally:
            http.close()


def _wrong_answers(outcomes: list[Outcome]) -> list[Outcome]:
    """Anything but a search answer or a JSON 503 `knowledge_unavailable` with Retry-After."""
    wrong = []
    for outcome in outcomes:
        if outcome.status == 200 and outcome.body and outcome.body.get("status") == "ok":
            continue
        if (
            outcome.status == 503
            and outcome.body
            and outcome.body.get("error") == "knowledge_unavailable"
            and outcome.retry_after
        ):
            continue
        wrong.append(outcome)
    return wrong


def _recovery(loop: RequestLoop, resumed: float) -> float:
    """Seconds from `resumed` until every worker's requests answer 200 again."""
    worst = 0.0
    for worker in {o.worker for o in loop.outcomes}:
        mine = sorted((o for o in loop.outcomes if o.worker == worker), key=lambda o: o.started)
        failed_after = [o.ended for o in mine if o.ended > resumed and o.status != 200]
        ok_after = [o for o in mine if o.ended > resumed and o.status == 200]
        if not ok_after:
            return float("inf")
        last_failure = max(failed_after, default=resumed)
        first_good = min(o.ended for o in ok_after if o.ended >= last_failure)
        worst = max(worst, first_good - resumed)
    return worst


def _settle(server) -> None:
    """Wait until the server answers 200 (after an earlier fault)."""
    headers = {"Authorization": f"Bearer {server.token}"}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            response = httpx.post(
                server.url + SEARCH, json={"query": "refunds"}, headers=headers, timeout=10
            )
            if response.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("the fault server never answered 200")


def test_a_frozen_database_is_a_fast_503_and_recovers(fault_server, own_database):
    _settle(fault_server)
    frozen_for = figures.scale(3, 12)
    with RequestLoop(fault_server) as loop:
        time.sleep(0.5)
        own_database.freeze()
        frozen_at = time.monotonic()
        try:
            time.sleep(frozen_for)
        finally:
            own_database.thaw()
        resumed = time.monotonic()
        time.sleep(figures.scale(2, 5))
    during = [o for o in loop.outcomes if o.started < resumed and o.ended > frozen_at]
    longest = max((o.ended - o.started for o in loop.outcomes), default=0.0)
    recovery = _recovery(loop, resumed)
    wrong = _wrong_answers(loop.outcomes)
    figures.count("frozen_db_requests", len(loop.outcomes))
    figures.record("frozen_db_5xx_other_than_503", sum(o.status >= 500 for o in wrong), 0)
    figures.record("frozen_db_longest_wait_s", longest, LONGEST_WAIT_LIMIT)
    figures.record("frozen_db_recovery_s", recovery, RECOVERY_LIMIT)
    assert not loop.errors, loop.errors[:3]
    assert not wrong, wrong[:3]
    assert sum(o.status == 503 for o in during) >= 4, "the freeze was not noticed"
    assert longest <= LONGEST_WAIT_LIMIT
    assert recovery <= RECOVERY_LIMIT


def test_an_immediate_stop_and_restart_is_503_then_200(fault_server, own_database):
    _settle(fault_server)
    with RequestLoop(fault_server) as loop:
        time.sleep(0.5)
        stopped_at = time.monotonic()
        own_database.pg_ctl("-m", "immediate", "restart")
        resumed = time.monotonic()
        time.sleep(figures.scale(2, 8))
    longest = max((o.ended - o.started for o in loop.outcomes), default=0.0)
    wrong = _wrong_answers(loop.outcomes)
    recovery = _recovery(loop, resumed)
    figures.count("restart_db_requests", len(loop.outcomes))
    figures.record("restart_db_5xx_other_than_503", sum(o.status >= 500 for o in wrong), 0)
    figures.record("restart_db_longest_wait_s", longest, LONGEST_WAIT_LIMIT)
    figures.record("restart_db_recovery_s", recovery, RECOVERY_LIMIT)
    assert not loop.errors, loop.errors[:3]
    assert not wrong, wrong[:3]
    assert resumed > stopped_at
    assert longest <= LONGEST_WAIT_LIMIT
    assert recovery <= RECOVERY_LIMIT


@pytest.fixture(autouse=True)
def _thawed(own_database):
    yield
    own_database.thaw()
