"""Writers of one knowledge base and switches of its language and embedder, all at once.

Upserts, re-indexes and deletions (the app's, the ORM's and the admin's) run in threads of
their own against the switches of a language (with its rebuild of every chunk's terms), of
an embedder (with its re-embedding), of a slug and a language in one transaction (as the
admin saves them), and a rebuild on its own, on the real database. None may fail, a
deadlock least of all; when they stop, every chunk is analysed in the knowledge base's
language and embedded with its embedder, and the term statistics equal a count of the
chunks.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import pytest
from django.db import connection, transaction

from bailing_knowledge import services
from bailing_knowledge.ingestion.documents import (
    delete_document,
    reindex_document,
    upsert_document,
)
from bailing_knowledge.ingestion.lexicon import rebuild_lexical_index
from bailing_knowledge.ingestion.outcomes import GONE, UpsertResult
from bailing_knowledge.models import Chunk, Document, KnowledgeBase
from bailing_knowledge.retrieval.embedders import get_embedder

from ..ingestion.test_lexicon import chunk_lexemes, counted_statistics, stored_statistics
from . import figures

HASHING = "bailing_knowledge.retrieval.embedders.HashingEmbedder"
KEYS = [f"doc-{number}.md" for number in range(8)]


class Work:
    """Threads that each repeat one kind of operation until told to stop. An operation
    returns the outcome of what it did ("" when it found nothing to do); one that raises,
    or whose outcome is `failed` for another reason than a deletion that came first, is an
    error."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.done: Counter[str] = Counter()
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def start(self, name: str, operation, seed: int) -> None:
        def loop() -> None:
            rng = random.Random(seed)
            try:
                while not self.stop.is_set():
                    try:
                        outcome = operation(rng)
                    except Exception as exc:
                        with self.lock:
                            self.errors.append(f"{name}: {type(exc).__name__}: {exc}")
                        continue
                    with self.lock:
                        if isinstance(outcome, UpsertResult) and outcome.outcome == "failed":
                            if outcome.error != GONE:
                                self.errors.append(f"{name}: failed: {outcome.error}")
                        elif outcome:
                            self.done[name] += 1
            finally:
                connection.close()

        thread = threading.Thread(target=loop, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def run_for(self, seconds: float) -> None:
        try:
            time.sleep(seconds)
        finally:
            self.stop.set()
            deadline = time.monotonic() + 120
            for thread in self.threads:
                thread.join(max(0.0, deadline - time.monotonic()))
        hanging = [thread.name for thread in self.threads if thread.is_alive()]
        assert not hanging, f"threads still running: {hanging}"


def _kb(kb_id: int) -> KnowledgeBase:
    return KnowledgeBase.objects.get(pk=kb_id)


def _upsert(kb_id: int):
    def operation(rng: random.Random) -> UpsertResult:
        words = " ".join(rng.choices(["runs", "running", "refunds", "parcels", "days"], k=60))
        return upsert_document(_kb(kb_id), rng.choice(KEYS), "Runs and refunds", words)

    return operation


def _reindex_or_delete(kb_id: int):
    def operation(rng: random.Random) -> UpsertResult | str:
        document = Document.objects.filter(source_key=rng.choice(KEYS)).first()
        if document is None:
            return ""
        choice = rng.random()
        if choice < 0.2:
            return "deleted" if delete_document(_kb(kb_id), document.source_key) else ""
        if choice < 0.3:
            Document.objects.filter(pk=document.pk).delete()  # the admin's action
            return "deleted"
        if choice < 0.4:
            document.delete()
            return "deleted"
        return reindex_document(document)

    return operation


def _switch(kb_id: int):
    def operation(rng: random.Random) -> str:
        kb = _kb(kb_id)
        choice = rng.random()
        if choice < 0.3:
            services.set_knowledge_base_language(
                kb, "simple" if kb.language == "english" else "english"
            )
        elif choice < 0.6:
            embedder = "small" if kb.embedder == "default" else "default"
            services.set_knowledge_base_embedder(kb, embedder)
        elif choice < 0.8:
            # As the admin's change form does: a new slug (a key update of the row) and a
            # new language, in one transaction.
            with transaction.atomic():
                kb.slug = "handbook-2" if kb.slug == "handbook" else "handbook"
                kb.save()
                language = "simple" if kb.language == "english" else "english"
                services.set_knowledge_base_language(kb, language)
        else:
            rebuild_lexical_index(kb)
        time.sleep(rng.uniform(0.0, 0.2))
        return "switched"

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
    work = Work()
    work.start("upsert-1", _upsert(kb.pk), 1)
    work.start("upsert-2", _upsert(kb.pk), 2)
    work.start("reindex-or-delete", _reindex_or_delete(kb.pk), 3)
    work.start("switch", _switch(kb.pk), 4)
    work.run_for(figures.scale(4, 40))

    figures.count("write_lock_operations", sum(work.done.values()))
    figures.record("write_lock_errors", len(work.errors), 0)
    assert not work.errors, "\n".join(work.errors[:5])
    assert set(work.done) == {"upsert-1", "upsert-2", "reindex-or-delete", "switch"}, work.done
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
