"""What a file library logs while one file loads, kept with that file.

pypdf logs what it repaired or could not read ("EOF marker not found") on loggers of its own,
without the file's name: among the lines of an ingest of many files, such a line names
nothing. While a file loads, the records its thread logs there are collected instead, for the
loader to put in its failure or to log again under the file's name. Records logged by other
threads meanwhile go on to the root logger's handlers, as they would have.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_local = threading.local()
_lock = threading.Lock()


class _Collector(logging.Handler):
    """Placed on a library's logger while any thread loads a file; keeps that logger's
    `propagate`, which it turns off meanwhile, to pass other threads' records on."""

    def __init__(self, propagate: bool) -> None:
        super().__init__()
        self.propagate = propagate
        self.users = 0

    def emit(self, record: logging.LogRecord) -> None:
        collected: list[logging.LogRecord] | None = getattr(_local, "records", None)
        if collected is not None:
            collected.append(record)
        elif self.propagate:
            logging.getLogger().handle(record)


_collectors: dict[str, _Collector] = {}


@contextmanager
def collected_records(logger_name: str) -> Iterator[list[logging.LogRecord]]:
    """Within: what this thread logs on `logger_name` (and the loggers below it) is appended
    to the list yielded instead of reaching the root logger's handlers."""
    logger = logging.getLogger(logger_name)
    with _lock:
        collector = _collectors.get(logger_name)
        if collector is None:
            collector = _collectors[logger_name] = _Collector(logger.propagate)
            logger.addHandler(collector)
            logger.propagate = False
        collector.users += 1
    records: list[logging.LogRecord] = []
    outer = getattr(_local, "records", None)
    _local.records = records
    try:
        yield records
    finally:
        _local.records = outer
        with _lock:
            collector.users -= 1
            if not collector.users:
                del _collectors[logger_name]
                logger.removeHandler(collector)
                logger.propagate = collector.propagate


def distinct_messages(records: list[logging.LogRecord], limit: int = 3) -> list[str]:
    """The first `limit` different messages of `records`, each once: a damaged file can make
    a library log one complaint thousands of times."""
    messages: list[str] = []
    for record in records:
        message = " ".join(record.getMessage().split())[:200]
        if message not in messages:
            messages.append(message)
            if len(messages) == limit:
                break
    return messages
