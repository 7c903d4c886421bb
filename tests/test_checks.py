"""System checks report misconfiguration with stable ids."""

from __future__ import annotations

import pytest
from django.test import override_settings

from bailing_knowledge.checks import check_connect_timeout, check_database, check_settings

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
