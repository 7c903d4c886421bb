"""Embedders: named, pluggable backends that turn text into unit-length vectors.

Configured like Django's ``CACHES``::

    BAILING_KNOWLEDGE = {
        "EMBEDDERS": {
            "default": {
                "BACKEND": "bailing_knowledge.retrieval.embedders.HashingEmbedder",
                "OPTIONS": {},
            },
        },
    }

`get_embedder(alias)` builds the backend named by an alias once and reuses it until the
``BAILING_KNOWLEDGE`` setting changes. Three backends ship:

* `HashingEmbedder` — the default. No dependency, no network, no model download: signed
  feature hashing of words and character n-grams. It finds documents that share words and
  word pieces with the query; it does not know synonyms.
* `OpenAIEmbedder` — any server that speaks the OpenAI ``/v1/embeddings`` API: OpenAI
  itself, Ollama, vLLM, LiteLLM and most hosted inference services.
* `SentenceTransformerEmbedder` — a local sentence-transformers model (optional extra).

Every failure of a backend at embedding time is an `EmbedderError`, so that the caller can
degrade to lexical search; configuration mistakes are ``ImproperlyConfigured``.
"""

from __future__ import annotations

import email.utils
import hashlib
import math
import os
import random
import re
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import chain
from operator import add, sub
from typing import Any, ClassVar

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from .. import __version__
from ..conf import SETTINGS_NAME, knowledge_settings
from ..constants import INDEXED_EMBEDDING_DIMENSIONS
from .tokenization import ENGLISH_STOPWORDS, normalize, split_words_and_runs

#: pgvector's limit for the ``vector`` type.
MAX_DIMENSIONS = 16000

__all__ = [
    "BaseEmbedder",
    "EmbedderError",
    "HashingEmbedder",
    "OpenAIEmbedder",
    "SentenceTransformerEmbedder",
    "get_embedder",
]


class EmbedderError(Exception):
    """An embedder could not produce vectors (network, HTTP status, malformed answer, size).

    Messages name the embedder and what went wrong; they never contain an API key.
    """


class BaseEmbedder:
    """The interface of an embedder backend.

    A backend is built with its alias and the ``OPTIONS`` dict of its configuration entry.
    Vectors are lists of ``dimensions`` floats with unit L2 norm, so cosine distance, inner
    product and Euclidean distance rank alike, and no vector is ever all zeros (pgvector's
    cosine distance of a zero vector is NaN).
    """

    #: Option names the backend accepts; anything else is a configuration error (a typo).
    option_names: ClassVar[frozenset[str]] = frozenset()

    #: The alias under ``BAILING_KNOWLEDGE["EMBEDDERS"]`` this instance was built for.
    alias: str
    #: Length of every vector.
    dimensions: int
    #: A stable identifier of the model and of every option that changes the vectors. Two
    #: embedders with the same `model_name` produce interchangeable vectors; a change means
    #: stored vectors must be recomputed.
    model_name: str
    #: Weight of this embedder's ranking in the hybrid fusion (the lexical leg's is 1.0);
    #: `FUSION_WEIGHT` next to `BACKEND` in the settings overrides it.
    fusion_weight: ClassVar[float] = 1.0

    def __init__(self, alias: str = "default", options: Mapping[str, Any] | None = None) -> None:
        self.alias = alias
        if options is not None and not isinstance(options, Mapping):
            raise ImproperlyConfigured(f"{self._where()}['OPTIONS'] must be a dict.")
        self.options: dict[str, Any] = dict(options or {})
        unknown = sorted(set(self.options) - self.option_names)
        if unknown:
            allowed = ", ".join(sorted(self.option_names)) or "none"
            raise ImproperlyConfigured(
                f"{self._where()}: unknown option(s) {', '.join(unknown)} for "
                f"{type(self).__name__} (accepted: {allowed})."
            )

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        """Return one vector per text, in order: the vectors stored for chunks."""
        raise NotImplementedError

    def embed_query(self, text: str) -> list[float]:
        """Return the vector of a search query (some models embed queries differently)."""
        return self.embed_documents([text])[0]

    def close(self) -> None:
        """Release held resources (connections); called when the settings change."""

    def __repr__(self) -> str:
        model_name = getattr(self, "model_name", None)
        return f"<{type(self).__name__} alias={self.alias!r} model_name={model_name!r}>"

    # Option helpers: each names the exact setting that is wrong.

    def _where(self, option: str | None = None) -> str:
        where = f"{SETTINGS_NAME}['EMBEDDERS'][{self.alias!r}]"
        return f"{where}['OPTIONS'][{option!r}]" if option else where

    def _int_option(self, name: str, default: int, low: int, high: int) -> int:
        value = self.options.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ImproperlyConfigured(
                f"{self._where(name)} must be an integer from {low} to {high}."
            )
        return value

    def _optional_int_option(self, name: str, low: int, high: int) -> int | None:
        if self.options.get(name) is None:
            return None
        return self._int_option(name, 0, low, high)

    def _number_option(self, name: str, default: float, low: float, high: float) -> float:
        value = self.options.get(name, default)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not (low <= value <= high)
        ):
            raise ImproperlyConfigured(
                f"{self._where(name)} must be a number from {low} to {high}."
            )
        return float(value)

    def _str_option(self, name: str, default: str | None) -> str | None:
        value = self.options.get(name, default)
        if value is not None and not isinstance(value, str):
            raise ImproperlyConfigured(f"{self._where(name)} must be a string.")
        return value

    def _bool_option(self, name: str, default: bool) -> bool:
        value = self.options.get(name, default)
        if not isinstance(value, bool):
            raise ImproperlyConfigured(f"{self._where(name)} must be True or False.")
        return value

    def _required_str_option(self, name: str) -> str:
        value = self._str_option(name, None)
        if not value:
            raise ImproperlyConfigured(f"{self._where(name)} is required.")
        return value


def _unit(vector: list[float]) -> list[float]:
    norm = math.hypot(*vector)
    if not norm or not math.isfinite(norm):
        raise ValueError("vector has no direction")
    inverse = 1.0 / norm
    return [x * inverse for x in vector]


def _prefix_tag(query_prefix: str, document_prefix: str) -> str:
    """A short, stable tag for model names whose vectors depend on prompt prefixes."""
    if not query_prefix and not document_prefix:
        return ""
    digest = hashlib.blake2b(
        f"{len(query_prefix)}:{query_prefix}{document_prefix}".encode(), digest_size=4
    )
    return f":p{digest.hexdigest()}"


# --------------------------------------------------------------------------------------------
# Feature hashing


def _mix32(value: int) -> int:
    # MurmurHash3's finaliser: CRC-32 is linear, so its bits are scrambled before use.
    value ^= value >> 16
    value = (value * 0x85EBCA6B) & 0xFFFFFFFF
    value ^= value >> 13
    value = (value * 0xC2B2AE35) & 0xFFFFFFFF
    return value ^ (value >> 16)


def _slot(feature: str, seed: int, dimensions: int) -> int:
    """Bucket and sign of a feature: the bucket if the sign is +, bucket + dimensions if -."""
    value = _mix32(zlib.crc32(feature.encode("utf-8", "surrogatepass"), seed))
    return (value >> 1) % dimensions + (dimensions if value & 1 else 0)


class _Interned(dict[int, int]):
    """One shared int object per slot number, so cached tuples of slots stay small."""

    def __missing__(self, number: int) -> int:
        self[number] = number
        return number


_interned = _Interned()


# Seeds keep the feature families apart: the word "the" and the 3-gram "the" differ.
_SEED_WORD = 0x9E3779B9
_SEED_TRIGRAM = 0x7F4A7C15
_SEED_RUN = 0x2545F491
_SEED_EMPTY = 0x165667B1

# The caches below make the work per text a few C-level passes: every word's slots and
# every character or pair's slot is computed once per process (bounded: cleared when full).
_CACHE_LIMIT = 1 << 16


class _WordSlots(dict[str, tuple[int, ...]]):
    """word -> slots of the word and of its 3-grams with a space marking both ends."""

    def __init__(self, dimensions: int) -> None:
        super().__init__()
        self.dimensions = dimensions

    def __missing__(self, word: str) -> tuple[int, ...]:
        if len(self) >= _CACHE_LIMIT:
            self.clear()
        dimensions = self.dimensions
        marked = f" {word} "
        slots = self[word] = (
            _interned[_slot(word, _SEED_WORD, dimensions)],
            *(
                _interned[_slot(marked[i : i + 3], _SEED_TRIGRAM, dimensions)]
                for i in range(len(word))
            ),
        )
        return slots


class _RunSlots(dict[str, int]):
    """character or pair of characters of unspaced runs -> slot.

    Runs are joined by spaces before they are cut into pairs; a piece with a space is not a
    feature and goes to the slot past the end, which is dropped.
    """

    def __init__(self, dimensions: int) -> None:
        super().__init__()
        self.dimensions = dimensions

    def __missing__(self, gram: str) -> int:
        if len(self) >= _CACHE_LIMIT:
            self.clear()
        dimensions = self.dimensions
        slot = self[gram] = _interned[
            2 * dimensions if " " in gram else _slot(gram, _SEED_RUN, dimensions)
        ]
        return slot


class _Damping(dict[int, float]):
    """count -> 1 + ln(count): sublinear term frequency."""

    def __missing__(self, count: int) -> float:
        value = self[count] = 1.0 + math.log(count)
        return value


_damping = _Damping()


class HashingEmbedder(BaseEmbedder):
    """Deterministic feature-hashing embedder: offline, dependency-free, fast.

    Features of the normalised text (see `tokenization.normalize` and
    `tokenization.split_words_and_runs`):

    * each word of a spaced script, except English function words
      (`tokenization.ENGLISH_STOPWORDS`) when the text has other words;
    * the character 3-grams of each of those words, with a space marking both ends, so "cat"
      gives " ca", "cat", "at ": they match inflections, compounds and typos;
    * for runs of unspaced scripts (Chinese, Japanese, Thai, …): every character and every
      pair of adjacent characters.

    Each feature adds +1 or -1 to one of `dimensions` buckets; bucket and sign come from a
    hash of the feature (CRC-32 scrambled by MurmurHash3's finaliser: the same in every
    process and on every platform, unlike Python's salted ``hash()``). Repetition is damped:
    ``n`` hits on the same bucket and sign count ``1 + ln n``. The vector is then scaled to
    unit length. A text without features (empty, or only punctuation and emoji) gets one
    fixed unit vector rather than a zero vector, whose cosine distance would be NaN.

    The choices were tuned on the dev splits of NFCorpus (English) and CMRC 2018 (Chinese):
    3-grams weighted like words beat 3-grams at half weight (nDCG@10 0.176 against 0.162),
    leaving function words out added 0.014, and damping per bucket rather than per feature
    another 0.013. On the NFCorpus test split it reaches nDCG@10 0.21, against 0.30 for BM25:
    a useful second signal next to full-text search, not a replacement for a trained model.

    Option ``DIMENSIONS`` (default 384, the size the shipped HNSW index covers).
    `model_name` is ``hashing-v1-d<DIMENSIONS>``; any change to the features bumps the version.
    """

    VERSION: ClassVar[int] = 1
    option_names = frozenset({"DIMENSIONS"})
    # Far weaker than BM25 (NFCorpus nDCG@10 about 0.17 against 0.33): at 0.05 it breaks
    # near-ties and brings chunks no query word matches, without displacing better ones.
    fusion_weight: ClassVar[float] = 0.05

    def __init__(self, alias: str = "default", options: Mapping[str, Any] | None = None) -> None:
        super().__init__(alias, options)
        dimensions = self._int_option("DIMENSIONS", INDEXED_EMBEDDING_DIMENSIONS, 1, MAX_DIMENSIONS)
        self.dimensions = dimensions
        self.model_name = f"hashing-v{self.VERSION}-d{dimensions}"
        self._word_slots = _WordSlots(dimensions)
        self._run_slots = _RunSlots(dimensions)
        empty = [0.0] * dimensions
        slot = _slot("", _SEED_EMPTY, dimensions)
        empty[slot % dimensions] = -1.0 if slot >= dimensions else 1.0
        self._empty_vector = empty

    def _embed(self, text: str) -> list[float]:
        words, runs = split_words_and_runs(normalize(text))
        features: list[Iterable[int]] = []
        if words:
            content = [word for word in words if word not in ENGLISH_STOPWORDS]
            features.extend(map(self._word_slots.__getitem__, content or words))
        if runs:
            joined = " ".join(runs)
            slot_of = self._run_slots.__getitem__
            features.append(map(slot_of, joined))
            features.append(map(slot_of, map(add, joined, joined[1:])))
        dimensions = self.dimensions
        acc = [0.0] * (2 * dimensions + 1)
        damping = _damping
        for slot, count in Counter(chain.from_iterable(features)).items():
            acc[slot] += damping[count]
        vector = list(map(sub, acc[:dimensions], acc[dimensions : 2 * dimensions]))
        norm = math.hypot(*vector)
        if not norm:
            return self._empty_vector.copy()
        return list(map((1.0 / norm).__mul__, vector))

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        return list(map(self._embed, texts))

    def embed_query(self, text: str) -> list[float]:
        return self._embed(text)


# --------------------------------------------------------------------------------------------
# OpenAI-compatible HTTP API


_RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
_SECRET_PATTERNS = (
    re.compile(r"(?i)\bbearer\s+\S+"),
    re.compile(r"\bsk-[A-Za-z0-9_\-*.]{4,}"),
)


class OpenAIEmbedder(BaseEmbedder):
    """Vectors from an OpenAI-compatible ``POST {BASE_URL}/embeddings`` endpoint.

    Options:

    * ``MODEL`` (required): the model name the server knows.
    * ``BASE_URL``: default ``https://api.openai.com/v1``; Ollama is
      ``http://localhost:11434/v1``, vLLM ``http://host:8000/v1``.
    * ``DIMENSIONS``: the vector length. When set it is sent as ``dimensions`` (models such as
      ``text-embedding-3-*`` shorten their vectors on request) and every returned vector is
      checked against it. When unset, the length is learned from the first answer.
    * ``SEND_DIMENSIONS``: default ``True`` when ``DIMENSIONS`` is set; set ``False`` for
      servers or models that reject the ``dimensions`` field but whose size you want checked.
    * ``API_KEY_ENV``: name of the environment variable that holds the API key, read on each
      request. Without it (or when the variable is empty) no ``Authorization`` header is sent,
      which suits local servers.
    * ``BATCH_SIZE`` (default 64): texts per request.
    * ``TIMEOUT`` (default 30): seconds allowed for connecting and for each read.
    * ``MAX_RETRIES`` (default 3): retries after a connection error, a timeout, or HTTP 408,
      429 or 5xx (500, 502, 503, 504), with exponential backoff and jitter; a ``Retry-After``
      header is honoured up to `retry_after_max` seconds. Other HTTP errors fail at once.
    * ``QUERY_PREFIX`` / ``DOCUMENT_PREFIX`` (default empty): text put before queries and
      documents, for models trained with prompts (``"search_query: "`` for nomic-embed-text).

    Vectors are sorted by the ``index`` the server returns and scaled to unit length.
    """

    option_names = frozenset(
        {
            "MODEL",
            "BASE_URL",
            "DIMENSIONS",
            "SEND_DIMENSIONS",
            "API_KEY_ENV",
            "BATCH_SIZE",
            "TIMEOUT",
            "MAX_RETRIES",
            "QUERY_PREFIX",
            "DOCUMENT_PREFIX",
        }
    )
    default_base_url: ClassVar[str] = "https://api.openai.com/v1"
    #: Backoff before retry n (0-based) is ``min(backoff_max, backoff_base * 2**n)``, scaled
    #: by a random factor between 0.5 and 1 so that many workers do not retry in step.
    backoff_base: ClassVar[float] = 0.5
    backoff_max: ClassVar[float] = 8.0
    #: The longest ``Retry-After`` honoured, in seconds.
    retry_after_max: ClassVar[float] = 30.0

    def __init__(
        self,
        alias: str = "default",
        options: Mapping[str, Any] | None = None,
        *,
        sleep: Callable[[float], Any] = time.sleep,
    ) -> None:
        super().__init__(alias, options)
        try:
            import httpx
        except ImportError as exc:  # pragma: no cover - depends on the installed extras
            raise ImproperlyConfigured(
                f"{self._where()}: OpenAIEmbedder needs httpx: pip install 'httpx>=0.27'."
            ) from exc
        self._httpx = httpx
        self.model = self._required_str_option("MODEL")
        base_url = self._str_option("BASE_URL", self.default_base_url) or ""
        if not base_url.startswith(("http://", "https://")):
            raise ImproperlyConfigured(f"{self._where('BASE_URL')} must be an http(s) URL.")
        try:
            parsed = httpx.URL(base_url)
        except httpx.InvalidURL as exc:
            raise ImproperlyConfigured(f"{self._where('BASE_URL')} is not a valid URL.") from exc
        parsed = parsed.copy_with(path=parsed.path.rstrip("/") + "/embeddings")
        self.url = str(parsed)
        # Shown in error messages: no credentials, no query string.
        self._display_url = str(parsed.copy_with(userinfo=b"", query=None))
        self._configured_dimensions = self._optional_int_option("DIMENSIONS", 1, MAX_DIMENSIONS)
        self._discovered_dimensions: int | None = None
        self.send_dimensions = self._bool_option(
            "SEND_DIMENSIONS", self._configured_dimensions is not None
        )
        if self.send_dimensions and self._configured_dimensions is None:
            raise ImproperlyConfigured(
                f"{self._where('SEND_DIMENSIONS')} needs {self._where('DIMENSIONS')}."
            )
        self.api_key_env = self._str_option("API_KEY_ENV", None)
        self.batch_size = self._int_option("BATCH_SIZE", 64, 1, 4096)
        self.max_retries = self._int_option("MAX_RETRIES", 3, 0, 20)
        self.timeout = self._number_option("TIMEOUT", 30.0, 0.001, 3600.0)
        self.query_prefix = self._str_option("QUERY_PREFIX", "") or ""
        self.document_prefix = self._str_option("DOCUMENT_PREFIX", "") or ""
        dims = self._configured_dimensions
        self.model_name = (
            f"openai:{self.model}"
            + (f":d{dims}" if dims else "")
            + _prefix_tag(self.query_prefix, self.document_prefix)
        )
        self._sleep = sleep
        self._client = httpx.Client(
            timeout=httpx.Timeout(self.timeout),
            headers={
                "Accept": "application/json",
                "User-Agent": f"bailing-knowledge/{__version__}",
            },
        )

    @property
    def dimensions(self) -> int:  # type: ignore[override]
        """The configured size, else the size learned from the server (asked once if needed)."""
        if self._configured_dimensions is not None:
            return self._configured_dimensions
        if self._discovered_dimensions is None:
            self._embed_batch(["dimensions"])
        assert self._discovered_dimensions is not None
        return self._discovered_dimensions

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        prefix = self.document_prefix
        inputs = [prefix + text for text in texts]
        size = self.batch_size
        vectors: list[list[float]] = []
        for start in range(0, len(inputs), size):
            vectors.extend(self._embed_batch(inputs[start : start + size]))
        return vectors

    def embed_query(self, text: str) -> list[float]:
        return self._embed_batch([self.query_prefix + text])[0]

    def close(self) -> None:
        self._client.close()

    # Internals

    def _api_key(self) -> str:
        if not self.api_key_env:
            return ""
        return os.environ.get(self.api_key_env, "").strip()

    def _fail(self, message: str) -> EmbedderError:
        return EmbedderError(f"Embedder {self.alias!r} ({self._display_url}): {message}")

    def _redact(self, text: str, key: str) -> str:
        if key:
            text = text.replace(key, "***")
        for pattern in _SECRET_PATTERNS:
            text = pattern.sub("***", text)
        return text

    def _error_detail(self, response: Any, key: str) -> str:
        """A short, key-free excerpt of an error answer, for the operator's log."""
        detail: Any = None
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict):
            error = body.get("error")
            if isinstance(error, dict):
                detail = error.get("message")
            elif isinstance(error, str):
                detail = error
            detail = detail or body.get("detail") or body.get("message")
        if not isinstance(detail, str):
            detail = response.text
        # Redact before cutting, or a key cut in half would escape the redaction.
        return self._redact(" ".join(detail.split()), key)[:200]

    def _retry_after(self, response: Any) -> float | None:
        value = response.headers.get("Retry-After")
        if not value:
            return None
        try:
            seconds = float(value)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError):
                return None
            if when is None or when.tzinfo is None:
                return None
            seconds = when.timestamp() - time.time()
        if not math.isfinite(seconds):
            return None
        return min(max(seconds, 0.0), self.retry_after_max)

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        delay = min(self.backoff_max, self.backoff_base * 2**attempt)
        delay *= 0.5 + 0.5 * random.random()  # noqa: S311 (jitter, not a secret)
        if retry_after is not None:
            delay = max(delay, retry_after)
        return delay

    def _post(self, payload: dict[str, Any]) -> Any:
        httpx = self._httpx
        key = self._api_key()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        attempt = 0
        while True:
            retry_after = None
            try:
                response = self._client.post(self.url, json=payload, headers=headers)
            except httpx.TimeoutException as exc:
                problem = f"timed out after {self.timeout:g} s ({type(exc).__name__})"
            except httpx.UnsupportedProtocol as exc:
                raise self._fail("unsupported URL scheme") from exc
            except httpx.TransportError as exc:
                problem = f"connection failed ({type(exc).__name__})"
            else:
                status = response.status_code
                if 200 <= status < 300:
                    try:
                        return response.json()
                    except ValueError as exc:
                        raise self._fail(f"HTTP {status} with a body that is not JSON") from exc
                detail = self._error_detail(response, key)
                problem = f"HTTP {status}" + (f": {detail}" if detail else "")
                if status in (401, 403) and not key:
                    hint = f" (is {self.api_key_env} set?)" if self.api_key_env else ""
                    problem += f"; no API key was sent{hint}"
                if status not in _RETRY_STATUSES:
                    raise self._fail(problem)
                retry_after = self._retry_after(response)
            if attempt >= self.max_retries:
                tries = "1 attempt" if attempt == 0 else f"{attempt + 1} attempts"
                raise self._fail(f"{problem}; gave up after {tries}")
            self._sleep(self._backoff(attempt, retry_after))
            attempt += 1

    def _embed_batch(self, inputs: list[str]) -> list[list[float]]:
        if not inputs:
            return []
        # OpenAI rejects empty strings; a space embeds as "nothing" everywhere.
        payload: dict[str, Any] = {
            "model": self.model,
            "input": [text or " " for text in inputs],
        }
        if self.send_dimensions:
            payload["dimensions"] = self._configured_dimensions
        body = self._post(payload)
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list) or len(data) != len(inputs):
            got = len(data) if isinstance(data, list) else "no"
            raise self._fail(f"expected {len(inputs)} embeddings, got {got}")
        try:
            items = sorted(data, key=lambda item: item["index"])
            indices = [item["index"] for item in items]
        except (TypeError, KeyError) as exc:
            raise self._fail("embeddings without a valid 'index'") from exc
        if indices != list(range(len(inputs))):
            raise self._fail("embedding indices do not match the inputs")
        expected = self._configured_dimensions or self._discovered_dimensions
        vectors: list[list[float]] = []
        for item in items:
            vector = item.get("embedding")
            if not isinstance(vector, list) or not all(
                isinstance(x, int | float) and not isinstance(x, bool) for x in vector
            ):
                raise self._fail("an embedding is not a list of numbers")
            if expected is None:
                expected = len(vector)
            if len(vector) != expected or not vector:
                raise self._fail(f"expected {expected} dimensions, got {len(vector)}")
            try:
                vectors.append(_unit([float(x) for x in vector]))
            except ValueError as exc:
                raise self._fail("an embedding is zero or not finite") from exc
        if self._discovered_dimensions is None and self._configured_dimensions is None:
            self._discovered_dimensions = expected
        return vectors


# --------------------------------------------------------------------------------------------
# sentence-transformers


class SentenceTransformerEmbedder(BaseEmbedder):
    """Vectors from a local sentence-transformers model (``pip install sentence-transformers``).

    Options: ``MODEL`` (required; a model name to download or a local path), ``DEVICE``
    (``"cpu"``, ``"cuda"``…; default: the library's choice), ``BATCH_SIZE`` (default 32),
    ``NORMALIZE`` (default ``True``: unit-length vectors; ``False`` keeps the model's own
    lengths, which cosine search ignores), ``QUERY_PREFIX`` / ``DOCUMENT_PREFIX`` (default
    empty; e.g. ``"query: "`` and ``"passage: "`` for the E5 family).

    The model loads when the embedder is first requested; a model that cannot be loaded is an
    `EmbedderError`, a missing package is ``ImproperlyConfigured``.
    """

    option_names = frozenset(
        {"MODEL", "DEVICE", "BATCH_SIZE", "NORMALIZE", "QUERY_PREFIX", "DOCUMENT_PREFIX"}
    )

    def __init__(self, alias: str = "default", options: Mapping[str, Any] | None = None) -> None:
        super().__init__(alias, options)
        model = self._required_str_option("MODEL")
        device = self._str_option("DEVICE", None)
        self.batch_size = self._int_option("BATCH_SIZE", 32, 1, 4096)
        self.normalize = self._bool_option("NORMALIZE", True)
        self.query_prefix = self._str_option("QUERY_PREFIX", "") or ""
        self.document_prefix = self._str_option("DOCUMENT_PREFIX", "") or ""
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ImproperlyConfigured(
                f"{self._where()}: SentenceTransformerEmbedder needs the sentence-transformers "
                "package: pip install 'bailing-knowledge[sentence-transformers]' "
                "(or pip install sentence-transformers)."
            ) from exc
        try:
            self._model = SentenceTransformer(model, device=device)
        except Exception as exc:
            raise EmbedderError(
                f"Embedder {alias!r}: cannot load model {model!r} ({type(exc).__name__}: {exc})"
            ) from exc
        size_of = getattr(self._model, "get_sentence_embedding_dimension", None) or getattr(
            self._model, "get_embedding_dimension", None
        )
        dimensions = size_of() if size_of else None
        if not isinstance(dimensions, int) or dimensions < 1:
            raise EmbedderError(f"Embedder {alias!r}: model {model!r} has no fixed dimension")
        self.dimensions = dimensions
        self.model_name = (
            f"sentence-transformers:{model}:d{dimensions}"
            + ("" if self.normalize else ":raw")
            + _prefix_tag(self.query_prefix, self.document_prefix)
        )

    def _encode(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        try:
            array = self._model.encode(
                texts,
                batch_size=self.batch_size,
                normalize_embeddings=self.normalize,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
            vectors = [[float(x) for x in row] for row in array]
        except Exception as exc:
            raise EmbedderError(
                f"Embedder {self.alias!r}: encoding failed ({type(exc).__name__})"
            ) from exc
        for vector in vectors:
            if len(vector) != self.dimensions:
                raise EmbedderError(
                    f"Embedder {self.alias!r}: expected {self.dimensions} dimensions, "
                    f"got {len(vector)}"
                )
            if not any(vector) or not all(map(math.isfinite, vector)):
                raise EmbedderError(f"Embedder {self.alias!r}: a vector is zero or not finite")
        return vectors

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        prefix = self.document_prefix
        return self._encode([prefix + text for text in texts])

    def embed_query(self, text: str) -> list[float]:
        return self._encode([self.query_prefix + text])[0]


# --------------------------------------------------------------------------------------------
# Registry


_embedders: dict[str, BaseEmbedder] = {}
_embedders_lock = threading.Lock()


def _build(alias: str) -> BaseEmbedder:
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
    extra = sorted(set(config) - {"BACKEND", "OPTIONS", "FUSION_WEIGHT"})
    if extra:
        raise ImproperlyConfigured(f"{where}: unknown key(s) {', '.join(extra)}.")
    weight = config.get("FUSION_WEIGHT", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 <= weight <= 10:
        raise ImproperlyConfigured(f"{where}['FUSION_WEIGHT'] must be a number from 0 to 10.")
    backend = knowledge_settings.import_from(config["BACKEND"])
    if not (isinstance(backend, type) and issubclass(backend, BaseEmbedder)):
        raise ImproperlyConfigured(f"{where}['BACKEND'] must name a BaseEmbedder subclass.")
    return backend(alias, config.get("OPTIONS") or {})


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
