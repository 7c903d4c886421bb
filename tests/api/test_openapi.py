"""The published OpenAPI schema is valid and its examples are what the server answers."""

from __future__ import annotations

import json
import re
import time
from unittest import mock

import pytest
from django.core.cache import cache
from django.db import OperationalError, transaction
from django.urls import include, path
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.validation import validate_schema

from bailing_knowledge import services
from bailing_knowledge.ingestion.documents import upsert_document
from bailing_knowledge.models import Route, Run
from bailing_knowledge.services.tasks import create_task, pause_task, task_scope_hash

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


# As docs/installation.md and the example project set them.
ENUM_NAME_OVERRIDES = {
    "SearchStatusEnum": "bailing_knowledge.constants.SEARCH_STATUSES",
    "RunEndStateEnum": "bailing_knowledge.constants.RUN_END_STATES",
    "KnowledgeDeliveryEnum": "bailing_knowledge.constants.DELIVERY_MODES",
}


def test_the_documented_enum_names_leave_the_schema_without_warnings():
    """`manage.py spectacular --fail-on-warn` passes with them: every choice set has one name."""
    from drf_spectacular.drainage import GENERATOR_STATS
    from drf_spectacular.settings import spectacular_settings

    def generate(overrides):
        GENERATOR_STATS.reset()
        with mock.patch.object(spectacular_settings, "ENUM_NAME_OVERRIDES", overrides):
            _clear_enum_cache()
            try:
                document = SchemaGenerator(
                    patterns=[path("agent-api/v1/", include("bailing_knowledge.urls"))]
                ).get_schema(request=None, public=True)
            finally:
                _clear_enum_cache()
        warned = dict(GENERATOR_STATS._warn_cache)
        GENERATOR_STATS.reset()
        return document, warned

    _, warned = generate({})
    assert any("ENUM_NAME_OVERRIDES" in message for message in warned)  # what they fix
    document, warned = generate(ENUM_NAME_OVERRIDES)
    assert warned == {}
    enums = document["components"]["schemas"]
    assert enums["SearchStatusEnum"]["enum"] == ["ok", "disabled", "partial", "unavailable"]
    assert enums["RunEndStateEnum"]["enum"] == ["completed", "failed", "cancelled"]
    assert enums["KnowledgeDeliveryEnum"]["enum"] == ["inline", "on_demand"]


def _clear_enum_cache():
    from drf_spectacular import plumbing

    plumbing._load_enum_name_overrides.cache_clear()


def _examples(schema):
    for url, item in schema["paths"].items():
        for method, operation in item.items():
            for status, response in operation["responses"].items():
                media = response.get("content", {}).get("application/json", {})
                for name, example in media.get("examples", {}).items():
                    yield url, method, int(status), name, example["value"]


class Provoker:
    """Makes the server give each documented answer, on real rows, leaving no trace."""

    def __init__(self, settings):
        self.settings = settings
        self.kb = services.create_knowledge_base("handbook")
        self.route = services.create_route("order-assistant", knowledge_bases=[self.kb])
        self.client = services.create_client("acme-agent", routes=[self.route])
        self.issued = services.issue_session(self.client, principal_id="u", routes=[self.route])
        self.caller = AgentCaller(self.issued.access_token)
        upsert_document(self.kb, "refunds.md", "Refunds", "Refunds take five days.")
        self.run = self._new_run()
        self.turns = 0

    def _new_run(self):
        self.runs = getattr(self, "runs", 0) + 1
        return Run.objects.create(
            session=self.issued.session,
            client=self.client,
            route=self.route,
            client_conversation_id="c",
            client_turn_id=f"t{self.runs}",
            user_message_id="m",
            request_hash="0" * 64,
            state=Run.State.CONTEXT_READY,
        )

    def _ref(self, run_id=None):
        body = {"query": "refunds"} | ({"run_id": run_id} if run_id else {})
        response = self.caller.post("/workspaces/order-assistant/knowledge/search", body)
        return json.loads(response.content)["hints"][0]["ref"]

    def _turn(self):
        self.turns += 1
        return {
            "client_conversation_id": "c",
            "client_turn_id": f"turn-{self.turns}",
            "user_message_id": "m",
            "user_input": "refunds",
        }

    def request(self, path):
        """A valid `(url, body)` for the endpoint at `path`."""
        url = path.removeprefix("/agent-api/v1").replace("{route}", "order-assistant")
        if "{run_id}" in url:
            url = url.replace("{run_id}", self._new_run().run_id)
            return url, {"assistant_message_id": "a", "content": "Done."}
        if url.endswith("/search"):
            return url, {"query": "refunds"}
        if url.endswith("/read"):
            return url, {"ref": self._ref()}
        if url.endswith("/turns"):
            return url, self._turn()
        return url, None

    def provoke(self, path, method, code):
        url, body = self.request(path)
        call = self.caller.call
        if code == "unauthorized":
            return AgentCaller(None).call(method, url, body)
        if code == "route_not_allowed":
            if "/runs/" in url:
                return self._rolled_back(
                    lambda: services.set_route_enabled(self.route, False),
                    lambda: call(method, url, body),
                )
            return call(method, url.replace("order-assistant", "elsewhere"), body)
        if code == "not_found":
            # A route key that is not a slug, or an empty run id, matches no endpoint.
            if "/runs/" in url:
                return call(method, "/runs//complete", body)
            return call(method, url.replace("order-assistant", "order assistant"), body)
        if code == "invalid_request":
            return call(method, url, {"unexpected": True})
        if code == "knowledge_reference_invalid":
            return call(method, url, {"ref": "AAAA"})
        if code == "knowledge_reference_expired":
            later = time.time() + 301
            with mock.patch("bailing_knowledge.services.read.time.time", return_value=later):
                return call(method, url, body)
        if code == "rate_limited":
            cache.clear()
            self.settings.BAILING_KNOWLEDGE = {"THROTTLE_RATES": {"session": "1/min"}}
            call(method, url, body)
            response = call(method, url, body)
            self.settings.BAILING_KNOWLEDGE = {}
            return response
        if code == "knowledge_unavailable":
            # Every endpoint derives the route's scope revision from the database.
            with mock.patch.object(
                Route, "knowledge_configuration", side_effect=OperationalError("down")
            ):
                if "/runs/" in url:
                    with mock.patch(
                        "bailing_knowledge.services.turns.canonical_hash",
                        side_effect=OperationalError("down"),
                    ):
                        return call(method, url, body)
                return call(method, url, body)
        if code == "idempotency_conflict":
            call(method, url, body)
            changed = {**body, "content" if "/runs/" in url else "user_input": "Changed."}
            return call(method, url, changed)
        if code == "run_not_current":
            if "/runs/" in url:
                return call(method, "/runs/run_unknown/complete", body)
            if url.endswith("/turns"):
                task = create_task("Paused", members=[self.issued.session])
                pause_task(task)
                binding = {
                    "schema_version": "bailing.agent-task-binding.v1",
                    "task_id": task.task_id,
                    "scope_hash": task_scope_hash(task),
                }
                return call(method, url, {**body, "task_binding": binding})
            body = {**body, "run_id": self.run.run_id}
            if url.endswith("read"):
                body["ref"] = self._ref(self.run.run_id)
            return self._rolled_back(self._complete_run, lambda: call(method, url, body))
        changes = {
            "knowledge_scope_changed": lambda: services.update_route(self.route, top_k=9),
            "knowledge_changed": lambda: upsert_document(self.kb, "refunds.md", "R", "New."),
        }
        if code in changes:
            return self._rolled_back(changes[code], lambda: call(method, url, body))
        return call(method, url, body)

    @staticmethod
    def _rolled_back(change, request):
        with transaction.atomic():
            change()
            response = request()
            transaction.set_rollback(True)
        return response

    def _complete_run(self):
        Run.objects.filter(pk=self.run.pk).update(state=Run.State.COMPLETED)


def test_every_documented_example_is_what_the_server_returns(schema, settings):
    provoker = Provoker(settings)
    examples = list(_examples(schema))
    assert {status for *_, status, _, _ in examples} >= {200, 400, 401, 403, 409, 410, 429, 503}
    for url, method, status, name, value in examples:
        cache.clear()
        response = provoker.provoke(url, method, value.get("error"))
        assert response.status_code == status, (url, name, response.content)
        actual = json.loads(response.content)
        if status == 200:
            # The only value that depends on the database: its format is documented.
            assert re.fullmatch(r"ksr_[0-9a-f]{32}", actual.pop("knowledge_scope_revision"))
            value = {k: v for k, v in value.items() if k != "knowledge_scope_revision"}
        assert actual == value, (url, name)


def test_the_schema_refuses_what_the_server_refuses(schema):
    components = schema["components"]["schemas"]
    non_empty = [
        ("SearchRequest", "query"),
        ("SearchRequest", "run_id"),
        ("ReadRequest", "ref"),
        ("ReadRequest", "cursor"),
        ("ReadRequest", "run_id"),
        ("CompleteRequest", "assistant_message_id"),
        ("TurnRequest", "client_turn_id"),
    ]
    for component, field in non_empty:
        assert components[component]["properties"][field]["minLength"] == 1, (component, field)
    assert components["SearchRequest"]["properties"]["query"]["pattern"] == r"\S"
    page_context = components["TurnRequest"]["properties"]["page_context"]
    assert page_context["type"] == "object" and not page_context.get("nullable")
    for name in ["SearchRequest", "ReadRequest", "TurnRequest", "CompleteRequest", "TaskBinding"]:
        assert components[name]["additionalProperties"] is False, name
    for url, item in schema["paths"].items():
        for operation in item.values():
            assert "404" in operation["responses"], url
