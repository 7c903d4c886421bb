"""A live agent API for the fault tests: `python -m tests.faults.serve PORT`.

Runs on the database named by `DATABASE_URL` (a server of the test's own, which the test may
freeze or restart): migrates it, creates a route, a client, a session and a few documents,
prints one `READY <json>` line, then serves HTTP on 127.0.0.1:PORT with a thread per
connection until it is terminated.
"""

from __future__ import annotations

import json
import os
import sys


def main(port: int) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.faults.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.core.servers.basehttp import WSGIServer, run
    from django.core.wsgi import get_wsgi_application
    from django.db import connections

    from bailing_knowledge import services
    from bailing_knowledge.ingestion.documents import upsert_document

    call_command("migrate", verbosity=0)
    kb = services.create_knowledge_base("handbook")
    route = services.create_route("orders", knowledge_bases=[kb])
    client = services.create_client("fault-agent", routes=[route])
    issued = services.issue_session(client, principal_id="u", routes=[route])
    for number in range(5):
        upsert_document(
            kb,
            f"refunds-{number}.md",
            f"Refunds {number}",
            f"# Refunds {number}\n\n" + "Refunds are paid within five business days. " * 40,
        )
    connections.close_all()
    print("READY " + json.dumps({"token": issued.access_token}), flush=True)
    WSGIServer.request_queue_size = 64
    run("127.0.0.1", port, get_wsgi_application(), threading=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
