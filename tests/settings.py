"""Settings for the test suite: the embedded PostgreSQL unless DATABASE_URL is set.

The embedded server starts with the first test that uses the database (tests/conftest.py):
a run of database-free tests starts none.
"""

import os

from tests.settings_base import *  # noqa: F403
from tests.settings_base import INSTALLED_APPS, ROOT, database

SECRET_KEY = "test-secret-key-for-bailing-knowledge-only-in-tests"

# The API docs pages, served as docs/installation.md shows (tests/api/test_docs_pages.py).
_APP = INSTALLED_APPS.index("bailing_knowledge")
INSTALLED_APPS = [
    *INSTALLED_APPS[:_APP],
    "drf_spectacular",
    "drf_spectacular_sidecar",
    # Django's task framework (the backport on 5.2) and its database backend's tables, for
    # the tests that queue ingestion and run `db_worker` (docs/ingestion.md).
    "django_tasks",
    "django_tasks_db",
    *INSTALLED_APPS[_APP:],
]

ROOT_URLCONF = "tests.urls"

DATABASES = {
    "default": database(
        ROOT / ".data" / "pgdata",
        lazy=True,
        CONN_MAX_AGE=0,
        TEST={"NAME": os.environ.get("BAILING_TEST_DB", "test_bailing_knowledge")},
    )
}

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# The schema behind the API docs pages.
REST_FRAMEWORK = {"DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema"}
SPECTACULAR_SETTINGS = {
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SERVE_INCLUDE_SCHEMA": False,
}
