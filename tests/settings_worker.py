"""The test settings with the database task backend: what `db_worker` runs with in
tests/ingestion/test_worker.py (the test process queues with the same backend)."""

from tests.settings import *  # noqa: F403

TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
