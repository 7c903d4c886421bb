"""The default embedder: signed feature hashing, with no dependency, network or model."""

from __future__ import annotations

import math
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from itertools import chain
from operator import add, sub
from typing import Any, ClassVar

from ...constants import INDEXED_EMBEDDING_DIMENSIONS
from ..tokenization import ENGLISH_STOPWORDS, normalize, split_words_and_runs
from .base import MAX_DIMENSIONS, BaseEmbedder

__all__ = ["HashingEmbedder"]


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

    embeds_ahead = True

    VERSION: ClassVar[int] = 1
    option_names = frozenset({"DIMENSIONS"})
    # Far weaker than BM25 (NFCorpus nDCG@10 about 0.17 against 0.33): a small weight breaks
    # near-ties and brings chunks no query word matches, without displacing better ones.
    # With the BM25 leg, hybrid nDCG@10 on NFCorpus: 0.3331 at 0.03, 0.3325 at 0.05
    # (lexical 0.3327); CMRC 2018: 0.9855 at 0.03, equal to lexical (docs/embedders.md).
    fusion_weight = 0.03

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

    def _slot_counts(self, text: str) -> Counter[int]:
        """How many features of `text` fall in each slot (bucket and sign)."""
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
        return Counter(chain.from_iterable(features))

    def _embed(self, text: str) -> list[float]:
        dimensions = self.dimensions
        counts = self._slot_counts(text)
        damping = _damping
        if 4 * len(counts) >= dimensions:
            slots = [0.0] * (2 * dimensions + 1)
            for slot, count in counts.items():
                slots[slot] = damping[count]
            vector = list(map(sub, slots[:dimensions], slots[dimensions : 2 * dimensions]))
            norm = math.hypot(*vector)
            if not norm:
                return self._empty_vector.copy()
            return list(map((1.0 / norm).__mul__, vector))
        # A query touches a few buckets of hundreds: only those are computed, each with the
        # same operations as above (the vector is bit for bit the same), in a fifth of the
        # time.
        plus: dict[int, float] = {}
        minus: dict[int, float] = {}
        for slot, count in counts.items():
            if slot < dimensions:
                plus[slot] = damping[count]
            elif slot < 2 * dimensions:  # 2 * dimensions: not a feature (`_RunSlots`)
                minus[slot - dimensions] = damping[count]
        vector = [0.0] * dimensions
        touched = plus.keys() | minus.keys()
        for bucket in touched:
            vector[bucket] = plus.get(bucket, 0.0) - minus.get(bucket, 0.0)
        norm = math.hypot(*vector)
        if not norm:
            return self._empty_vector.copy()
        scale = 1.0 / norm
        for bucket in touched:
            vector[bucket] *= scale
        return vector

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        return list(map(self._embed, texts))

    def embed_query(self, text: str) -> list[float]:
        return self._embed(text)
