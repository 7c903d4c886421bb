"""Library log records kept with the file being loaded."""

import logging
import threading

from bailing_knowledge.ingestion.library_log import collected_records, distinct_messages


def test_records_of_the_loading_thread_are_collected_and_others_pass_on(caplog):
    caplog.set_level(logging.WARNING)
    library = logging.getLogger("somelib.reader")
    with collected_records("somelib") as records:
        library.warning("repaired %s", "xref")
        other = threading.Thread(target=library.warning, args=("from another thread",))
        other.start()
        other.join()
        with collected_records("somelib") as inner:  # nested: the inner list takes them
            library.warning("inner")
    library.warning("after")
    assert [r.getMessage() for r in records] == ["repaired xref"]
    assert [r.getMessage() for r in inner] == ["inner"]
    assert [r.getMessage() for r in caplog.records] == ["from another thread", "after"]
    assert logging.getLogger("somelib").propagate
    assert not logging.getLogger("somelib").handlers


def test_a_logger_that_did_not_propagate_still_does_not(caplog):
    caplog.set_level(logging.WARNING)
    logger = logging.getLogger("quietlib")
    logger.propagate = False
    try:
        with collected_records("quietlib"):
            other = threading.Thread(target=logger.warning, args=("elsewhere",))
            other.start()
            other.join()
        assert not caplog.records
        assert logger.propagate is False
    finally:
        logger.propagate = True


def test_distinct_messages_keeps_the_first_few_different_ones():
    records = [
        logging.makeLogRecord({"msg": text})
        for text in ["a  b", "a b", "c", "d\nd", "e", "f" * 300]
    ]
    assert distinct_messages(records) == ["a b", "c", "d d"]
    assert distinct_messages(records, limit=10)[-1] == "f" * 200
