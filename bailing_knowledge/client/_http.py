"""`KnowledgeClient` and `AsyncKnowledgeClient`: the knowledge endpoints over HTTP.

Both clients share one request builder and one response reader (`_Endpoint`), so the sync and
async flavours cannot drift apart: same paths, same bodies, same error mapping, same checks.
Redirects are never followed, because following one would hand the bearer token to whatever
host the redirect names.
"""

from __future__ import annotations

import hashlib
import math
import re
import ssl
import time
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote, urlsplit

import anyio
import httpcore
import httpx

from .. import __version__, constants
from .errors import InvalidRequest, ProtocolError, Unreachable, decode_json, error_from_response
from .models import (
    Capabilities,
    ChainBuilder,
    ReadChain,
    ReadPage,
    SearchResult,
    parse_capabilities,
    parse_read_page,
    parse_search,
)

__all__ = ["DEFAULT_API_PREFIX", "AsyncKnowledgeClient", "KnowledgeClient", "RawResponse"]

DEFAULT_API_PREFIX = "/agent-api/v1"
DEFAULT_TIMEOUT = 30.0
_ROUTE = re.compile(r"[-a-zA-Z0-9_]+")  # with fullmatch: `$` would let a final newline in
# Visible ASCII: a header value can carry nothing else (the token is sent as one).
VISIBLE_ASCII = re.compile(r"[!-~]+")


@dataclass(frozen=True)
class RawResponse:
    """An HTTP answer as received, for callers that judge statuses themselves (negotiation)."""

    status: int
    content: bytes
    headers: Mapping[str, str]


class _Endpoint:
    """What both clients know: where to send, what to send, how to read the answer."""

    def __init__(
        self,
        base_url: str,
        route: str,
        access_token: str,
        *,
        api_prefix: str = DEFAULT_API_PREFIX,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
    ) -> None:
        if not _ROUTE.fullmatch(route or ""):
            raise ValueError("route must be a route key (letters, digits, '-' and '_').")
        if not access_token:
            raise ValueError("access_token is required.")
        if not VISIBLE_ASCII.fullmatch(access_token):
            # Else every request fails inside httpx with UnicodeEncodeError, or as a
            # transport error that reads like a hub that cannot be reached.
            raise ValueError(
                "access_token must be visible ASCII (no spaces, control or non-ASCII "
                "characters): check that it was copied whole."
            )
        if not base_url.startswith(("http://", "https://")):
            raise ValueError("base_url must be an http:// or https:// URL.")
        self.base_url = base_url.rstrip("/")
        self.route = route
        self.api_prefix = "/" + api_prefix.strip("/") if api_prefix.strip("/") else ""
        if self.api_prefix and urlsplit(self.base_url).path.endswith(self.api_prefix):
            # Every path would hold the prefix twice, and the capabilities answer's 404 reads
            # as a server that predates the protocol: the agent would quietly fall back.
            raise ValueError(
                f"base_url is the business system's URL without the API prefix: drop "
                f"{self.api_prefix!r} from it."
            )
        try:
            httpx.URL(self.url("capabilities"))
        except httpx.InvalidURL as exc:
            raise ValueError(f"base_url is not a valid URL: {exc}") from None
        self._token = access_token
        self.timeout = _timeout(timeout)
        self.total = _total(self.timeout)
        # A stable, non-reversible name for the current authorization: caches key on it.
        self.authorization_key = hashlib.sha256(access_token.encode("utf-8")).hexdigest()

    def url(self, action: str) -> str:
        route = quote(self.route, safe="")
        return f"{self.base_url}{self.api_prefix}/workspaces/{route}/knowledge/{action}"

    def headers(self) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self._token}",
            "Accept": "application/json",
            "User-Agent": f"bailing-knowledge-client/{__version__}",
        }

    @staticmethod
    def search_body(query: str, limit: int, run_id: str | None) -> dict[str, Any]:
        _check_sendable(query=query, run_id=run_id)
        body: dict[str, Any] = {"query": query, "limit": limit}
        if run_id is not None:
            body["run_id"] = run_id
        return body

    @staticmethod
    def read_body(
        ref: str, cursor: str | None, run_id: str | None, max_bytes: int | None
    ) -> dict[str, Any]:
        _check_sendable(ref=ref, cursor=cursor, run_id=run_id)
        body: dict[str, Any] = {"ref": ref}
        if cursor is not None:
            body["cursor"] = cursor
        if run_id is not None:
            body["run_id"] = run_id
        if max_bytes is not None:
            body["max_bytes"] = max_bytes
        return body

    @staticmethod
    def raw(response: httpx.Response) -> RawResponse:
        return RawResponse(response.status_code, response.content, dict(response.headers))

    @staticmethod
    def decode(response: httpx.Response) -> Any:
        """The JSON of a success, or raise the `KnowledgeError` the answer stands for."""
        if response.status_code != 200:
            raise error_from_response(
                response.status_code, response.content, dict(response.headers)
            )
        try:
            return decode_json(response.content)
        except ValueError:
            raise ProtocolError(reason="The answer is not JSON.", status=200) from None

    def repr(self, cls: str) -> str:
        # Never the token.
        return f"<{cls} {self.base_url} route={self.route!r}>"


def _check_sendable(**texts: str | None) -> None:
    """Refuse text with no UTF-8 form (a lone surrogate, half of an emoji cut) before any
    request: encoding the body would raise `UnicodeEncodeError` from inside httpx."""
    for name, text in texts.items():
        if text is None:
            continue
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRequest(
                reason=f"{name!r} contains invalid Unicode (a lone surrogate); nothing was sent.",
                status=0,
                fields={name: ["Contains a lone surrogate, which has no UTF-8 form."]},
            ) from None


def _undecodable() -> ProtocolError:
    return ProtocolError(reason="The answer's Content-Encoding could not be decoded.")


# When the request in flight must be over (a `time.monotonic()` value), for the sync
# client's streams; a context variable, so that each thread sees its own request's.
_REQUEST_END: ContextVar[float | None] = ContextVar("bailing_knowledge_request_end", default=None)


def _left(timeout: float | None, expired: type[Exception]) -> float | None:
    """`timeout` cut to what is left of the request's deadline; `expired` when none is."""
    end = _REQUEST_END.get()
    if end is None:
        return timeout
    left = end - time.monotonic()
    if left <= 0:
        raise expired("The request's deadline has passed.")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read and write ends by the deadline of the request using it.

    httpx bounds each socket operation on its own, so a hub that drips its answer a byte at
    a time never trips the read timeout and keeps a call alive as long as it likes."""

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        timeout = _left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's sync backend, with `_DeadlineStream` connections."""

    def __init__(self) -> None:
        self._backend = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        timeout = _left(timeout, httpcore.ConnectTimeout)
        stream = self._backend.connect_tcp(host, port, timeout, local_address, socket_options)
        return _DeadlineStream(stream)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:  # pragma: no cover (the client takes no socket path)
        timeout = _left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._backend.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:  # pragma: no cover (retries are off)
        self._backend.sleep(seconds)


def _keep_deadlines(client: httpx.Client) -> httpx.Client:
    """`client`, its connections keeping the request's deadline: those of its own transport
    and of the proxy transports httpx mounted from the environment (`HTTPS_PROXY`...).
    httpx offers no way to choose httpcore's network backend, so each pool's is wrapped in
    place; should a later httpx hold its pools otherwise, the client keeps per-operation
    timeouts (and the deadline tests say so)."""
    for transport in [client._transport, *client._mounts.values()]:
        pool = getattr(transport, "_pool", None)
        if isinstance(getattr(pool, "_network_backend", None), httpcore.SyncBackend):
            pool._network_backend = _DeadlineBackend()
    return client


def _unreachable(exc: httpx.TransportError) -> Unreachable:
    kind = type(exc).__name__
    return Unreachable(reason=f"The knowledge hub could not be reached ({kind}).")


def _late(total: float) -> Unreachable:
    return Unreachable(reason=f"The knowledge hub did not answer within {total:g} seconds.")


def _timeout(timeout: float | httpx.Timeout) -> httpx.Timeout:
    if isinstance(timeout, httpx.Timeout):
        return timeout
    if isinstance(timeout, int | float) and not (math.isfinite(timeout) and timeout > 0):
        # Infinity would be no deadline at all, and 0 or less every request failing.
        raise ValueError("timeout must be a positive, finite number of seconds.")
    return httpx.Timeout(timeout)


def _total(timeout: httpx.Timeout) -> float | None:
    """A request's whole deadline: the longest of the timeouts given (None: none given)."""
    values = [v for v in timeout.as_dict().values() if v is not None]
    return max(values) if values else None


class KnowledgeClient:
    """Synchronous client of one route's knowledge endpoints, under one access token.

    Thread-safe (one `httpx.Client` connection pool); close it, or use it as a context
    manager. Methods raise `KnowledgeError` subclasses for every answer that is not success.
    `timeout` in seconds is each request's whole deadline, from connecting to the last byte
    of the answer (past it: `Unreachable`); with an `httpx.Timeout`, its per-operation values
    apply and the longest of them is the deadline.
    """

    def __init__(
        self,
        base_url: str,
        route: str,
        access_token: str,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        api_prefix: str = DEFAULT_API_PREFIX,
    ) -> None:
        self._endpoint = _Endpoint(
            base_url, route, access_token, api_prefix=api_prefix, timeout=timeout
        )
        self._http = _keep_deadlines(
            httpx.Client(timeout=self._endpoint.timeout, follow_redirects=False)
        )

    @property
    def route(self) -> str:
        return self._endpoint.route

    @property
    def base_url(self) -> str:
        return self._endpoint.base_url

    @property
    def authorization_key(self) -> str:
        """SHA-256 of the access token: identifies the authorization without revealing it."""
        return self._endpoint.authorization_key

    def __repr__(self) -> str:
        return self._endpoint.repr(type(self).__name__)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _send(self, method: str, action: str, body: dict[str, Any] | None = None) -> httpx.Response:
        total = self._endpoint.total
        token = _REQUEST_END.set(None if total is None else time.monotonic() + total)
        try:
            return self._http.request(
                method, self._endpoint.url(action), json=body, headers=self._endpoint.headers()
            )
        except httpx.TimeoutException as exc:
            end = _REQUEST_END.get()
            if total is not None and end is not None and time.monotonic() >= end - 0.01:
                raise _late(total) from None
            raise _unreachable(exc) from None
        except httpx.TransportError as exc:
            raise _unreachable(exc) from None
        except httpx.DecodingError:
            raise _undecodable() from None
        finally:
            _REQUEST_END.reset(token)

    def capabilities_response(self) -> RawResponse:
        """The capabilities answer as received, whatever its status (for negotiation)."""
        return _Endpoint.raw(self._send("GET", "capabilities"))

    def capabilities(self) -> Capabilities:
        """What the server supports on this route."""
        body = _Endpoint.decode(self._send("GET", "capabilities"))
        return parse_capabilities(body, route=self.route)

    def search(
        self, query: str, *, limit: int = constants.SEARCH_MAX_RESULTS, run_id: str | None = None
    ) -> SearchResult:
        """Up to `limit` (≤ 3) hints for `query`; `run_id` binds the refs to a current run."""
        body = _Endpoint.search_body(query, limit, run_id)
        return parse_search(_Endpoint.decode(self._send("POST", "search", body)), route=self.route)

    def read(
        self,
        ref: str,
        *,
        cursor: str | None = None,
        run_id: str | None = None,
        max_bytes: int | None = None,
    ) -> ReadPage:
        """One page of the referenced document; `max_bytes` bounds the whole answer."""
        body = _Endpoint.read_body(ref, cursor, run_id, max_bytes)
        answer = _Endpoint.decode(self._send("POST", "read", body))
        return parse_read_page(answer, route=self.route, ref=ref)

    def read_chain(
        self,
        ref: str,
        *,
        cursor: str | None = None,
        run_id: str | None = None,
        max_bytes: int | None = None,
    ) -> ReadChain:
        """Every page from the start (or from `cursor`) until `next_cursor` is null.

        The content of a chain is at most `read_chain_max_bytes` (128 KiB); a larger document
        ends with `truncated` and `budget_exhausted` both true.
        """
        chain = ChainBuilder(ref, cursor)
        while True:
            page = self.read(ref, cursor=cursor, run_id=run_id, max_bytes=max_bytes)
            cursor = chain.add(page)
            if cursor is None:
                return chain.build()


class AsyncKnowledgeClient:
    """The `KnowledgeClient` API for asyncio hosts (`httpx.AsyncClient`); awaitable methods."""

    def __init__(
        self,
        base_url: str,
        route: str,
        access_token: str,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        api_prefix: str = DEFAULT_API_PREFIX,
    ) -> None:
        self._endpoint = _Endpoint(
            base_url, route, access_token, api_prefix=api_prefix, timeout=timeout
        )
        self._http = httpx.AsyncClient(timeout=self._endpoint.timeout, follow_redirects=False)

    @property
    def route(self) -> str:
        return self._endpoint.route

    @property
    def base_url(self) -> str:
        return self._endpoint.base_url

    @property
    def authorization_key(self) -> str:
        """SHA-256 of the access token: identifies the authorization without revealing it."""
        return self._endpoint.authorization_key

    def __repr__(self) -> str:
        return self._endpoint.repr(type(self).__name__)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _send(
        self, method: str, action: str, body: dict[str, Any] | None = None
    ) -> httpx.Response:
        total = self._endpoint.total
        try:
            # Cancelled as a whole at the deadline, however the hub paces its bytes.
            with anyio.fail_after(total):
                return await self._http.request(
                    method,
                    self._endpoint.url(action),
                    json=body,
                    headers=self._endpoint.headers(),
                )
        except TimeoutError:
            raise _late(total or 0) from None
        except httpx.TransportError as exc:
            raise _unreachable(exc) from None
        except httpx.DecodingError:
            raise _undecodable() from None

    async def capabilities_response(self) -> RawResponse:
        """The capabilities answer as received, whatever its status (for negotiation)."""
        return _Endpoint.raw(await self._send("GET", "capabilities"))

    async def capabilities(self) -> Capabilities:
        """What the server supports on this route."""
        body = _Endpoint.decode(await self._send("GET", "capabilities"))
        return parse_capabilities(body, route=self.route)

    async def search(
        self, query: str, *, limit: int = constants.SEARCH_MAX_RESULTS, run_id: str | None = None
    ) -> SearchResult:
        """Up to `limit` (≤ 3) hints for `query`; `run_id` binds the refs to a current run."""
        body = _Endpoint.search_body(query, limit, run_id)
        answer = _Endpoint.decode(await self._send("POST", "search", body))
        return parse_search(answer, route=self.route)

    async def read(
        self,
        ref: str,
        *,
        cursor: str | None = None,
        run_id: str | None = None,
        max_bytes: int | None = None,
    ) -> ReadPage:
        """One page of the referenced document; `max_bytes` bounds the whole answer."""
        body = _Endpoint.read_body(ref, cursor, run_id, max_bytes)
        answer = _Endpoint.decode(await self._send("POST", "read", body))
        return parse_read_page(answer, route=self.route, ref=ref)

    async def read_chain(
        self,
        ref: str,
        *,
        cursor: str | None = None,
        run_id: str | None = None,
        max_bytes: int | None = None,
    ) -> ReadChain:
        """Every page from the start (or from `cursor`) until `next_cursor` is null."""
        chain = ChainBuilder(ref, cursor)
        while True:
            page = await self.read(ref, cursor=cursor, run_id=run_id, max_bytes=max_bytes)
            cursor = chain.add(page)
            if cursor is None:
                return chain.build()
