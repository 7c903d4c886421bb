"""The `BAILING_KNOWLEDGE` settings dict, read lazily with defaults.

Every attribute is looked up on access, so `override_settings(BAILING_KNOWLEDGE=...)` works in
tests without reloading modules. Protocol limits are not settings: see `constants.py`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

SETTINGS_NAME = "BAILING_KNOWLEDGE"

DEFAULTS: dict[str, Any] = {
    # Lifetime of an agent session issued without an explicit lifetime, in seconds.
    "SESSION_DEFAULT_LIFETIME": 8 * 3600,
    # Upper bound for any session lifetime, in seconds.
    "SESSION_MAX_LIFETIME": 30 * 24 * 3600,
    # A session's `last_seen_at` is written at most this often, in seconds.
    "SESSION_LAST_SEEN_INTERVAL": 60,
    # Path prefix under which the app's URLs are mounted; responses there get `no-store`.
    "URL_PREFIX": "/agent-api/",
    # DRF-style rates ("120/min"); None disables that throttle.
    "THROTTLE_RATES": {"session": "120/min", "client": "600/min"},
    # Cache alias used by the throttles.
    "THROTTLE_CACHE": "default",
    # Chunking: target chunk length and overlap between neighbours, in characters.
    "CHUNK_TARGET_CHARS": 1000,
    "CHUNK_OVERLAP_CHARS": 150,
    # Search: candidates fetched per leg before fusion and validation.
    "SEARCH_CANDIDATES": 40,
    # Vector-leg neighbours less similar than this (cosine similarity) are not candidates.
    "SEARCH_MIN_SIMILARITY": 0.2,
    # HNSW ef_search for the vector leg (recall/latency trade-off); 128 makes up for the
    # sparser half-precision index (docs/performance.md).
    "SEARCH_EF_SEARCH": 128,
    # BM25 term-frequency saturation and length normalisation of the lexical leg
    # (docs/retrieval.md has the measurements behind the defaults).
    "SEARCH_BM25_K1": 1.2,
    "SEARCH_BM25_B": 0.5,
    # Chunks the lexical leg reads at most per search, heaviest first. Past them it answers
    # with the best found instead of proving its top 10 exact: fewer cut the tail latency
    # of searches over large corpora and leave more of their top 10s inexact. At 1,500 the
    # ranking is as good as at 2,000 or unbounded; at 1,000 it loses a little at 1M chunks
    # (docs/performance.md, "The read budget").
    "SEARCH_LEXICAL_READ_BUDGET": 1500,
    # The lexical leg stops reading once no unread chunk could score more than this many
    # times its 10th best score. 1.0 proves the top 10 exact; 1.5 reads far less at 1M
    # chunks and ranks as well (docs/performance.md, "Stopping early").
    "SEARCH_LEXICAL_PRUNING": 1.5,
    # A token's next search on a route has its opening statements sent behind the token's
    # check, composed from what its last search there searched, and used only if the checked
    # search would send exactly them (docs/security.md). False: every search waits for the
    # token.
    "SEARCH_SEND_AHEAD": True,
    # Upper bound for one search's SQL, in milliseconds (0 disables it).
    "SEARCH_STATEMENT_TIMEOUT_MS": 2000,
    # Request bodies: the largest accepted, in bytes, and the deepest nesting of arrays and
    # objects. Larger or deeper bodies are refused with 400 `invalid_request`.
    "MAX_BODY_BYTES": 1024 * 1024,
    "MAX_JSON_DEPTH": 32,
    # Upper bound, in milliseconds, of the time one agent request waits on PostgreSQL
    # (connecting, queries, lock waits); past it the answer is 503 `knowledge_unavailable`
    # and the connection is dropped. 0 disables it.
    "DATABASE_WAIT_MS": 2500,
    # Upper bound (bytes, JSON-escaped) of the bodies an inline turn carries in `knowledge`.
    "INLINE_MAX_BYTES": 24000,
    # Callable adding instructions, memory, governance or tools to a turn's context:
    # `hook(run=..., session=..., route=..., request=...) -> dict`.
    "TURN_CONTEXT_HOOK": None,
    # Named embedders, configured like CACHES.
    "EMBEDDERS": {
        "default": {
            "BACKEND": "bailing_knowledge.retrieval.embedders.HashingEmbedder",
            "OPTIONS": {},
        },
    },
}


def nearest_name(name: str, known: Iterable[str]) -> str | None:
    """The known name closest to a mistyped one, if any is close enough to suggest."""
    by_folded = {candidate.casefold(): candidate for candidate in known}
    matches = difflib.get_close_matches(name.casefold(), sorted(by_folded), n=1, cutoff=0.6)
    return by_folded[matches[0]] if matches else None


class KnowledgeSettings:
    """Attribute access to `settings.BAILING_KNOWLEDGE` merged over `DEFAULTS`."""

    def __init__(self) -> None:
        self._cache: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"Unknown {SETTINGS_NAME} setting: {name!r}")
        if name not in self._cache:
            user = getattr(settings, SETTINGS_NAME, None) or {}
            if not isinstance(user, dict):
                raise ImproperlyConfigured(f"{SETTINGS_NAME} must be a dict.")
            self._cache[name] = user.get(name, DEFAULTS[name])
        return self._cache[name]

    def import_from(self, dotted_path: str) -> Any:
        """Import a class named in settings, failing loudly with the setting's name."""
        try:
            return import_string(dotted_path)
        except ImportError as exc:
            raise ImproperlyConfigured(
                f"{SETTINGS_NAME}: cannot import {dotted_path!r}: {exc}"
            ) from exc

    def reload(self) -> None:
        self._cache.clear()


knowledge_settings = KnowledgeSettings()


def _reload(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTINGS_NAME:
        knowledge_settings.reload()


setting_changed.connect(_reload)


def check_embedder_alias(alias: str) -> None:
    """Refuse, as a field error on `embedder`, an alias that `EMBEDDERS` does not configure.

    For input (a KB's embedder chosen by a person or a script): the alias must exist before a
    KB points at it. Whether its entry builds is the embedders' own check.
    """
    if alias not in knowledge_settings.EMBEDDERS:
        known = ", ".join(sorted(knowledge_settings.EMBEDDERS))
        raise ValidationError({"embedder": f"Unknown embedder {alias!r} (configured: {known})."})
