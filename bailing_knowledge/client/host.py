"""Host discipline: turn guards and per-turn caches around a knowledge client.

An LLM host runs turns. Knowledge fetched for a turn belongs to that turn: when the user moves
on (turn N+1 starts) while a request of turn N is still in flight, its late answer must not
reach the model of turn N+1 nor any cache. `TurnGuard` numbers turns and tells whether one is
still current; `HostSession` (and `AsyncHostSession`) wrap a client so that

* every call belongs to a turn (and carries the turn's `run_id`, when the turn has one);
* an answer, or an error, that arrives after its turn was superseded raises `StaleTurn`
  instead of being returned (the documented choice: an exception cannot be mistaken for an
  empty result, and the code of the old turn stops where it stands);
* answers are cached per (authorization, route, turn) only: a new turn, a new token or
  another route never sees an earlier answer, and a stale answer is never stored;
* results keep their `trust` (`reference_only`) and hints stay as the server sent them.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

from .. import constants
from ._http import AsyncKnowledgeClient, KnowledgeClient
from .errors import KnowledgeError, StaleTurn
from .models import ReadChain, ReadPage, SearchResult

__all__ = ["AsyncHostSession", "HostSession", "Turn", "TurnCache", "TurnGuard"]

T = TypeVar("T")


@dataclass(frozen=True)
class Turn:
    """One host turn: its position in the sequence, the host's id, and the server run."""

    generation: int
    turn_id: str
    run_id: str | None = None


class TurnGuard:
    """Which turn is current. Thread-safe, and usable from asyncio (it never awaits)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._generation = 0
        self._current: Turn | None = None

    def start(self, turn_id: str | None = None, *, run_id: str | None = None) -> Turn:
        """Start a turn; every earlier turn is superseded from now on."""
        with self._lock:
            self._generation += 1
            turn = Turn(self._generation, turn_id or f"turn-{self._generation}", run_id)
            self._current = turn
            return turn

    def end(self, turn: Turn) -> None:
        """End `turn` (when it is current): its late answers are dropped from now on too."""
        with self._lock:
            if self._current == turn:
                self._current = None

    @property
    def current(self) -> Turn | None:
        with self._lock:
            return self._current

    def is_current(self, turn: Turn) -> bool:
        with self._lock:
            return self._current == turn

    def check(self, turn: Turn) -> None:
        """Raise `StaleTurn` unless `turn` is current."""
        with self._lock:
            self._check(turn)

    def commit(self, turn: Turn, action: Callable[[], None]) -> None:
        """Run `action` (e.g. a cache write) only if `turn` is current, atomically with the
        check, so that a turn starting in between cannot see the write."""
        with self._lock:
            self._check(turn)
            action()

    def _check(self, turn: Turn) -> None:
        if self._current != turn:
            current = self._current.turn_id if self._current else None
            raise StaleTurn(turn.turn_id, current)


class TurnCache:
    """A small LRU of answers, each entry valid for one turn and at most `ttl` seconds.

    The TTL defaults to the reference TTL: an answer is never served from cache longer than
    its refs would have been accepted by the server.
    """

    def __init__(
        self,
        max_entries: int = 64,
        ttl: float = constants.REFERENCE_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._entries: OrderedDict[Hashable, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.max_entries = max_entries
        self.ttl = ttl
        self._clock = clock

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            stored_at, value = entry
            if self._clock() - stored_at > self.ttl:
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return value

    def put(self, key: Hashable, value: Any) -> None:
        if self.max_entries <= 0:
            return
        with self._lock:
            self._entries[key] = (self._clock(), value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


class _SessionBase:
    """Turn bookkeeping shared by the sync and async sessions."""

    client: KnowledgeClient | AsyncKnowledgeClient

    def __init__(self, guard: TurnGuard | None, cache: TurnCache | None) -> None:
        self.guard = guard or TurnGuard()
        self.cache = cache if cache is not None else TurnCache()

    def start_turn(self, turn_id: str | None = None, *, run_id: str | None = None) -> Turn:
        """Start a new turn (superseding the previous one) and forget earlier answers.

        `run_id` is the run the server returned for this turn (on-demand delivery): every
        search and read of the turn then carries it, and its refs are bound to it.
        """
        turn = self.guard.start(turn_id, run_id=run_id)
        self.cache.clear()
        return turn

    def end_turn(self, turn: Turn | None = None) -> None:
        """End the turn (default: the current one); late answers for it will be dropped."""
        turn = turn or self.guard.current
        if turn is not None:
            self.guard.end(turn)
            self.cache.clear()

    @property
    def turn(self) -> Turn | None:
        return self.guard.current

    def _resolve(self, turn: Turn | None) -> Turn:
        resolved = turn or self.guard.current
        if resolved is None:
            # Not StaleTurn: with no turn named there is no turn to call late, only a call
            # made outside every turn (before the first, or after `end_turn`).
            raise RuntimeError(
                "No turn is current: start one with start_turn(), and pass its turn (turn=) "
                "so that a call arriving after the turn ended raises StaleTurn instead."
            )
        self.guard.check(resolved)
        return resolved

    def _key(self, turn: Turn, *parts: Hashable) -> tuple[Hashable, ...]:
        client = self.client
        return (client.authorization_key, client.route, turn.generation, turn.turn_id, *parts)

    def _stale_instead(self, turn: Turn, exc: KnowledgeError) -> None:
        """An error for a superseded turn is dropped like an answer would be."""
        if not self.guard.is_current(turn):
            current = self.guard.current
            raise StaleTurn(turn.turn_id, current.turn_id if current else None) from exc

    def _keep(self, turn: Turn, key: tuple[Hashable, ...], value: T) -> T:
        self.guard.commit(turn, lambda: self.cache.put(key, value))
        return value


class HostSession(_SessionBase):
    """A `KnowledgeClient` under host discipline: turns, stale-answer dropping, caching.

    Pass it to `tools.execute_tool_call` in place of a client to run the model's tool calls
    under the current turn.
    """

    client: KnowledgeClient

    def __init__(
        self,
        client: KnowledgeClient,
        *,
        guard: TurnGuard | None = None,
        cache: TurnCache | None = None,
    ) -> None:
        super().__init__(guard, cache)
        self.client = client

    def _call(self, turn: Turn | None, key: tuple[Hashable, ...], fetch: Callable[[Turn], T]) -> T:
        resolved = self._resolve(turn)
        full_key = self._key(resolved, *key)
        cached = self.cache.get(full_key)
        if cached is not None:
            return cached
        try:
            value = fetch(resolved)
        except KnowledgeError as exc:
            self._stale_instead(resolved, exc)
            raise
        return self._keep(resolved, full_key, value)

    def search(
        self, query: str, *, limit: int = constants.SEARCH_MAX_RESULTS, turn: Turn | None = None
    ) -> SearchResult:
        """`KnowledgeClient.search` for the turn (its `run_id` included)."""
        return self._call(
            turn,
            ("search", query, limit),
            lambda t: self.client.search(query, limit=limit, run_id=t.run_id),
        )

    def read(
        self,
        ref: str,
        *,
        cursor: str | None = None,
        max_bytes: int | None = None,
        turn: Turn | None = None,
    ) -> ReadPage:
        """`KnowledgeClient.read` for the turn."""
        return self._call(
            turn,
            ("read", ref, cursor, max_bytes),
            lambda t: self.client.read(ref, cursor=cursor, run_id=t.run_id, max_bytes=max_bytes),
        )

    def read_chain(
        self,
        ref: str,
        *,
        cursor: str | None = None,
        max_bytes: int | None = None,
        turn: Turn | None = None,
    ) -> ReadChain:
        """`KnowledgeClient.read_chain` for the turn."""
        return self._call(
            turn,
            ("read_chain", ref, cursor, max_bytes),
            lambda t: self.client.read_chain(
                ref, cursor=cursor, run_id=t.run_id, max_bytes=max_bytes
            ),
        )


class AsyncHostSession(_SessionBase):
    """`HostSession` for an `AsyncKnowledgeClient`; pass it to `tools.aexecute_tool_call`."""

    client: AsyncKnowledgeClient

    def __init__(
        self,
        client: AsyncKnowledgeClient,
        *,
        guard: TurnGuard | None = None,
        cache: TurnCache | None = None,
    ) -> None:
        super().__init__(guard, cache)
        self.client = client

    async def _call(
        self,
        turn: Turn | None,
        key: tuple[Hashable, ...],
        fetch: Callable[[Turn], Awaitable[T]],
    ) -> T:
        resolved = self._resolve(turn)
        full_key = self._key(resolved, *key)
        cached = self.cache.get(full_key)
        if cached is not None:
            return cached
        try:
            value = await fetch(resolved)
        except KnowledgeError as exc:
            self._stale_instead(resolved, exc)
            raise
        return self._keep(resolved, full_key, value)

    async def search(
        self, query: str, *, limit: int = constants.SEARCH_MAX_RESULTS, turn: Turn | None = None
    ) -> SearchResult:
        """`AsyncKnowledgeClient.search` for the turn (its `run_id` included)."""
        return await self._call(
            turn,
            ("search", query, limit),
            lambda t: self.client.search(query, limit=limit, run_id=t.run_id),
        )

    async def read(
        self,
        ref: str,
        *,
        cursor: str | None = None,
        max_bytes: int | None = None,
        turn: Turn | None = None,
    ) -> ReadPage:
        """`AsyncKnowledgeClient.read` for the turn."""
        return await self._call(
            turn,
            ("read", ref, cursor, max_bytes),
            lambda t: self.client.read(ref, cursor=cursor, run_id=t.run_id, max_bytes=max_bytes),
        )

    async def read_chain(
        self,
        ref: str,
        *,
        cursor: str | None = None,
        max_bytes: int | None = None,
        turn: Turn | None = None,
    ) -> ReadChain:
        """`AsyncKnowledgeClient.read_chain` for the turn."""
        return await self._call(
            turn,
            ("read_chain", ref, cursor, max_bytes),
            lambda t: self.client.read_chain(
                ref, cursor=cursor, run_id=t.run_id, max_bytes=max_bytes
            ),
        )
