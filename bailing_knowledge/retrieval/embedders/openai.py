"""Vectors from any server that speaks the OpenAI ``/v1/embeddings`` API."""

from __future__ import annotations

import email.utils
import math
import os
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from django.core.exceptions import ImproperlyConfigured

from ... import __version__
from .base import MAX_DIMENSIONS, BaseEmbedder, EmbedderError, prefix_tag, unit

__all__ = ["OpenAIEmbedder"]


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
            + prefix_tag(self.query_prefix, self.document_prefix)
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
                vectors.append(unit([float(x) for x in vector]))
            except ValueError as exc:
                raise self._fail("an embedding is zero or not finite") from exc
        if self._discovered_dimensions is None and self._configured_dimensions is None:
            self._discovered_dimensions = expected
        return vectors
