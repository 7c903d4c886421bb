"""The agent API over a real HTTP connection to a live server on 127.0.0.1."""

from __future__ import annotations

import httpx
import pytest

from bailing_knowledge import services

pytestmark = pytest.mark.django_db(transaction=True)


def test_capabilities_and_denials_over_http(live_server):
    kb = services.create_knowledge_base("handbook")
    route = services.create_route("orders", knowledge_bases=[kb])
    client = services.create_client("acme-agent", routes=[route])
    issued = services.issue_session(client, principal_id="u", routes=[route])
    url = f"{live_server.url}/agent-api/v1/workspaces/orders/knowledge/capabilities"
    with httpx.Client(timeout=10) as http:
        ok = http.get(url, headers={"Authorization": f"Bearer {issued.access_token}"})
        assert ok.status_code == 200
        assert ok.headers["cache-control"] == "no-store"
        assert ok.json()["route"] == "orders"

        denied = http.get(url)
        assert denied.status_code == 401
        assert denied.headers["www-authenticate"].startswith("Bearer")
        assert denied.headers["cache-control"] == "no-store"
        assert denied.json()["error"] == "unauthorized"

        services.revoke_session(issued.session)
        revoked = http.get(url, headers={"Authorization": f"Bearer {issued.access_token}"})
        assert revoked.status_code == 401
