"""Typed, immutable views of the knowledge API's answers, and their strict parsers.

Each parser checks `schema_version` first: an answer in a schema this client does not know is
a `ProtocolError`, never a best-effort success, because a host that misreads a newer schema
could strip bodies or lose provenance without noticing. Every knowledge-bearing result keeps
`trust` (always `reference_only` in protocol v1) so that provenance travels with the text into
whatever the host builds from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .. import constants
from .errors import ProtocolError

__all__ = [
    "MAX_CHAIN_PAGES",
    "Capabilities",
    "DeliveryMode",
    "Hint",
    "Limits",
    "ReadChain",
    "ReadPage",
    "SearchResult",
    "parse_capabilities",
    "parse_hint",
    "parse_read_page",
    "parse_search",
]

DeliveryMode = Literal["inline", "on_demand"]
SearchStatus = Literal["ok", "disabled", "partial", "unavailable"]

_SEARCH_STATUSES = ("ok", "disabled", "partial", "unavailable")

# The most pages one read chain may take. A page answer may be as small as READ_MIN_BYTES, and
# after its envelope (title, ref, cursor) such a page still carries hundreds of bytes of
# content, so a chain within its byte budget stays far below this. A hub that goes on past it
# (a byte per page under ever new cursors) would otherwise cost ~130,000 requests.
MAX_CHAIN_PAGES = constants.READ_CHAIN_MAX_BYTES // (constants.READ_MIN_BYTES // 32)


@dataclass(frozen=True)
class Limits:
    """The byte and count limits a server announces in its capabilities."""

    search_max_results: int = constants.SEARCH_MAX_RESULTS
    search_max_bytes: int = constants.SEARCH_MAX_BYTES
    read_default_bytes: int = constants.READ_DEFAULT_BYTES
    read_max_bytes: int = constants.READ_MAX_BYTES
    reference_ttl_seconds: int = constants.REFERENCE_TTL_SECONDS
    read_chain_max_bytes: int = constants.READ_CHAIN_MAX_BYTES


@dataclass(frozen=True)
class Capabilities:
    """What the server supports on a route (`GET .../knowledge/capabilities`)."""

    schema_version: str
    protocol: str
    supported: bool
    route: str
    enabled: bool
    knowledge_scope_revision: str
    delivery_modes: tuple[str, ...]
    limits: Limits
    raw: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @property
    def on_demand(self) -> bool:
        """True when a host may ask turns for `knowledge_delivery: "on_demand"`."""
        return self.supported and self.enabled and "on_demand" in self.delivery_modes


@dataclass(frozen=True)
class Hint:
    """One search hit: a reference to read, and an excerpt of the current text.

    `summary` is an excerpt of the document, not generated text; like every knowledge text
    it is reference material (`trust`), not an instruction to follow.
    """

    ref: str
    title: str
    summary: str
    revision: int
    score: float
    expires_at: str
    trust: str = constants.TRUST_REFERENCE_ONLY

    def to_dict(self) -> dict[str, Any]:
        return {
            "ref": self.ref,
            "title": self.title,
            "summary": self.summary,
            "revision": self.revision,
            "score": self.score,
            "expires_at": self.expires_at,
        }


@dataclass(frozen=True)
class SearchResult:
    """A search answer: at most three hints, best first, within 4096 bytes on the wire."""

    schema_version: str
    route: str
    run_id: str | None
    knowledge_scope_revision: str
    status: str
    trust: str
    hints: tuple[Hint, ...]
    truncated: bool
    raw: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)


@dataclass(frozen=True)
class ReadPage:
    """One page of a referenced document. `next_cursor` continues the chain, or is None."""

    schema_version: str
    route: str
    run_id: str | None
    knowledge_scope_revision: str
    ref: str
    revision: int
    title: str
    content: str
    trust: str
    next_cursor: str | None
    truncated: bool
    budget_exhausted: bool
    total_content_bytes: int
    read_chain_max_bytes: int
    raw: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)


@dataclass(frozen=True)
class ReadChain:
    """A whole read chain: every page, their content joined, and the last page's flags.

    `truncated` means the document has text after the chain's end (only possible when the
    body is larger than the chain budget, then `budget_exhausted` is also true).
    `start_cursor` is the cursor the chain started at, or None for a chain from its first
    page: a chain from a cursor lacks the text before it, whatever `truncated` says.
    """

    ref: str
    route: str
    run_id: str | None
    knowledge_scope_revision: str
    revision: int
    title: str
    content: str
    trust: str
    truncated: bool
    budget_exhausted: bool
    total_content_bytes: int
    read_chain_max_bytes: int
    pages: tuple[ReadPage, ...] = field(repr=False)
    start_cursor: str | None = None

    @property
    def complete(self) -> bool:
        """True when `content` is the whole document body: read from the first page (not
        from a cursor) to the end."""
        return self.start_cursor is None and not self.truncated


# --- parsing ---------------------------------------------------------------------------------


def _require(body: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = body.get(key)
    # bool is an int subclass: never accept True where a number is expected.
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _kinds(kind)):
        raise ProtocolError(reason=f"Field {key!r} is missing or has the wrong type.", status=200)
    return value


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _optional_str(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise ProtocolError(reason=f"Field {key!r} has the wrong type.", status=200)
    return value


def _check_envelope(body: Any, schema_version: str) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise ProtocolError(reason="The answer is not a JSON object.", status=200)
    found = body.get("schema_version")
    if found != schema_version:
        raise ProtocolError(
            reason=f"Unknown schema_version {found!r}; expected {schema_version!r}.", status=200
        )
    return body


def _check_trust(body: Mapping[str, Any]) -> str:
    trust = _require(body, "trust", str)
    if trust != constants.TRUST_REFERENCE_ONLY:
        raise ProtocolError(reason=f"Unknown trust {trust!r}.", status=200)
    return trust


def _check_route(body: Mapping[str, Any], route: str | None) -> str:
    found = _require(body, "route", str)
    if route is not None and found != route:
        raise ProtocolError(reason="The answer is for another route.", status=200)
    return found


def parse_capabilities(body: Any, *, route: str | None = None) -> Capabilities:
    """A `Capabilities` from a decoded capabilities body, or `ProtocolError`."""
    body = _check_envelope(body, constants.SCHEMA_CAPABILITIES)
    protocol = _require(body, "protocol", str)
    if protocol != constants.PROTOCOL:
        raise ProtocolError(reason=f"Unknown protocol {protocol!r}.", status=200)
    modes = _require(body, "delivery_modes", list)
    if not all(isinstance(mode, str) for mode in modes):
        raise ProtocolError(reason="Field 'delivery_modes' has the wrong type.", status=200)
    raw_limits = body.get("limits", {})
    if not isinstance(raw_limits, Mapping):
        raise ProtocolError(reason="Field 'limits' has the wrong type.", status=200)
    known = Limits.__dataclass_fields__
    limits = {}
    for key, value in raw_limits.items():
        if key in known:
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ProtocolError(reason=f"Limit {key!r} has the wrong type.", status=200)
            limits[key] = value
    return Capabilities(
        schema_version=body["schema_version"],
        protocol=protocol,
        supported=_require(body, "supported", bool),
        route=_check_route(body, route),
        enabled=_require(body, "enabled", bool),
        knowledge_scope_revision=_require(body, "knowledge_scope_revision", str),
        delivery_modes=tuple(modes),
        limits=Limits(**limits),
        raw=body,
    )


def parse_hint(item: Any) -> Hint:
    if not isinstance(item, Mapping):
        raise ProtocolError(reason="A hint is not a JSON object.", status=200)
    try:
        score = float(_require(item, "score", (int, float)))
    except OverflowError:  # an integer beyond a float's range
        raise ProtocolError(reason="Field 'score' is out of range.", status=200) from None
    return Hint(
        ref=_require(item, "ref", str),
        title=_require(item, "title", str),
        summary=_require(item, "summary", str),
        revision=_require(item, "revision", int),
        score=score,
        expires_at=_require(item, "expires_at", str),
    )


def parse_search(body: Any, *, route: str | None = None) -> SearchResult:
    """A `SearchResult` from a decoded search body, or `ProtocolError`."""
    body = _check_envelope(body, constants.SCHEMA_SEARCH)
    status = _require(body, "status", str)
    if status not in _SEARCH_STATUSES:
        raise ProtocolError(reason=f"Unknown search status {status!r}.", status=200)
    hints = _require(body, "hints", list)
    return SearchResult(
        schema_version=body["schema_version"],
        route=_check_route(body, route),
        run_id=_optional_str(body, "run_id"),
        knowledge_scope_revision=_require(body, "knowledge_scope_revision", str),
        status=status,
        trust=_check_trust(body),
        hints=tuple(parse_hint(item) for item in hints),
        truncated=_require(body, "truncated", bool),
        raw=body,
    )


def parse_read_page(body: Any, *, route: str | None = None, ref: str | None = None) -> ReadPage:
    """A `ReadPage` from a decoded read body, or `ProtocolError`."""
    body = _check_envelope(body, constants.SCHEMA_READ)
    found_ref = _require(body, "ref", str)
    if ref is not None and found_ref != ref:
        raise ProtocolError(reason="The page is for another reference.", status=200)
    return ReadPage(
        schema_version=body["schema_version"],
        route=_check_route(body, route),
        run_id=_optional_str(body, "run_id"),
        knowledge_scope_revision=_require(body, "knowledge_scope_revision", str),
        ref=found_ref,
        revision=_require(body, "revision", int),
        title=_require(body, "title", str),
        content=_require(body, "content", str),
        trust=_check_trust(body),
        next_cursor=_optional_str(body, "next_cursor"),
        truncated=_require(body, "truncated", bool),
        budget_exhausted=_require(body, "budget_exhausted", bool),
        total_content_bytes=_require(body, "total_content_bytes", int),
        read_chain_max_bytes=_require(body, "read_chain_max_bytes", int),
        raw=body,
    )


class ChainBuilder:
    """Accumulates the pages of one chain and checks the server's promises on the way.

    Shared by the sync and async clients so both enforce the same rules: a page never
    changes revision, every page with a `next_cursor` makes progress, no cursor comes twice
    and the chain ends within `MAX_CHAIN_PAGES` (no endless loop), and the chain's content
    stays within `read_chain_max_bytes`.
    """

    def __init__(self, ref: str, cursor: str | None = None) -> None:
        self.ref = ref
        self.start_cursor = cursor
        self.pages: list[ReadPage] = []
        self.bytes = 0
        self._cursors = set() if cursor is None else {cursor}

    def add(self, page: ReadPage) -> str | None:
        """Record `page`; the cursor to fetch next, or None when the chain is over."""
        if self.pages and page.revision != self.pages[0].revision:
            raise ProtocolError(reason="A read chain changed revision.", status=200)
        self.pages.append(page)
        self.bytes += len(page.content.encode("utf-8"))
        budget = min(page.read_chain_max_bytes, constants.READ_CHAIN_MAX_BYTES)
        if self.bytes > budget:
            raise ProtocolError(reason="A read chain exceeded its byte budget.", status=200)
        cursor = page.next_cursor
        if cursor is None:
            return None
        if not page.content:
            raise ProtocolError(reason="A read page made no progress.", status=200)
        if cursor in self._cursors:
            raise ProtocolError(reason="A read chain repeated a cursor.", status=200)
        if len(self.pages) >= MAX_CHAIN_PAGES:
            raise ProtocolError(
                reason=f"A read chain went on past {MAX_CHAIN_PAGES} pages.", status=200
            )
        self._cursors.add(cursor)
        return cursor

    def build(self) -> ReadChain:
        first, last = self.pages[0], self.pages[-1]
        return ReadChain(
            ref=self.ref,
            route=first.route,
            run_id=first.run_id,
            knowledge_scope_revision=last.knowledge_scope_revision,
            revision=first.revision,
            title=first.title,
            content="".join(page.content for page in self.pages),
            trust=constants.TRUST_REFERENCE_ONLY,
            truncated=last.truncated,
            budget_exhausted=last.budget_exhausted,
            total_content_bytes=last.total_content_bytes,
            read_chain_max_bytes=last.read_chain_max_bytes,
            pages=tuple(self.pages),
            start_cursor=self.start_cursor,
        )
