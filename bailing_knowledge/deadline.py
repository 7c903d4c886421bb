"""A bounded wait on PostgreSQL for each agent request, whatever the server does.

`statement_timeout` and `lock_timeout` are enforced by the server, so a server that is frozen
(stopped, swapping, behind a dead network path) never fires them, and a request on an open
connection would wait as long as the server is gone. Here the client keeps the clock: each
query is armed on one watchdog thread with what is left of the request's budget, and when the
budget runs out the watchdog shuts the connection's socket down. The blocked query then fails
at once with a database error, which the views answer with 503 `knowledge_unavailable`, and
Django discards the broken connection at the end of the request. Connecting is bounded by
the `connect_timeout` option of the database settings and counted against the same budget.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from django.db import DEFAULT_DB_ALIAS, OperationalError, connections
from psycopg import capabilities, generators, waiting

from .conf import knowledge_settings

logger = logging.getLogger("bailing_knowledge")

# How long a cancel request may wait for the server, in a thread of its own.
CANCEL_TIMEOUT_SECONDS = 5.0


class _Watchdog:
    """One daemon thread that shuts down the sockets of queries past their deadline."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._armed: dict[int, tuple[Any, int]] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, raw: Any, fd: int, deadline: float) -> int:
        """Watch the driver connection `raw`, whose socket is `fd`, until `deadline`."""
        with self._lock:
            key = next(self._ids)
            self._armed[key] = (raw, fd)
            heapq.heappush(self._heap, (deadline, key))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="bailing-knowledge-db-watchdog", daemon=True
                )
                self._thread.start()
            if self._heap[0][1] == key:
                # The watchdog sleeps until the earliest deadline; only an earlier one needs
                # to wake it (most queries of a request share the request's end).
                self._lock.notify()
            return key

    def disarm(self, key: int) -> bool:
        """False when the watchdog already fired for `key`."""
        with self._lock:
            return self._armed.pop(key, None) is not None

    def _run(self) -> None:
        while True:
            with self._lock:
                # Entries of queries that ended are dropped here, not when disarmed: the
                # watchdog sleeps until the earliest query still running must end.
                while self._heap and self._heap[0][1] not in self._armed:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._lock.wait()
                    continue
                deadline, key = self._heap[0]
                now = time.monotonic()
                if deadline > now:
                    self._lock.wait(deadline - now)
                    continue
                heapq.heappop(self._heap)
                armed = self._armed.pop(key, None)
                if armed is not None:
                    # Under the lock: the query's thread cannot disarm (and then close the
                    # connection, freeing the descriptor) while its socket is shut down.
                    _cut(*armed)


def _cut(raw: Any, fd: int) -> None:
    """Fail the connection's pending operation now, and ask the server to cancel it."""
    cancel_conn = None
    if capabilities.has_cancel_safe():
        with contextlib.suppress(Exception):
            cancel_conn = raw.pgconn.cancel_conn()
    _shutdown(fd)
    if cancel_conn is not None:
        # A live server stops the query (a lock wait, a slow plan) instead of finishing it
        # for nobody; a frozen one never answers, and the attempt gives up.
        threading.Thread(target=_cancel, args=(cancel_conn,), daemon=True).start()


def _cancel(cancel_conn: Any) -> None:
    with contextlib.suppress(Exception):
        cancel_conn.start()
        waiting.wait_conn(generators.cancel(cancel_conn), timeout=CANCEL_TIMEOUT_SECONDS)
    with contextlib.suppress(Exception):
        cancel_conn.finish()


def _shutdown(fd: int) -> None:
    """Make every pending and later read or write on the socket fail; the fd stays open."""
    with contextlib.suppress(OSError):
        # fromfd duplicates the descriptor; shutdown acts on the socket both share.
        sock = socket.fromfd(fd, socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()


_watchdog = _Watchdog()


class DatabaseDeadline:
    """The remaining database budget of one request.

    Installed as a Django execute wrapper (queries), and over the connection wrapper's own
    `connect`, `init_connection_state`, `_commit` and `_rollback`, which reach the driver
    without passing the execute wrappers.
    """

    _patched = ("connect", "init_connection_state", "_commit", "_rollback")

    def __init__(self, budget_seconds: float, alias: str = DEFAULT_DB_ALIAS) -> None:
        self.connection = connections[alias]
        self.remaining = budget_seconds
        self._connecting: tuple[float, float] | None = None
        # Whether the connection has answered in this request (it was alive then).
        self._answered = False

    def _exhausted(self) -> OperationalError:
        return OperationalError("The request's database wait budget is exhausted.")

    def _guarded(self, operation: Any) -> Any:
        """Run `operation` on the open connection under what is left of the budget."""
        if self.remaining <= 0:
            raise self._exhausted()
        raw = self.connection.connection
        with self.connection.wrap_database_errors:
            fd = raw.pgconn.socket
        started = time.monotonic()
        key = _watchdog.arm(raw, fd, started + self.remaining)
        try:
            result = operation()
        except BaseException as exc:
            if self._disarm(key, started):
                raise
            raise self._exhausted() from exc
        if not self._disarm(key, started):
            # The answer arrived as the socket was shut down: the connection is unusable.
            raise self._exhausted()
        self._answered = True
        return result

    def _disarm(self, key: int, started: float) -> bool:
        """Account for the time spent; False when the watchdog cut the operation short."""
        self.remaining -= time.monotonic() - started
        return _watchdog.disarm(key)

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        return self._guarded(lambda: execute(sql, params, many, context))

    def _guard_connect(self, connect: Any) -> Any:
        def guarded() -> Any:
            # Opening the socket is bounded by the `connect_timeout` option; the time counts.
            if self.remaining <= 0:
                raise self._exhausted()
            started, budget = time.monotonic(), self.remaining
            self._connecting = (started, budget)
            try:
                return connect()
            finally:
                self._connecting = None
                self.remaining = budget - (time.monotonic() - started)

        return guarded

    def _guard_init(self, init: Any) -> Any:
        def guarded() -> Any:
            # Django's first queries on a new connection (time zone, role).
            if self._connecting is not None:
                started, budget = self._connecting
                self.remaining = budget - (time.monotonic() - started)
            return self._guarded(init)

        return guarded

    def _guard_ending(self, end: Any) -> Any:
        def guarded() -> Any:
            if self.connection.connection is None:
                return end()
            return self._guarded(end)

        return guarded

    def install(self) -> None:
        connection = self.connection
        connection.connect = self._guard_connect(connection.connect)
        connection.init_connection_state = self._guard_init(connection.init_connection_state)
        connection._commit = self._guard_ending(connection._commit)
        connection._rollback = self._guard_ending(connection._rollback)

    def uninstall(self) -> None:
        for name in self._patched:
            self.connection.__dict__.pop(name, None)

    def connect(self, *, first_statement_checks: bool = False) -> bool:
        """Check or open the connection now, within the budget; True when a kept connection
        is to be used unchecked, its check left to the request's first statement.

        Django's health check (`CONN_HEALTH_CHECKS`) is a `SELECT 1` round trip before the
        request's first query, past the execute wrappers. With `first_statement_checks`
        (the caller's first statement runs on this connection, only reads, and can be run
        again) and outside a transaction, that statement is the check: when it fails because
        the connection is dead, `reconnect` opens a new one and the caller runs it again.
        Otherwise, and inside a caller's transaction, where a connection cannot be replaced,
        Django's check runs first, guarded.
        """
        connection = self.connection
        raw = connection.connection
        if raw is not None and _dead(raw):
            # Left broken by an earlier request (cut short) whose end did not close it.
            connection.close()
        unchecked = False
        if connection.connection is not None:
            if (
                first_statement_checks
                and connection.health_check_enabled
                and not connection.health_check_done
                and not connection.in_atomic_block
            ):
                connection.health_check_done = True
                unchecked = True
            else:
                with contextlib.suppress(OperationalError):
                    # A check cut short leaves the connection broken; Django then closes it.
                    self._guarded(connection.close_if_health_check_failed)
        connection.ensure_connection()
        if self.remaining <= 0:
            raise self._exhausted()
        return unchecked

    def reconnect(self) -> bool:
        """After the first statement failed on a connection `connect` left unchecked: True,
        with a new connection open, if the connection was dead; False if it failed on a live
        connection, after an earlier answer, or with the budget spent (its error stands)."""
        connection = self.connection
        raw = connection.connection
        if self._answered or self.remaining <= 0:
            return False
        if raw is not None and not _dead(raw):
            return False
        logger.info("A kept database connection was closed; opening a new one")
        connection.close()
        connection.ensure_connection()
        return True

    def settle(self) -> None:
        """After the caller's first statement should have run: if the connection has not
        answered (the request was refused before any statement, or it ran elsewhere), its
        health check is Django's again, at its next query."""
        if not self._answered:
            self.connection.health_check_done = False


def _dead(raw: Any) -> bool:
    """The driver connection can run nothing more (closed, or lost to the server)."""
    return bool(raw.closed or raw.broken)


@contextlib.contextmanager
def bounded_database_wait(alias: str = DEFAULT_DB_ALIAS) -> Iterator[DatabaseDeadline | None]:
    """Bound the time spent waiting on the database within the block (`DATABASE_WAIT_MS`)."""
    budget_ms = int(knowledge_settings.DATABASE_WAIT_MS or 0)
    if budget_ms <= 0:
        yield None
        return
    deadline = DatabaseDeadline(budget_ms / 1000, alias)
    deadline.install()
    try:
        with deadline.connection.execute_wrapper(deadline):
            yield deadline
    finally:
        deadline.uninstall()
