"""Library log records copied for the file being loaded."""

import logging
import threading

from bailing_knowledge.ingestion.library_log import collected_records, distinct_messages


def test_the_loading_thread_gets_a_copy_and_the_logger_is_left_as_it_was(caplog):
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
    # Every record still reaches the host's handlers, once.
    assert [r.getMessage() for r in caplog.records] == [
        "repaired xref",
        "from another thread",
        "inner",
        "after",
    ]
    assert logging.getLogger("somelib").propagate


def test_a_logging_config_that_replaced_the_handler_is_caught_up_with():
    logger = logging.getLogger("configured_lib")
    with collected_records("configured_lib"):
        pass
    logger.handlers.clear()  # what `logging.config.dictConfig` does to a logger it configures
    with collected_records("configured_lib") as records:
        logger.warning("seen")
    assert [r.getMessage() for r in records] == ["seen"]


def test_distinct_messages_keeps_the_first_few_different_ones():
    records = [
        logging.makeLogRecord({"msg": text})
        for text in ["a  b", "a b", "c", "d\nd", "e", "f" * 300]
    ]
    assert distinct_messages(records) == ["a b", "c", "d d"]
    assert distinct_messages(records, limit=10)[-1] == "f" * 200
