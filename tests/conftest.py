"""Fixtures that build real rows through the public services."""

from __future__ import annotations

import django
import pytest
from django.conf import settings
from django.db import connection
from django.utils import deprecation
from psycopg import capabilities

from bailing_knowledge import services
from tests.settings_base import start_database


@pytest.fixture(scope="session")
def database_server(django_db_modify_db_settings_parallel_suffix):
    """The test database's server, started on first need (DB-free runs start none)."""
    start_database(settings.DATABASES["default"])


@pytest.fixture(scope="session")
def django_db_modify_db_settings(database_server):
    """pytest-django's hook, run before the test database is created."""


def pytest_configure(config):
    """Fail on anything the next Django releases remove, so an upgrade finds nothing new.

    Each Django names these warnings its own way (5.2: `RemovedInDjango60Warning`; 6.1:
    `RemovedInNextVersionWarning`, `RemovedInDjango2028Warning`), so every `RemovedIn*`
    class this Django has is named.
    """
    for name in dir(deprecation):
        if name.startswith("RemovedIn") and name.endswith("Warning"):
            config.addinivalue_line("filterwarnings", f"error::django.utils.deprecation.{name}")


def pytest_report_header(config):
    """The Django under test: `make test` and `make test-django6` run different ones."""
    return f"django: {django.get_version()}"


@pytest.fixture(autouse=True)
def no_hidden_leaders_met():
    """Every test's searches start deferring their document checks (`hybrid.HybridSearch`)."""
    from bailing_knowledge.retrieval.hybrid import forget_hidden_leaders

    forget_hidden_leaders()


@pytest.fixture
def kb(db):
    return services.create_knowledge_base("handbook", title="Handbook")


@pytest.fixture
def route(kb):
    return services.create_route("orders", name="Order assistant", knowledge_bases=[kb])


@pytest.fixture
def agent_client(route):
    return services.create_client("acme-agent", name="Acme agent", routes=[route])


@pytest.fixture
def issued(agent_client, route):
    return services.issue_session(
        agent_client,
        principal_id="user-1",
        tenant="acme",
        roles=["support"],
        audience="staff",
        routes=[route],
    )


@pytest.fixture
def prepared_statements():
    """Django's connection as a deployment without a transaction pooler may set it: parameters
    bound on the server (`server_side_binding`) and each statement prepared at its first run
    (psycopg's `prepare_threshold` 0). Yields a function that switches it on."""
    options = connection.settings_dict["OPTIONS"]
    saved = dict(options)

    def switch_on() -> None:
        connection.close()
        options.update(server_side_binding=True, prepare_threshold=0)

    yield switch_on
    connection.close()
    options.clear()
    options.update(saved)


@pytest.fixture(params=["chunked", "libpq older than 17"])
def libpq(request, monkeypatch):
    """Rows read by batches (libpq 17+), or all at once where libpq cannot."""
    if request.param != "chunked":
        monkeypatch.setattr(capabilities, "has_stream_chunked", lambda: False)
    return request.param
