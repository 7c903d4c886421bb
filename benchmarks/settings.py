"""Django settings for the benchmarks: their own embedded PostgreSQL, never the tests' one.

The embedded server lives in `.data/bench-pgdata` (or `DATABASE_URL` / `BAILING_PGDATA`, as
everywhere else). The benchmark databases have their own names (`bench_10k`, `bench_100k`,
`bench_quality`, ...): the scripts switch between them with `benchmarks.common.use_database`.
Connections are persistent with health checks, as in the example project.
"""

from pathlib import Path

from bailing_knowledge.embedded import database_settings, database_url

ROOT = Path(__file__).resolve().parent.parent

SECRET_KEY = "benchmark-secret-key-not-for-production"  # noqa: S105
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "bailing_knowledge",
]

# The example project's middleware stack: every request pays for it.
MIDDLEWARE = [
    "bailing_knowledge.middleware.NoStoreMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "benchmarks.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {
    "default": database_settings(
        database_url(ROOT / ".data" / "bench-pgdata"),
        CONN_MAX_AGE=60,
        CONN_HEALTH_CHECKS=True,
    )
}
DATABASES["default"]["NAME"] = "bench_100k"

CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
STATIC_URL = "/static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Throttles off: the latency loops send thousands of requests per minute from one session.
BAILING_KNOWLEDGE = {"THROTTLE_RATES": {"session": None, "client": None}}
