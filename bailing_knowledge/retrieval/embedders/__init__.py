"""Embedders: named, pluggable backends that turn text into unit-length vectors.

Laid out like ``django.core.cache.backends``: the interface in `base`, one module per backend,
and the registry here. Configured like Django's ``CACHES``::

    BAILING_KNOWLEDGE = {
        "EMBEDDERS": {
            "default": {
                "BACKEND": "bailing_knowledge.retrieval.embedders.HashingEmbedder",
                "OPTIONS": {},
            },
        },
    }

`get_embedder(alias)` builds the backend named by an alias once and reuses it until the
``BAILING_KNOWLEDGE`` setting changes. The backends are re-exported here, so a ``BACKEND``
may name ``bailing_knowledge.retrieval.embedders.<Class>`` or the module that defines it:

* `HashingEmbedder` (`hashing`) — the default. No dependency, no network, no model: signed
  feature hashing of words and character n-grams. It finds documents that share words and
  word pieces with the query; it does not know synonyms.
* `WordLlamaEmbedder` (`wordllama`) — static token embeddings shipped inside the
  ``wordllama`` package (the ``wordllama`` extra): semantic, offline, a few MB.
* `OpenAIEmbedder` (`openai`) — any server that speaks the OpenAI ``/v1/embeddings`` API.
* `SentenceTransformerEmbedder` (`sentence_transformers`) — a local sentence-transformers
  model (the ``sentence-transformers`` extra).

Every failure of a backend at embedding time is an `EmbedderError`, so that the caller can
degrade to lexical search; configuration mistakes are ``ImproperlyConfigured``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from ...conf import SETTINGS_NAME, knowledge_settings
from .base import MAX_DIMENSIONS, BaseEmbedder, EmbedderError
from .hashing import HashingEmbedder
from .openai import OpenAIEmbedder
from .sentence_transformers import SentenceTransformerEmbedder
from .wordllama import WordLlamaEmbedder

__all__ = [
    "MAX_DIMENSIONS",
    "BaseEmbedder",
    "EmbedderError",
    "HashingEmbedder",
    "OpenAIEmbedder",
    "SentenceTransformerEmbedder",
    "WordLlamaEmbedder",
    "backend_class",
    "check_embedder",
    "get_embedder",
]

#: The keys an entry of ``EMBEDDERS`` may have.
ENTRY_KEYS = frozenset({"BACKEND", "OPTIONS", "FUSION_WEIGHT"})
#: `FUSION_WEIGHT` bounds: 0 turns the vector leg's ranking off; 10 is already "vector only".
MAX_FUSION_WEIGHT = 10

_embedders: dict[str, BaseEmbedder] = {}
_embedders_lock = threading.Lock()


def _entry(alias: str) -> Mapping[str, Any]:
    where = f"{SETTINGS_NAME}['EMBEDDERS']"
    configured = knowledge_settings.EMBEDDERS
    if not isinstance(configured, Mapping):
        raise ImproperlyConfigured(f"{where} must be a dict of aliases.")
    if alias not in configured:
        known = ", ".join(repr(name) for name in sorted(configured)) or "none"
        raise ImproperlyConfigured(f"Unknown embedder {alias!r}: {where} configures {known}.")
    config = configured[alias]
    where = f"{where}[{alias!r}]"
    if not isinstance(config, Mapping) or not isinstance(config.get("BACKEND"), str):
        raise ImproperlyConfigured(f"{where} must be a dict with a 'BACKEND' dotted path.")
    extra = sorted(set(config) - ENTRY_KEYS)
    if extra:
        raise ImproperlyConfigured(f"{where}: unknown key(s) {', '.join(extra)}.")
    return config


def backend_class(alias: str) -> type[BaseEmbedder]:
    """The backend class an alias names, imported but not built (no model is loaded).

    Raises ``ImproperlyConfigured`` for an unknown alias, a malformed entry or a ``BACKEND``
    that cannot be imported or is not a `BaseEmbedder`.
    """
    config = _entry(alias)
    backend = knowledge_settings.import_from(config["BACKEND"])
    if not (isinstance(backend, type) and issubclass(backend, BaseEmbedder)):
        raise ImproperlyConfigured(
            f"{SETTINGS_NAME}['EMBEDDERS'][{alias!r}]['BACKEND'] must name a BaseEmbedder subclass."
        )
    return backend


def _fusion_weight(alias: str, config: Mapping[str, Any]) -> float | None:
    weight = config.get("FUSION_WEIGHT")
    if weight is not None and (
        isinstance(weight, bool)
        or not isinstance(weight, int | float)
        or not 0 <= weight <= MAX_FUSION_WEIGHT
    ):
        raise ImproperlyConfigured(
            f"{SETTINGS_NAME}['EMBEDDERS'][{alias!r}]['FUSION_WEIGHT'] must be a number from 0 "
            f"to {MAX_FUSION_WEIGHT}."
        )
    return None if weight is None else float(weight)


def _build(alias: str) -> BaseEmbedder:
    config = _entry(alias)
    weight = _fusion_weight(alias, config)
    embedder = backend_class(alias)(alias, config.get("OPTIONS") or {})
    if weight is not None:
        embedder.fusion_weight = weight
    return embedder


def check_embedder(alias: str) -> None:
    """Raise ``ImproperlyConfigured`` for a bad entry, as its first use would.

    For the system checks: the entry is built and closed again, except for a backend that
    loads a model when built (its option names are checked, its values at first use) or
    whose optional package is missing (a check of its own reports that).
    """
    config = _entry(alias)
    _fusion_weight(alias, config)
    backend = backend_class(alias)
    if backend.missing_requirement():
        return
    options = config.get("OPTIONS") or {}
    if backend.loads_model:
        if not isinstance(options, Mapping):
            raise ImproperlyConfigured(
                f"{SETTINGS_NAME}['EMBEDDERS'][{alias!r}]['OPTIONS'] must be a dict."
            )
        backend.check_option_names(alias, options)
    else:
        _build(alias).close()


def get_embedder(alias: str = "default") -> BaseEmbedder:
    """Return the embedder configured under `alias`, built on first use and then shared.

    Raises ``ImproperlyConfigured`` for an alias that is not configured or a bad entry. The
    instance is shared by all threads of the process and dropped when the ``BAILING_KNOWLEDGE``
    setting changes.
    """
    embedder = _embedders.get(alias)
    if embedder is not None:
        return embedder
    with _embedders_lock:
        embedder = _embedders.get(alias)
        if embedder is None:
            embedder = _embedders[alias] = _build(alias)
    return embedder


def _reset(*, setting: str, **kwargs: Any) -> None:
    if setting != SETTINGS_NAME:
        return
    with _embedders_lock:
        dropped = list(_embedders.values())
        _embedders.clear()
    for embedder in dropped:
        embedder.close()


setting_changed.connect(_reset)
