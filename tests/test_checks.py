"""System checks report misconfiguration with stable ids."""

from __future__ import annotations

import pytest
from django.core import checks
from django.test import override_settings

from bailing_knowledge.checks import check_connect_timeout, check_database, check_settings
from bailing_knowledge.retrieval.embedders import BaseEmbedder

pytestmark = pytest.mark.django_db


def _ids(messages):
    return {m.id for m in messages}


def test_the_test_settings_pass():
    assert check_settings() == []
    assert check_database(databases=["default"]) == []


def test_settings_must_be_a_dict():
    with override_settings(BAILING_KNOWLEDGE=["nope"]):
        assert "bailing_knowledge.E001" in _ids(check_settings())


def test_embedders_need_a_default_alias():
    with override_settings(BAILING_KNOWLEDGE={"EMBEDDERS": {"other": {}}}):
        assert "bailing_knowledge.E003" in _ids(check_settings())


@pytest.mark.parametrize(
    "overrides",
    [
        {"SEARCH_BM25_K1": -1},
        {"SEARCH_BM25_K1": float("inf")},
        {"SEARCH_BM25_K1": "1.2"},
        {"SEARCH_BM25_B": 1.5},
        {"SEARCH_BM25_B": float("nan")},
        {"SEARCH_BM25_B": True},
    ],
)
def test_bm25_parameters_must_be_in_range(overrides):
    with override_settings(BAILING_KNOWLEDGE=overrides):
        assert "bailing_knowledge.E006" in _ids(check_settings())


def test_bm25_parameters_at_their_bounds_pass():
    with override_settings(BAILING_KNOWLEDGE={"SEARCH_BM25_K1": 0, "SEARCH_BM25_B": 1}):
        assert check_settings() == []


def test_contrib_postgres_is_required(settings):
    settings.INSTALLED_APPS = [a for a in settings.INSTALLED_APPS if a != "django.contrib.postgres"]
    assert "bailing_knowledge.E005" in _ids(check_settings())


def test_missing_no_store_middleware_is_a_warning(settings):
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "NoStore" not in m]
    assert "bailing_knowledge.W001" in _ids(check_settings())


@pytest.mark.parametrize("timeout", [None, 5, "nope", 0])
def test_a_connect_timeout_beyond_the_wait_budget_is_a_warning(settings, timeout):
    options = {} if timeout is None else {"connect_timeout": timeout}
    database = {"ENGINE": "django.db.backends.postgresql", "OPTIONS": options}
    assert _ids(check_connect_timeout(database)) == {"bailing_knowledge.W002"}
    settings.BAILING_KNOWLEDGE = {"DATABASE_WAIT_MS": 0}
    assert check_connect_timeout(database) == []


def test_a_connect_timeout_within_the_budget_passes():
    options = {"connect_timeout": "2"}
    assert (
        check_connect_timeout({"ENGINE": "django.db.backends.postgresql", "OPTIONS": options}) == []
    )


def test_an_embedder_that_cannot_be_imported_fails_the_start_up():
    with override_settings(
        BAILING_KNOWLEDGE={"EMBEDDERS": {"default": {"BACKEND": "no.such.Embedder"}}}
    ):
        [error] = check_settings()
    assert error.id == "bailing_knowledge.E007"
    assert "no.such.Embedder" in error.msg


def _messages(overrides):
    with override_settings(BAILING_KNOWLEDGE=overrides):
        return check_settings()


def test_a_mistyped_key_is_refused_with_the_nearest_name():
    messages = _messages({"SESION_DEFAULT_LIFETIME": 60})
    assert [(m.id, m.hint) for m in messages] == [
        ("bailing_knowledge.E010", "Did you mean 'SESSION_DEFAULT_LIFETIME'?")
    ]
    far = _messages({"COMPLETELY_DIFFERENT": 1})
    assert _ids(far) == {"bailing_knowledge.E010"}
    assert "configuration.md" in far[0].hint


def test_the_removed_task_runner_setting_says_what_to_do():
    messages = _messages({"TASK_RUNNER": "myproject.tasks.enqueue"})
    assert [(m.id, m.level) for m in messages] == [("bailing_knowledge.W003", checks.WARNING)]
    assert "TASKS" in messages[0].hint and "db_worker" in messages[0].hint


def test_the_removed_common_term_cap_is_a_warning_not_an_error():
    # An error would stop `migrate` on upgrade for a key that now changes nothing.
    messages = _messages({"SEARCH_COMMON_TERM_CHUNKS": 5000})
    assert [(m.id, m.level) for m in messages] == [("bailing_knowledge.W003", checks.WARNING)]
    assert "remove the key" in messages[0].hint


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"THROTTLE_RATES": {"session": "lots"}}, "'120/min'"),
        ({"THROTTLE_RATES": {"session": "0/min"}}, "N/period"),
        ({"THROTTLE_RATES": {"sesion": "10/min"}}, "did you mean 'session'"),
        ({"THROTTLE_RATES": "120/min"}, "a dict"),
        ({"THROTTLE_CACHE": "redis"}, "CACHES aliases"),
        ({"SESSION_DEFAULT_LIFETIME": "8h"}, "integer"),
        ({"SESSION_DEFAULT_LIFETIME": 7200, "SESSION_MAX_LIFETIME": 3600}, "may not exceed"),
        ({"SEARCH_STATEMENT_TIMEOUT_MS": -1}, "from 0 to 2147483647"),
        ({"SEARCH_SEND_AHEAD": "yes"}, "True or False"),
        ({"SEARCH_STATEMENT_TIMEOUT_MS": 2.5}, "from 0 to 2147483647"),
        # Past PostgreSQL's integer every search would fail with 503, not wait longer.
        ({"SEARCH_STATEMENT_TIMEOUT_MS": 2**31}, "from 0 to 2147483647"),
        ({"DATABASE_WAIT_MS": 10**15}, "from 0 to 2147483647"),
        # Past ten years an expiry date overflows, and every request would answer 500.
        ({"SESSION_LAST_SEEN_INTERVAL": 10**20}, "from 0 to 315360000"),
        ({"SESSION_MAX_LIFETIME": 10**15}, "from 1 to 315360000"),
        ({"SEARCH_EF_SEARCH": 5000}, "from 1 to 1000"),
        ({"SEARCH_MIN_SIMILARITY": 2}, "from -1.0 to 1.0"),
        ({"SEARCH_CANDIDATES": 0}, "from 1 to 1000"),
        ({"SEARCH_LEXICAL_READ_BUDGET": 0}, "from 1 to 2147483647"),
        ({"SEARCH_LEXICAL_READ_BUDGET": "2000"}, "from 1 to 2147483647"),
        ({"SEARCH_LEXICAL_PRUNING": 0.9}, "from 1.0 to 10.0"),
        ({"SEARCH_LEXICAL_PRUNING": "1.5"}, "from 1.0 to 10.0"),
        ({"CHUNK_TARGET_CHARS": 10}, "integer ≥ 50"),
        ({"CHUNK_TARGET_CHARS": 200, "CHUNK_OVERLAP_CHARS": 100}, "half"),
        ({"URL_PREFIX": "agent-api"}, "starts and ends with '/'"),
        ({"TURN_CONTEXT_HOOK": "no.such.module.run"}, "cannot be imported"),
        ({"TURN_CONTEXT_HOOK": "bailing_knowledge.conf.SETTINGS_NAME"}, "not callable"),
        ({"INLINE_MAX_BYTES": None}, "integer"),
    ],
)
def test_invalid_values_are_refused_at_check_time(overrides, words):
    messages = _messages(overrides)
    assert _ids(messages) == {"bailing_knowledge.E011"}, messages
    assert words in messages[0].msg


class ModelLoadingEmbedder(BaseEmbedder):
    """Stands for a backend that loads a model when built: the checks must not build it."""

    option_names = frozenset({"MODEL", "BATCH_SIZE"})
    loads_model = True

    def __init__(self, *args, **kwargs):
        raise AssertionError("a system check loaded a model")


def test_a_model_loading_embedder_is_not_built_by_the_checks():
    entry = {"BACKEND": "tests.test_checks.ModelLoadingEmbedder", "OPTIONS": {"MODEL": "x"}}
    assert _messages({"EMBEDDERS": {"default": entry}}) == []


@pytest.mark.parametrize(
    ("embedders", "words"),
    [
        ({"default": {"BACKEND": "no.such.Embedder"}}, "cannot import"),
        ({"default": {"BACKEND": "bailing_knowledge.conf.KnowledgeSettings"}}, "subclass"),
        (
            {
                "default": {
                    "BACKEND": "bailing_knowledge.retrieval.embedders.HashingEmbedder",
                    "OPTIONS": {"DIMENSION": 384},
                }
            },
            "Did you mean 'DIMENSIONS'?",
        ),
        (
            {
                "default": {
                    "BACKEND": "bailing_knowledge.retrieval.embedders.OpenAIEmbedder",
                    "OPTIONS": {"MODEL": "m", "TIMEOUT": -1},
                }
            },
            "TIMEOUT",
        ),
        (
            {
                "default": {"BACKEND": "bailing_knowledge.retrieval.embedders.HashingEmbedder"},
                "local": {
                    "BACKEND": "tests.test_checks.ModelLoadingEmbedder",
                    "OPTIONS": {"MODEL": "x", "BATCHSIZE": 8},
                },
            },
            "Did you mean 'BATCH_SIZE'?",
        ),
    ],
)
def test_embedder_entries_are_checked_without_loading_a_model(embedders, words):
    messages = _messages({"EMBEDDERS": embedders})
    assert _ids(messages) == {"bailing_knowledge.E007"}, messages
    assert words in messages[0].msg


@pytest.mark.parametrize("alias", [1, None, "", "x" * 65])
def test_an_embedder_alias_that_no_knowledge_base_could_store_is_refused(alias):
    hashing = {"BACKEND": "bailing_knowledge.retrieval.embedders.HashingEmbedder"}
    messages = _messages({"EMBEDDERS": {"default": hashing, alias: hashing}})
    assert _ids(messages) == {"bailing_knowledge.E007"}, messages
    assert "1 to 64 characters" in messages[0].msg


def test_the_issue_example_fails_check_instead_of_every_request(tmp_path):
    messages = _messages({"SESION_DEFAULT_LIFETIME": 60, "THROTTLE_RATES": {"session": "lots"}})
    assert _ids(messages) == {"bailing_knowledge.E010", "bailing_knowledge.E011"}


def test_every_key_has_a_validator():
    from bailing_knowledge.checks import VALIDATORS
    from bailing_knowledge.conf import DEFAULTS

    assert set(VALIDATORS) == set(DEFAULTS)
    assert _messages(dict(DEFAULTS)) == []


def test_a_database_in_another_encoding_than_utf8_is_refused():
    """References count characters, as `substr` does only in a UTF-8 database."""
    import uuid

    import psycopg
    from django.db import connection
    from django.db.backends.postgresql.base import DatabaseWrapper
    from psycopg import sql

    from bailing_knowledge.database import database_problems

    name = f"bk_encoding_{uuid.uuid4().hex[:12]}"
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    admin = psycopg.connect(**params, autocommit=True)
    try:
        admin.execute(
            sql.SQL(
                "CREATE DATABASE {} ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' "
                "TEMPLATE template0"
            ).format(sql.Identifier(name))
        )
        other = DatabaseWrapper({**connection.settings_dict, "NAME": name})
        try:
            problems = database_problems(other)
        finally:
            other.close()
        assert any("SQL_ASCII encoding" in problem for problem in problems), problems
        assert not any("encoding" in problem for problem in database_problems(connection))
    finally:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        admin.close()


@pytest.mark.django_db
def test_pgvector_older_than_0_8_is_refused_with_how_to_upgrade(monkeypatch):
    """The vector leg sets `hnsw.iterative_scan` (pgvector 0.8); older versions reserve the
    `hnsw.` prefix without that setting, so every search's opening statements would fail."""
    from django.db import DatabaseError, connection, transaction

    from bailing_knowledge import database

    assert database.MIN_PGVECTOR_VERSION == (0, 8)
    with connection.cursor() as cursor:  # what an older pgvector would answer
        cursor.execute("SELECT '[1,2]'::vector")  # the extension's library, loaded
        with pytest.raises(DatabaseError, match="reserved prefix"), transaction.atomic():
            cursor.execute("SELECT set_config('hnsw.no_such_setting', 'on', true)")
    monkeypatch.setattr(database, "MIN_PGVECTOR_VERSION", (99, 0))
    monkeypatch.setattr(database, "_MIN_PGVECTOR", "99.0")
    problems = database.database_problems(connection)
    assert any(
        problem.endswith(
            "is too old; bailing_knowledge needs >= 99.0. Install a newer pgvector on the "
            "server, then run ALTER EXTENSION vector UPDATE; in the database."
        )
        for problem in problems
    ), problems
