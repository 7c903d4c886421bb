"""Settings of the example project: a host system that mounts bailing_knowledge.

SECRET_KEY and DATABASE_URL come from the environment. Without DATABASE_URL the project
starts the embedded PostgreSQL (with pgvector) in `.data/pgdata` at the repository root.
"""

import os
from pathlib import Path

from bailing_knowledge.embedded import database_settings, database_url

BASE_DIR = Path(__file__).resolve().parent.parent
REPO_DIR = BASE_DIR.parent

# The development default is flagged by the `demo.W001` system check.
DEVELOPMENT_SECRET_KEY = "django-insecure-bailing-knowledge-example-development-only"
SECRET_KEY = os.environ.get("SECRET_KEY") or DEVELOPMENT_SECRET_KEY
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost").split(",")

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
    "demo",
]

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

ROOT_URLCONF = "example.urls"
WSGI_APPLICATION = "example.wsgi.application"

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

# Persistent connections with health checks: opening a connection per request costs more
# than the whole knowledge query.
DATABASES = {
    "default": database_settings(
        database_url(REPO_DIR / ".data" / "pgdata"),
        CONN_MAX_AGE=60,
        CONN_HEALTH_CHECKS=True,
    )
}

USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "/static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# WordLlama (the `wordllama` extra, which the `demo` and `dev` extras install): semantic
# search offline, with weights that ship inside the package. Without that extra, leave
# EMBEDDERS out to get the dependency-free hashing embedder.
BAILING_KNOWLEDGE: dict = {
    "EMBEDDERS": {
        "default": {"BACKEND": "bailing_knowledge.retrieval.embedders.WordLlamaEmbedder"},
    },
}

# The OpenAPI schema of the agent API, and a browsable UI for it. Swagger UI and ReDoc come
# from the drf-spectacular-sidecar package as static files: no CDN, so the pages work offline.
INSTALLED_APPS += ["drf_spectacular", "drf_spectacular_sidecar"]
REST_FRAMEWORK = {"DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema"}
SPECTACULAR_SETTINGS = {
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "TITLE": "Agent knowledge API",
    "DESCRIPTION": "Governed knowledge search and read for AI agents (bailing.agent-knowledge.v1).",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": "/agent-api/v1",
    # The app's choice sets, each under one name (else drf-spectacular warns).
    "ENUM_NAME_OVERRIDES": {
        "SearchStatusEnum": "bailing_knowledge.constants.SEARCH_STATUSES",
        "RunEndStateEnum": "bailing_knowledge.constants.RUN_END_STATES",
        "KnowledgeDeliveryEnum": "bailing_knowledge.constants.DELIVERY_MODES",
    },
}
