"""The interface every embedder backend implements, and helpers the backends share."""

from __future__ import annotations

import hashlib
import importlib.util
import math
import sys
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from django.core.exceptions import ImproperlyConfigured

from ...conf import SETTINGS_NAME, nearest_name

__all__ = ["MAX_DIMENSIONS", "BaseEmbedder", "EmbedderError", "prefix_tag", "unit"]

#: pgvector's limit for the ``vector`` type.
MAX_DIMENSIONS = 16000


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
    #: True when building the backend loads a model: the system checks then check its option
    #: names only, and leave its values to the first use.
    loads_model: ClassVar[bool] = False
    #: True when embedding a query is cheap, local and deterministic (no network, no model,
    #: the same vector every time): a search may then embed it before its token is known,
    #: to send its opening statements behind the token's check (`HybridSearch.
    #: early_statements`), since doing so twice costs nothing and sends the query nowhere.
    embeds_ahead: ClassVar[bool] = False

    #: The alias under ``BAILING_KNOWLEDGE["EMBEDDERS"]`` this instance was built for.
    alias: str
    #: Length of every vector.
    dimensions: int
    #: A stable identifier of the model and of every option that changes the vectors. Two
    #: embedders with the same `model_name` produce interchangeable vectors; a change means
    #: stored vectors must be recomputed.
    model_name: str
    #: Weight of this embedder's ranking in the hybrid fusion (the lexical leg's is 1.0): the
    #: backend's measured default, replaced on the instance by `FUSION_WEIGHT` next to
    #: `BACKEND` in the settings (validated once, when the registry builds the instance).
    fusion_weight: float = 1.0
    #: The optional package the backend needs, as (module to import, extra of
    #: ``bailing-knowledge`` that installs it); None when it needs nothing beyond the app's
    #: own dependencies. The system checks report a missing one at start-up.
    requires: ClassVar[tuple[str, str] | None] = None

    @classmethod
    def missing_requirement(cls) -> str | None:
        """The install command for the backend's missing optional package, or None.

        Looked up without importing the package, so that checking is cheap and harmless.
        """
        if cls.requires is None:
            return None
        module, extra = cls.requires
        if module in sys.modules:
            present = sys.modules[module] is not None  # None: an import known to fail
        else:
            try:
                present = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                present = False
        if present:
            return None
        return f"pip install 'bailing-knowledge[{extra}]'"

    def __init__(self, alias: str = "default", options: Mapping[str, Any] | None = None) -> None:
        self.alias = alias
        if options is not None and not isinstance(options, Mapping):
            raise ImproperlyConfigured(f"{self._where()}['OPTIONS'] must be a dict.")
        self.options: dict[str, Any] = dict(options or {})
        self.check_option_names(alias, self.options)

    @classmethod
    def check_option_names(cls, alias: str, options: Mapping[str, Any]) -> None:
        """Refuse option names the backend does not know, suggesting the nearest one."""
        unknown = sorted(set(options) - cls.option_names)
        if unknown:
            allowed = ", ".join(sorted(cls.option_names)) or "none"
            hint = nearest_name(unknown[0], cls.option_names)
            raise ImproperlyConfigured(
                f"{SETTINGS_NAME}['EMBEDDERS'][{alias!r}]: unknown option(s) "
                f"{', '.join(unknown)} for {cls.__name__} (accepted: {allowed})."
                + (f" Did you mean {hint!r}?" if hint else "")
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


def unit(vector: list[float]) -> list[float]:
    norm = math.hypot(*vector)
    if not norm or not math.isfinite(norm):
        raise ValueError("vector has no direction")
    inverse = 1.0 / norm
    return [x * inverse for x in vector]


def prefix_tag(query_prefix: str, document_prefix: str) -> str:
    """A short, stable tag for model names whose vectors depend on prompt prefixes."""
    if not query_prefix and not document_prefix:
        return ""
    digest = hashlib.blake2b(
        f"{len(query_prefix)}:{query_prefix}{document_prefix}".encode(), digest_size=4
    )
    return f":p{digest.hexdigest()}"
