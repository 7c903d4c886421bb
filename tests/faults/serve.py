"""A live agent API for the fault tests: `python -m tests.faults.serve PORT`.

Runs on the database named by `DATABASE_URL` (a server of the test's own, which the test may
freeze or restart): migrates it, creates a route, a client, a session and a few documents,
prints one `READY <json>` line, then serves HTTP on 127.0.0.1:PORT with a thread per
connection until it is terminated.
"""

from __future__ import annotations

import json
import os
import socket
import sys


def documents(version: int) -> list[tuple[str, str, str]]:
    """The served documents at `version`: every version mentions refunds everywhere."""
    docs = [
        (
            f"refunds-{number}.md",
            f"Refunds {number}",
            f"# Refunds {number} v{version}\n\n"
            + f"Refunds are paid within {version + 5} business days. " * 40,
        )
        for number in range(5)
    ]
    sections = "".join(
        f"## Section {n} v{version}\n\nRefunds policy clause {n}, edition {version}. " * 20 + "\n\n"
        for n in range(40)
    )
    docs.append(("policy.md", "Refund policy", f"# Refund policy\n\n{sections}"))
    return docs


def _server_class() -> type:
    from django.core.servers.basehttp import WSGIServer

    class Server(WSGIServer):
        request_queue_size = 64

        def get_request(self):  # type: ignore[no-untyped-def]
            # wsgiref writes the headers and the body apart: without TCP_NODELAY each
            # answer on a kept-alive connection waits for the client's delayed ACK.
            conn, address = super().get_request()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return conn, address

    return Server


def main(port: int) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.faults.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.core.servers.basehttp import run
    from django.core.wsgi import get_wsgi_application
    from django.db import connections

    from bailing_knowledge import services
    from bailing_knowledge.ingestion.documents import upsert_document

    call_command("migrate", verbosity=0)
    kb = services.create_knowledge_base("handbook")
    route = services.create_route("orders", knowledge_bases=[kb])
    client = services.create_client("fault-agent", routes=[route])
    issued = services.issue_session(client, principal_id="u", routes=[route])
    # A second identity on a second route: the owner of the foreign refs.
    other_route = services.create_route("billing", knowledge_bases=[kb])
    other_client = services.create_client("other-agent", routes=[other_route])
    other = services.issue_session(other_client, principal_id="v", routes=[other_route])
    for key, title, body in documents(0):
        upsert_document(kb, key, title, body)
    connections.close_all()
    tokens = {"token": issued.access_token, "other_token": other.access_token}
    print("READY " + json.dumps(tokens), flush=True)
    run("127.0.0.1", port, get_wsgi_application(), threading=True, server_cls=_server_class())


if __name__ == "__main__":
    main(int(sys.argv[1]))
