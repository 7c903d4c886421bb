"""Django settings for the benchmarks: their own embedded PostgreSQL, never the tests' one.

The embedded server lives in `.data/bench-pgdata` (or `DATABASE_URL` / `BAILING_PGDATA`, as
everywhere else). The benchmark databases have their own names (`bench_10k`, `bench_100k`,
`bench_quality`, ...): the scripts switch between them with `benchmarks.common.use_database`.
Connections are persistent with health checks, and the middleware stack is the example
project's, as in a real deployment. The server gets the `shared_buffers` a database server
is usually given, a quarter of the machine's memory (at least the embedded default of 1 GB),
unless `BAILING_PG_SHARED_BUFFERS` says otherwise: at a million chunks the HNSW and GIN
indexes alone outgrow 1 GB. The rest comes from `tests.settings_base`.
"""

import os

from bailing_knowledge.embedded import DEFAULT_SHARED_BUFFERS, SHARED_BUFFERS_ENV
from tests.settings_base import *  # noqa: F403
from tests.settings_base import MIDDLEWARE, ROOT, database


def _quarter_of_memory() -> str:
    """A quarter of the physical memory in MB, at least the embedded server's default (which
    is also the answer where the OS does not say)."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return DEFAULT_SHARED_BUFFERS
    return f"{max(total // 4 // 2**20, 1024)}MB"  # DEFAULT_SHARED_BUFFERS is 1GB


os.environ.setdefault(SHARED_BUFFERS_ENV, _quarter_of_memory())

SECRET_KEY = "benchmark-secret-key-not-for-production"  # noqa: S105
ROOT_URLCONF = "benchmarks.urls"

# The example project's middleware stack: every request pays for it.
MIDDLEWARE = [*MIDDLEWARE, "django.middleware.clickjacking.XFrameOptionsMiddleware"]

DATABASES = {
    "default": database(
        ROOT / ".data" / "bench-pgdata",
        CONN_MAX_AGE=60,
        CONN_HEALTH_CHECKS=True,
    )
}
DATABASES["default"]["NAME"] = "bench_100k"

# `BAILING_BENCH_PREPARE=N`: bind parameters on the server and prepare a statement from its
# Nth run (psycopg's `prepare_threshold`), as a deployment without a transaction pooler may;
# the raw SQL sides do the same (`benchmarks.common.raw_connection`).
if _prepare := os.environ.get("BAILING_BENCH_PREPARE", "").strip():
    DATABASES["default"]["OPTIONS"].update(
        server_side_binding=True, prepare_threshold=int(_prepare)
    )
