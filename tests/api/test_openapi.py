"""The published OpenAPI schema is valid and its examples are what the server answers."""

from __future__ import annotations

import json
import re
from unittest import mock

import pytest
from django.db import OperationalError
from django.urls import include, path
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.validation import validate_schema

from bailing_knowledge import services

from .conftest import AgentCaller

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def schema():
    generator = SchemaGenerator(
        patterns=[path("agent-api/v1/", include("bailing_knowledge.urls"))],
        title="Agent knowledge API",
    )
    document = generator.get_schema(request=None, public=True)
    return json.loads(json.dumps(document, default=str))


def test_schema_validates(schema):
    validate_schema(schema)
    assert "/agent-api/v1/workspaces/{route}/knowledge/capabilities" in schema["paths"]
    assert schema["components"]["securitySchemes"]["agentBearer"]["scheme"] == "bearer"


def _examples(schema):
    for url, item in schema["paths"].items():
        for method, operation in item.items():
            for status, response in operation["responses"].items():
                media = response.get("content", {}).get("application/json", {})
                for name, example in media.get("examples", {}).items():
                    yield url, method, int(status), name, example["value"]


def _provoke(status, code, route_key, issued, settings):
    """Make the server answer `status` with `code` on the capabilities endpoint."""
    url = f"/workspaces/{route_key}/knowledge/capabilities"
    caller = AgentCaller(issued.access_token)
    if code == "unauthorized":
        return AgentCaller(None).get(url)
    if code == "route_not_allowed":
        return caller.get("/workspaces/elsewhere/knowledge/capabilities")
    if code == "rate_limited":
        from django.core.cache import cache

        cache.clear()
        settings.BAILING_KNOWLEDGE = {"THROTTLE_RATES": {"session": "1/min"}}
        caller.get(url)
        return caller.get(url)
    if code == "knowledge_unavailable":
        with mock.patch(
            "bailing_knowledge.services.capabilities.knowledge_available",
            side_effect=OperationalError("down"),
        ):
            return caller.get(url)
    return caller.get(url)


def test_every_documented_example_is_what_the_server_returns(schema, settings):
    kb = services.create_knowledge_base("handbook")
    route = services.create_route("order-assistant", knowledge_bases=[kb])
    client = services.create_client("acme-agent", routes=[route])
    issued = services.issue_session(client, principal_id="u", routes=[route])
    examples = list(_examples(schema))
    assert {status for *_, status, _, _ in examples} >= {200, 401, 403, 429, 503}
    for _url, _method, status, _name, value in examples:
        code = value.get("error")
        response = _provoke(status, code, route.route_key, issued, settings)
        settings.BAILING_KNOWLEDGE = {}
        assert response.status_code == status
        actual = json.loads(response.content)
        if status == 200:
            # The only value that depends on the database: its format is documented.
            assert re.fullmatch(r"ksr_[0-9a-f]{32}", actual.pop("knowledge_scope_revision"))
            value = {k: v for k, v in value.items() if k != "knowledge_scope_revision"}
        assert actual == value
