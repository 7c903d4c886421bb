"""What a file library logs while one file loads, kept with that file.

pypdf says why it cannot read a file ("EOF marker not found") on loggers of its own, without
the file's name, then raises an error whose message says less. While a file loads, a handler
on the library's logger copies the records the loading thread logs there, for the loader to
put in its failure. Nothing else about the logger changes: its records reach the host's
handlers as they always did. The handler stays once added (removing it while another thread
logs could make that thread skip a handler), and copies nothing outside a load.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_local = threading.local()
_lock = threading.Lock()


class _Copier(logging.Handler):
    """Copies the records of the threads inside `collected_records` into their lists."""

    def emit(self, record: logging.LogRecord) -> None:
        collected: list[logging.LogRecord] | None = getattr(_local, "records", None)
        if collected is not None:
            collected.append(record)


_COPIER = _Copier()


@contextmanager
def collected_records(logger_name: str) -> Iterator[list[logging.LogRecord]]:
    """Within: a copy of each record this thread logs on `logger_name` (and the loggers
    below it) is appended to the list yielded."""
    logger = logging.getLogger(logger_name)
    with _lock:
        if _COPIER not in logger.handlers:  # first use, or a logging config replaced it
            logger.addHandler(_COPIER)
    records: list[logging.LogRecord] = []
    outer = getattr(_local, "records", None)
    _local.records = records
    try:
        yield records
    finally:
        _local.records = outer


def distinct_messages(records: list[logging.LogRecord], limit: int = 3) -> list[str]:
    """The first `limit` different messages of `records`, each once and on one line: a
    damaged file can make a library log one complaint thousands of times."""
    messages: list[str] = []
    for record in records:
        message = " ".join(record.getMessage().split())[:200]
        if message not in messages:
            messages.append(message)
            if len(messages) == limit:
                break
    return messages
