"""Re-ingest the fault server's documents in a loop: `python -m tests.faults.reingest SECONDS`.

Each round stores every document under a new version, so every round changes every
document's revision while the fault tests search and read.
"""

from __future__ import annotations

import os
import sys
import time


def main(seconds: float) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.faults.settings")
    import django

    django.setup()
    from bailing_knowledge.ingestion.documents import upsert_document
    from bailing_knowledge.models import KnowledgeBase

    from .serve import documents

    kb = KnowledgeBase.objects.get(slug="handbook")
    version, rounds = 1, 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for key, title, body in documents(version):
            upsert_document(kb, key, title, body)
        version += 1
        rounds += 1
    print(f"ROUNDS {rounds}", flush=True)


if __name__ == "__main__":
    main(float(sys.argv[1]))
