"""Writers of one knowledge base and switches of its language and embedder, all at once.

Upserts, re-indexes and deletions run in threads of their own against the switches of a
language (with its rebuild of every chunk's terms) and of an embedder (with its re-embedding),
and a rebuild on its own, on the real database. None may fail, a deadlock least of all; when
they stop, every chunk is analysed in the knowledge base's language and embedded with its
embedder, and the term statistics equal a count of the chunks.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
from django.db import connection

from bailing_knowledge import services
from bailing_knowledge.ingestion.documents import (
    delete_document,
    reindex_document,
    upsert_document,
)
from bailing_knowledge.ingestion.lexicon import rebuild_lexical_index
from bailing_knowledge.models import Chunk, Document, KnowledgeBase
from bailing_knowledge.retrieval.embedders import get_embedder

from ..ingestion.test_lexicon import chunk_lexemes, counted_statistics, stored_statistics
from . import figures

HASHING = "bailing_knowledge.retrieval.embedders.HashingEmbedder"
KEYS = [f"doc-{number}.md" for number in range(8)]


class Work:
    """Threads that each repeat one kind of operation until told to stop."""

    def __init__(self, slug: str) -> None:
        self.slug = slug
        self.stop = threading.Event()
        self.done = 0
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def start(self, name: str, operation, seed: int) -> None:
        def loop() -> None:
            rng = random.Random(seed)
            try:
                while not self.stop.is_set():
                    try:
                        operation(rng)
                    except Exception as exc:
                        with self.lock:
                            self.errors.append(f"{name}: {type(exc).__name__}: {exc}")
                    else:
                        with self.lock:
                            self.done += 1
            finally:
                connection.close()

        thread = threading.Thread(target=loop, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def run_for(self, seconds: float) -> None:
        time.sleep(seconds)
        self.stop.set()
        for thread in self.threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in self.threads), "a thread hangs"


def _upsert(slug: str):
    def operation(rng: random.Random) -> None:
        words = " ".join(rng.choices(["runs", "running", "refunds", "parcels", "days"], k=60))
        upsert_document(slug, rng.choice(KEYS), "Runs and refunds", words)

    return operation


def _reindex_or_delete(slug: str):
    def operation(rng: random.Random) -> None:
        document = Document.objects.filter(source_key=rng.choice(KEYS)).first()
        if document is None:
            return
        if rng.random() < 0.3:
            delete_document(slug, document.source_key)
        else:
            reindex_document(document)

    return operation


def _switch(slug: str):
    def operation(rng: random.Random) -> None:
        kb = KnowledgeBase.objects.get(slug=slug)
        choice = rng.random()
        if choice < 0.4:
            language = "simple" if kb.language == "english" else "english"
            services.set_knowledge_base_language(kb, language)
        elif choice < 0.8:
            services.set_knowledge_base_embedder(
                kb, "small" if kb.embedder == "default" else "default"
            )
        else:
            rebuild_lexical_index(kb)
        time.sleep(rng.uniform(0.0, 0.2))

    return operation


@pytest.mark.django_db(transaction=True)
def test_writers_and_switches_at_once_never_fail_nor_leave_stale_chunks(settings):
    settings.BAILING_KNOWLEDGE = {
        "EMBEDDERS": {
            "default": {"BACKEND": HASHING},
            "small": {"BACKEND": HASHING, "OPTIONS": {"DIMENSIONS": 64}},
        }
    }
    kb = services.create_knowledge_base("handbook")
    for key in KEYS:
        upsert_document(kb, key, "Runs", "She runs every morning. " * 40)
    work = Work(kb.slug)
    work.start("upsert-1", _upsert(kb.slug), 1)
    work.start("upsert-2", _upsert(kb.slug), 2)
    work.start("reindex-or-delete", _reindex_or_delete(kb.slug), 3)
    work.start("switch", _switch(kb.slug), 4)
    work.run_for(figures.scale(4, 40))

    figures.count("write_lock_operations", work.done)
    figures.record("write_lock_errors", len(work.errors), 0)
    assert not work.errors, "\n".join(work.errors[:5])
    kb.refresh_from_db()
    dimensions = get_embedder(kb.embedder).dimensions
    stale = Chunk.objects.filter(knowledge_base=kb).exclude(embedding_dimensions=dimensions)
    figures.record("write_lock_stale_vectors", stale.count(), 0)
    assert not stale.exists()
    written = chunk_lexemes(kb)
    rebuild_lexical_index(kb)
    figures.record("write_lock_stale_terms", int(chunk_lexemes(kb) != written), 0)
    assert chunk_lexemes(kb) == written  # every chunk already in the KB's language
    assert stored_statistics(kb) == counted_statistics(kb)
