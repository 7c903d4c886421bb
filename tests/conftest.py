"""Fixtures that build real rows through the public services."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.utils import deprecation

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

    Django 5.2 warns of what 6.0 and 6.1 remove; the classes come and go with releases, so
    only those this Django has are named.
    """
    for name in (
        "RemovedInDjango60Warning",
        "RemovedInDjango61Warning",
        "RemovedInDjango70Warning",
    ):
        if hasattr(deprecation, name):
            config.addinivalue_line("filterwarnings", f"error::django.utils.deprecation.{name}")


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
