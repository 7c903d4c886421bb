"""Property-based fuzzing over the published OpenAPI schema, against the live server.

Bodies the schema accepts must not be refused as `invalid_request`, bodies it refuses must
be, and every answer is one the schema documents for the operation, in the documented shape.
The only refusals the schema cannot express are the body-wide rules (no NUL character) and
the 16 KB bound of `page_context` as JSON; the test names them.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import jsonschema
import pytest
from django.urls import include, path
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from . import figures

PREFIX = "/agent-api/v1"
OPERATIONS = {
    "search": "/workspaces/{route}/knowledge/search",
    "read": "/workspaces/{route}/knowledge/read",
    "turns": "/workspaces/{route}/turns",
    "complete": "/runs/{run_id}/complete",
}
# Refusals of schema-valid bodies that JSON Schema cannot express.
UNEXPRESSED = ("NUL character", "Must be at most 16384 bytes of JSON.")


def _openapi() -> dict:
    generator = SchemaGenerator(
        patterns=[path("agent-api/v1/", include("bailing_knowledge.urls"))], title="Agent API"
    )
    return json.loads(json.dumps(generator.get_schema(request=None, public=True), default=str))


def _json_schema(node: Any, components: dict) -> Any:
    """An OpenAPI 3.0 schema as plain JSON Schema: refs inlined, `nullable` spelled out."""
    if isinstance(node, list):
        return [_json_schema(item, components) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _json_schema(components[node["$ref"].rsplit("/", 1)[1]], components)
    converted = {
        key: _json_schema(value, components)
        for key, value in node.items()
        if key not in {"nullable", "description", "default", "readOnly", "writeOnly"}
    }
    if node.get("nullable") and "type" in converted:
        return {"anyOf": [converted, {"type": "null"}]}
    return converted


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=5,
)


def from_schema(schema: dict) -> st.SearchStrategy:
    """Values the JSON Schema accepts, for the keywords the request schemas use."""
    if "anyOf" in schema:
        return st.one_of([from_schema(option) for option in schema["anyOf"]])
    if "allOf" in schema:
        (only,) = schema["allOf"]
        return from_schema(only)
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind is None:
        return JSON_VALUES
    if kind == "string":
        low, high = schema.get("minLength", 0), schema.get("maxLength", 300)
        text = st.text(min_size=low, max_size=min(high, low + 300))
        if "pattern" in schema:
            pattern = re.compile(schema["pattern"])
            matching = st.from_regex(pattern).filter(lambda s: low <= len(s) <= high)
            text = matching | text.filter(pattern.search)
        return text
    if kind == "integer":
        return st.integers(schema.get("minimum"), schema.get("maximum"))
    if kind == "array":
        return st.lists(
            from_schema(schema["items"]),
            max_size=min(schema.get("maxItems", 5), 5),
            unique=schema.get("uniqueItems", False),
        )
    if kind == "object":
        properties = schema.get("properties")
        if properties is None:
            return st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=4)
        required = set(schema.get("required", ()))

        def build(present: dict, chosen: list[str]) -> dict:
            return {k: v for k, v in present.items() if k in required or k in chosen}

        return st.builds(
            build,
            st.fixed_dictionaries({name: from_schema(sub) for name, sub in properties.items()}),
            st.lists(st.sampled_from(sorted(properties)), unique=True),
        )
    raise AssertionError(f"no strategy for {schema}")


class Operation:
    def __init__(self, openapi: dict, name: str) -> None:
        components = openapi["components"]["schemas"]
        item = openapi["paths"][PREFIX + OPERATIONS[name]]["post"]
        media = item["requestBody"]["content"]["application/json"]["schema"]
        self.name = name
        self.body_schema = _json_schema(media, components)
        self.validator = jsonschema.Draft7Validator(self.body_schema)
        self.responses = {
            int(status): _json_schema(response["content"]["application/json"]["schema"], components)
            for status, response in item["responses"].items()
        }
        self.url = OPERATIONS[name].replace("{route}", "orders").replace("{run_id}", "run_x")


@pytest.fixture(scope="module")
def operations() -> dict[str, Operation]:
    openapi = _openapi()
    return {name: Operation(openapi, name) for name in OPERATIONS}


class Tally:
    requests = server_errors = mismatches = 0


TALLY = Tally()


def _check(server, http: httpx.Client, operation: Operation, body: Any) -> None:
    valid = operation.validator.is_valid(body)
    response = http.post(server.url + operation.url, json=body)
    TALLY.requests += 1
    TALLY.server_errors += response.status_code >= 500
    assert response.status_code < 500, (operation.name, body, response.text)
    assert response.status_code in operation.responses, (operation.name, response.status_code)
    answer = response.json()
    jsonschema.validate(answer, operation.responses[response.status_code])
    refused = response.status_code == 400 and answer["error"] == "invalid_request"
    if valid and refused:
        explained = any(text in json.dumps(answer) for text in UNEXPRESSED)
        if not explained:
            TALLY.mismatches += 1
        assert explained, ("the schema accepts what the server refuses", body, answer)
    if not valid and not refused:
        TALLY.mismatches += 1
        raise AssertionError(("the schema refuses what the server accepts", body, answer))


def _mutated(operation: Operation) -> st.SearchStrategy:
    """A schema-valid body with one field replaced, dropped or added; or not an object."""
    names = [*sorted(operation.body_schema["properties"]), "unexpected", "client_id"]

    def mutate(body: dict, name: str, value: Any, drop: bool) -> Any:
        body = dict(body)
        if drop:
            body.pop(name, None)
        else:
            body[name] = value
        return body

    return st.builds(
        mutate,
        from_schema(operation.body_schema),
        st.sampled_from(names),
        JSON_VALUES,
        st.booleans(),
    ) | JSON_VALUES.filter(lambda value: not isinstance(value, dict))


EXAMPLES = figures.scale(25, 300)


def _fuzz(fault_server, operation, bodies) -> None:
    """Send every body `bodies` draws to `operation` and check each answer (`_check`)."""
    headers = {"Authorization": f"Bearer {fault_server.token}"}
    with httpx.Client(timeout=30, headers=headers) as http:

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(body=bodies)
        def run(body):
            _check(fault_server, http, operation, body)

        run()


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_bodies_the_schema_accepts_are_not_refused(fault_server, operations, name):
    operation = operations[name]
    _fuzz(fault_server, operation, from_schema(operation.body_schema))


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_bodies_the_schema_refuses_are_refused(fault_server, operations, name):
    operation = operations[name]
    _fuzz(fault_server, operation, _mutated(operation))


def test_schema_fuzz_figures():
    """Runs after the fuzz tests of this module: their figures, in one place."""
    figures.count("schema_fuzz_requests", TALLY.requests)
    figures.record("schema_fuzz_5xx", TALLY.server_errors, 0)
    assert figures.record("schema_fuzz_mismatches", TALLY.mismatches, 0)
