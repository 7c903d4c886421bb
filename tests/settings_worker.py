"""The test settings with the database task backend: what `db_worker` runs with in
tests/ingestion/test_worker.py (the test process queues with the same backend)."""

from tests.settings import *  # noqa: F403
from tests.settings import BAILING_KNOWLEDGE

TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}

# A second embedder, of another vector size, for the queued embedder switch: the test
# process, which queues the switch, uses these settings too.
HASHING = "bailing_knowledge.retrieval.embedders.HashingEmbedder"
BAILING_KNOWLEDGE = {
    **BAILING_KNOWLEDGE,
    "EMBEDDERS": {
        "default": {"BACKEND": HASHING},
        "small": {"BACKEND": HASHING, "OPTIONS": {"DIMENSIONS": 64}},
    },
}
