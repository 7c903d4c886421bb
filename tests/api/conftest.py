"""Helpers for calling the agent API the way an agent does."""

from __future__ import annotations

import json

import pytest
from django.test import Client as DjangoClient

from bailing_knowledge import services

BASE = "/agent-api/v1"

# Every agent endpoint: (method, path template, JSON body). Later endpoints join this list so
# that the authorization matrix covers them too.
AGENT_ENDPOINTS = [
    ("get", "/workspaces/{route}/knowledge/capabilities", None),
    ("post", "/workspaces/{route}/knowledge/search", {"query": "refund"}),
    ("post", "/workspaces/{route}/knowledge/read", {"ref": "placeholder"}),
    (
        "post",
        "/workspaces/{route}/turns",
        {
            "client_conversation_id": "c",
            "client_turn_id": "t",
            "user_message_id": "m",
            "user_input": "refund",
        },
    ),
]


class AgentCaller:
    """A Django test client that speaks the agent API: bearer token, JSON bodies."""

    def __init__(self, token: str | None = None) -> None:
        self.http = DjangoClient()
        self.token = token

    def call(self, method: str, path: str, body=None, *, headers=None, token=...):
        token = self.token if token is ... else token
        extra = dict(headers or {})
        if token is not None:
            extra.setdefault("Authorization", f"Bearer {token}")
        kwargs = {"headers": extra}
        if body is not None:
            kwargs["data"] = json.dumps(body)
            kwargs["content_type"] = "application/json"
        return getattr(self.http, method)(BASE + path, **kwargs)

    def get(self, path: str, **kwargs):
        return self.call("get", path, **kwargs)

    def post(self, path: str, body=None, **kwargs):
        return self.call("post", path, body, **kwargs)


@pytest.fixture
def agent(issued):
    return AgentCaller(issued.access_token)


@pytest.fixture
def anonymous(db):
    return AgentCaller(None)


def assert_error(response, status: int, code: str, *secrets: str) -> dict:
    """The response is our error envelope with `no-store`, and leaks none of `secrets`."""
    assert response.status_code == status, response.content
    assert response["Cache-Control"] == "no-store"
    assert response["Content-Type"].startswith("application/json")
    body = json.loads(response.content)
    assert body["error"] == code
    assert isinstance(body["reason"], str) and body["reason"]
    assert set(body) <= {"error", "reason", "fields"}
    raw = response.content.decode("utf-8") + str(response.headers)
    for secret in secrets:
        if secret:
            assert secret not in raw
    return body


@pytest.fixture
def second_route(kb, agent_client):
    route = services.create_route("billing", knowledge_bases=[kb])
    services.update_client(agent_client, routes=["orders", "billing"])
    return route
