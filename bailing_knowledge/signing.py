"""Short-lived, HMAC-signed knowledge references and read cursors.

A *reference* (``ref``) names one search hit: a document revision, the hash of its title and
body, and the character span of the hit. A *cursor* continues a read chain over the document
named by a ref. Both are opaque to clients, stateless (no table of issued tokens: any process
that shares ``SECRET_KEY`` can check them) and valid for ``REFERENCE_TTL_SECONDS``.

Wire format
-----------
A token is the unpadded base64url encoding of ``payload || tag``. Integers are unsigned and
big-endian; ``u8``/``u32``/``u64`` are 1, 4 and 8 bytes wide.

Reference payload (94 to 158 bytes with its tag, so at most 211 characters)::

    version          u8     = 1
    issued_at        u64    Unix seconds
    document_id      u64
    revision         u32
    hit_start        u32    character offsets of the hit in the document body
    hit_end          u32
    content_hash     32 B   raw SHA-256 of title and body (the full digest, not a prefix)
    scope_len        u8     <= 64
    scope_revision   scope_len B, UTF-8
    tag              32 B   HMAC-SHA256

Cursor payload (57 bytes with its tag: 76 characters)::

    version          u8     = 1
    issued_at        u64    Unix seconds
    offset           u32    where the next page starts
    consumed         u32    bytes of body already returned by this chain
    window_start     u32    the part of the body this chain may expose
    window_end       u32
    tag              32 B   HMAC-SHA256

The tag is HMAC-SHA256 over a sequence of parts, each prefixed with its length as a ``u32``:
the key label, the payload (version included), then the identity that is *bound but not
carried* -- client, session, principal, ``on_behalf_of``, route -- and the run (``0x00`` for
none, ``0x01`` followed by the run id otherwise). A cursor adds the SHA-256 of the exact ref
string it continues. Length prefixes make the encoding injective: ``("ab", "c")`` and
``("a", "bc")`` produce different MAC inputs.

Keys
----
One key per label (``SIGNING_LABEL_REFERENCE``, ``SIGNING_LABEL_CURSOR``), derived from
``settings.SECRET_KEY`` with HKDF-SHA256 and the label as ``info``. The setting is read on every
call. ``SECRET_KEY_FALLBACKS`` is deliberately ignored: after a rotation every outstanding ref
and cursor becomes invalid and agents search again, which costs one request; accepting old
keys would keep a leaked key useful for as long as it stays in the fallbacks.

Verification order
------------------
Strict base64url and length checks, version, then the MAC (compared in constant time); any
failure is :class:`ReferenceInvalid`. Only an authentic token reaches the clock: an
``issued_at`` more than ``REFERENCE_MAX_FUTURE_SKEW_SECONDS`` ahead is invalid, and an age
above ``REFERENCE_TTL_SECONDS`` is :class:`ReferenceExpired`. An age of exactly the TTL is
still valid. So a forged token is always "invalid", never "expired", and rejecting it costs no
database query.

Clocks are Unix timestamps in seconds (``int`` or ``float``, default ``time.time()``), passed
as ``now=`` to make tests deterministic.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
import re
import struct
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.encoding import force_bytes

from .constants import (
    REFERENCE_MAX_FUTURE_SKEW_SECONDS,
    REFERENCE_TTL_SECONDS,
    SIGNING_LABEL_CURSOR,
    SIGNING_LABEL_REFERENCE,
)

__all__ = [
    "CursorClaims",
    "Identity",
    "ReferenceClaims",
    "ReferenceExpired",
    "ReferenceInvalid",
    "SignatureError",
    "canonical_principal",
    "sign_cursor",
    "sign_reference",
    "verify_cursor",
    "verify_reference",
]

# Wire-format versions. A change of layout gets a new version (and, if keys must not be
# shared with the old layout, a new label in constants.py).
REFERENCE_VERSION = 1
CURSOR_VERSION = 1

# The scope revision is the only variable-length carried field; capping it keeps a ref
# compact enough for three hints to fit in a 4096-byte search response.
MAX_SCOPE_REVISION_BYTES = 64

_TAG_BYTES = 32
_U32_MAX = 2**32 - 1
_U64_MAX = 2**64 - 1

# version, issued_at, document_id, revision, hit_start, hit_end, content_hash, scope_len
_REF_HEADER = struct.Struct(">BQQIII32sB")
# version, issued_at, offset, consumed, window_start, window_end
_CURSOR_PAYLOAD = struct.Struct(">BQIIII")

_REF_MIN_BYTES = _REF_HEADER.size + _TAG_BYTES
_REF_MAX_BYTES = _REF_MIN_BYTES + MAX_SCOPE_REVISION_BYTES
_CURSOR_BYTES = _CURSOR_PAYLOAD.size + _TAG_BYTES

_BASE64URL = re.compile(r"[A-Za-z0-9_-]+")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def _encoded_length(n: int) -> int:
    """Length of the unpadded base64url text of `n` bytes."""
    return (4 * n + 2) // 3


_REF_MAX_CHARS = _encoded_length(_REF_MAX_BYTES)
_CURSOR_MAX_CHARS = _encoded_length(_CURSOR_BYTES)


# --- Errors -----------------------------------------------------------------------------------


class SignatureError(Exception):
    """A presented ref or cursor was refused; the message never quotes the token."""

    default_message = "The knowledge reference was refused."

    def __init__(self) -> None:
        super().__init__(self.default_message)

    def __reduce__(self) -> tuple[type[SignatureError], tuple[()]]:
        return (type(self), ())


class ReferenceInvalid(SignatureError):
    """Malformed, forged, of the wrong kind, or issued to another identity, route or run."""

    default_message = "The knowledge reference or cursor is not valid."


class ReferenceExpired(SignatureError):
    """Authentic, but older than the reference TTL."""

    default_message = "The knowledge reference or cursor has expired."


# --- Identity and claims ----------------------------------------------------------------------


def canonical_principal(
    *, id: str, tenant: str = "", roles: Iterable[str] = (), audience: str = ""
) -> str:
    """Return one string for a principal, the same for every equivalent description.

    Roles are a set, so their order and repetitions do not change the result; the result is
    canonical JSON, so distinct principals never share a string.
    """
    for name, value in (("id", id), ("tenant", tenant), ("audience", audience)):
        if not isinstance(value, str):
            raise TypeError(f"principal {name} must be a str")
    role_list = list(roles)
    if isinstance(roles, str) or not all(isinstance(role, str) for role in role_list):
        raise TypeError("principal roles must be an iterable of str")
    return json.dumps(
        {"audience": audience, "id": id, "roles": sorted(set(role_list)), "tenant": tenant},
        ensure_ascii=False,
        separators=(",", ":"),
        sort_keys=True,
    )


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a token is issued to. Bound into the MAC, never carried in the token.

    A token presented under any other identity fails its MAC and is invalid.
    """

    client: str
    session: str
    principal: str
    on_behalf_of: str
    route: str

    def __post_init__(self) -> None:
        for name in ("client", "session", "principal", "on_behalf_of", "route"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"Identity.{name} must be a str")

    @classmethod
    def for_session(cls, session: Any, route_key: str) -> Identity:
        """Build the identity of an `AgentSession` acting in the route `route_key`."""
        principal: Mapping[str, Any] = session.principal
        return cls(
            client=session.client.app_id,
            session=session.session_id,
            principal=canonical_principal(
                id=principal["id"],
                tenant=principal.get("tenant", ""),
                roles=principal.get("roles", ()),
                audience=principal.get("audience", ""),
            ),
            on_behalf_of=session.on_behalf_of or "",
            route=route_key,
        )


def _check_int(owner: str, name: str, value: Any, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}.{name} must be an int")
    if not 0 <= value <= maximum:
        raise ValueError(f"{owner}.{name} must be between 0 and {maximum}")


def _check_run_id(owner: str, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{owner}.run_id must be a str or None")


def _expiry(issued_at: int | None) -> datetime:
    if issued_at is None:
        raise ValueError("claims that were never signed have no expiry")
    return datetime.fromtimestamp(issued_at + REFERENCE_TTL_SECONDS, tz=UTC)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReferenceClaims:
    """What a ref asserts about one search hit.

    `run_id` is bound into the MAC (a ref used under another run, or outside its run, is
    invalid) but not carried: the caller presents it. The scope revision, revision and
    content hash are carried so that the caller can tell drift (409) from forgery (400).
    `issued_at` is None until signed; `sign_reference` fills it in.
    """

    run_id: str | None
    knowledge_scope_revision: str
    document_id: int
    revision: int
    content_hash: str
    hit_start: int
    hit_end: int
    issued_at: int | None = field(default=None)

    def __post_init__(self) -> None:
        owner = "ReferenceClaims"
        _check_run_id(owner, self.run_id)
        if not isinstance(self.knowledge_scope_revision, str):
            raise TypeError(f"{owner}.knowledge_scope_revision must be a str")
        if len(_utf8(self.knowledge_scope_revision)) > MAX_SCOPE_REVISION_BYTES:
            raise ValueError(
                f"{owner}.knowledge_scope_revision exceeds {MAX_SCOPE_REVISION_BYTES} bytes"
            )
        _check_int(owner, "document_id", self.document_id, _U64_MAX)
        _check_int(owner, "revision", self.revision, _U32_MAX)
        _check_int(owner, "hit_start", self.hit_start, _U32_MAX)
        _check_int(owner, "hit_end", self.hit_end, _U32_MAX)
        if self.hit_start > self.hit_end:
            raise ValueError(f"{owner}.hit_start must not exceed hit_end")
        if not isinstance(self.content_hash, str) or not _SHA256_HEX.fullmatch(self.content_hash):
            raise ValueError(f"{owner}.content_hash must be 64 lowercase hex digits")
        if self.issued_at is not None:
            _check_int(owner, "issued_at", self.issued_at, _U64_MAX)

    @property
    def expires_at(self) -> datetime:
        """The last instant (UTC) at which the ref is still accepted (an age of exactly the TTL)."""
        return _expiry(self.issued_at)


@dataclass(frozen=True, slots=True, kw_only=True)
class CursorClaims:
    """Where a read chain stands. Bound to the exact ref string it continues and the run.

    `offset`, `window_start` and `window_end` are positions in the document body (the read
    service chooses the unit and must use the same one throughout); `consumed` counts bytes of
    body the chain has already returned.
    """

    ref: str
    run_id: str | None
    offset: int
    consumed: int
    window_start: int
    window_end: int
    issued_at: int | None = field(default=None)

    def __post_init__(self) -> None:
        owner = "CursorClaims"
        if not isinstance(self.ref, str):
            raise TypeError(f"{owner}.ref must be a str")
        _check_run_id(owner, self.run_id)
        _check_int(owner, "offset", self.offset, _U32_MAX)
        _check_int(owner, "consumed", self.consumed, _U32_MAX)
        _check_int(owner, "window_start", self.window_start, _U32_MAX)
        _check_int(owner, "window_end", self.window_end, _U32_MAX)
        if self.window_start > self.window_end:
            raise ValueError(f"{owner}.window_start must not exceed window_end")
        if self.issued_at is not None:
            _check_int(owner, "issued_at", self.issued_at, _U64_MAX)

    @property
    def expires_at(self) -> datetime:
        """The last instant (UTC) at which the cursor is still accepted."""
        return _expiry(self.issued_at)


# --- Keys and encoding ------------------------------------------------------------------------


def _derive_key(label: str) -> bytes:
    """Derive the HMAC key for `label` from the current `SECRET_KEY`.

    `SECRET_KEY` is read on every call, so `override_settings` and rotations take effect at
    once: the derived keys are remembered by secret and label. Fallback keys are never
    consulted.
    """
    secret = getattr(settings, "SECRET_KEY", "")
    if not secret:
        raise ImproperlyConfigured(
            "bailing_knowledge needs a non-empty SECRET_KEY to sign references."
        )
    return _hkdf(force_bytes(secret), label)


@lru_cache(maxsize=8)
def _hkdf(secret: bytes, label: str) -> bytes:
    # A search signs three references; each derivation builds an HKDF and runs two HMACs.
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=label.encode("ascii"))
    return hkdf.derive(secret)


def _utf8(text: str) -> bytes:
    # surrogatepass keeps the encoding total and still injective for any Python str.
    return text.encode("utf-8", "surrogatepass")


def _framed(parts: Iterable[bytes]) -> bytes:
    return b"".join(len(part).to_bytes(4, "big") + part for part in parts)


def _optional(text: str | None) -> bytes:
    return b"\x00" if text is None else b"\x01" + _utf8(text)


def _ref_digest(ref: str) -> bytes:
    return hashlib.sha256(_utf8(ref)).digest()


def _mac(key: bytes, label: str, payload: bytes, identity: Identity, *bound: bytes) -> bytes:
    message = _framed(
        (
            label.encode("ascii"),
            payload,
            _utf8(identity.client),
            _utf8(identity.session),
            _utf8(identity.principal),
            _utf8(identity.on_behalf_of),
            _utf8(identity.route),
            *bound,
        )
    )
    return hmac.new(key, message, hashlib.sha256).digest()


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64decode_strict(token: Any, max_chars: int) -> bytes:
    """Decode unpadded base64url, refusing anything `_b64encode` would not have produced."""
    if not isinstance(token, str) or not 0 < len(token) <= max_chars:
        raise ReferenceInvalid from None
    if not _BASE64URL.fullmatch(token) or len(token) % 4 == 1:
        raise ReferenceInvalid from None
    try:
        data = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):
        raise ReferenceInvalid from None
    # Unused low bits in the last character would let several strings decode to one token.
    if _b64encode(data) != token:
        raise ReferenceInvalid from None
    return data


def _unix_now(now: float | None) -> float:
    if now is None:
        return time.time()
    if isinstance(now, bool) or not isinstance(now, int | float) or not math.isfinite(now):
        raise TypeError("now must be a finite Unix timestamp in seconds")
    return float(now)


def _stamp(issued_at: int | None, now: float | None) -> int:
    return issued_at if issued_at is not None else math.floor(_unix_now(now))


def _check_clock(issued_at: int, now: float | None) -> None:
    current = _unix_now(now)
    age = current - issued_at
    if age < -REFERENCE_MAX_FUTURE_SKEW_SECONDS:
        raise ReferenceInvalid
    if age > REFERENCE_TTL_SECONDS:
        raise ReferenceExpired


# --- References -------------------------------------------------------------------------------


def sign_reference(identity: Identity, ref: ReferenceClaims, *, now: float | None = None) -> str:
    """Return the opaque ref for a search hit issued to `identity`.

    `ref.issued_at` is used when set (so the caller can report `ref.expires_at` for exactly
    the token it got); otherwise the token is stamped with `now` (default: the current time).
    """
    key = _derive_key(SIGNING_LABEL_REFERENCE)
    scope = _utf8(ref.knowledge_scope_revision)
    payload = (
        _REF_HEADER.pack(
            REFERENCE_VERSION,
            _stamp(ref.issued_at, now),
            ref.document_id,
            ref.revision,
            ref.hit_start,
            ref.hit_end,
            bytes.fromhex(ref.content_hash),
            len(scope),
        )
        + scope
    )
    tag = _mac(key, SIGNING_LABEL_REFERENCE, payload, identity, _optional(ref.run_id))
    return _b64encode(payload + tag)


def verify_reference(
    token: str, identity: Identity, *, run_id: str | None, now: float | None = None
) -> ReferenceClaims:
    """Return the claims of an authentic, current ref presented by `identity` in `run_id`.

    Raises `ReferenceInvalid` (malformed, forged, cursor, another identity or run, issued in
    the future) or `ReferenceExpired` (authentic but older than the TTL). Checks nothing in the
    database: comparing scope revision, revision and content hash is the caller's job.
    """
    key = _derive_key(SIGNING_LABEL_REFERENCE)
    data = _b64decode_strict(token, _REF_MAX_CHARS)
    if not _REF_MIN_BYTES <= len(data) <= _REF_MAX_BYTES:
        raise ReferenceInvalid
    payload, tag = data[:-_TAG_BYTES], data[-_TAG_BYTES:]
    version, issued_at, document_id, revision, start, end, digest, scope_len = (
        _REF_HEADER.unpack_from(payload)
    )
    if version != REFERENCE_VERSION or len(payload) != _REF_HEADER.size + scope_len:
        raise ReferenceInvalid
    expected = _mac(key, SIGNING_LABEL_REFERENCE, payload, identity, _optional(run_id))
    if not hmac.compare_digest(tag, expected):
        raise ReferenceInvalid
    _check_clock(issued_at, now)
    try:
        return ReferenceClaims(
            run_id=run_id,
            knowledge_scope_revision=payload[_REF_HEADER.size :].decode("utf-8", "surrogatepass"),
            document_id=document_id,
            revision=revision,
            content_hash=digest.hex(),
            hit_start=start,
            hit_end=end,
            issued_at=issued_at,
        )
    except (TypeError, ValueError):
        # Only reachable if a token signed with this key was built outside sign_reference.
        raise ReferenceInvalid from None


# --- Cursors ----------------------------------------------------------------------------------


def sign_cursor(identity: Identity, claims: CursorClaims, *, now: float | None = None) -> str:
    """Return the opaque `next_cursor` continuing `claims.ref` for `identity`.

    `claims.issued_at` is used when set, otherwise `now` (default: the current time).
    """
    key = _derive_key(SIGNING_LABEL_CURSOR)
    payload = _CURSOR_PAYLOAD.pack(
        CURSOR_VERSION,
        _stamp(claims.issued_at, now),
        claims.offset,
        claims.consumed,
        claims.window_start,
        claims.window_end,
    )
    tag = _mac(
        key,
        SIGNING_LABEL_CURSOR,
        payload,
        identity,
        _optional(claims.run_id),
        _ref_digest(claims.ref),
    )
    return _b64encode(payload + tag)


def verify_cursor(
    token: str,
    identity: Identity,
    *,
    ref: str,
    run_id: str | None,
    now: float | None = None,
) -> CursorClaims:
    """Return the claims of an authentic, current cursor continuing `ref` in `run_id`.

    `ref` must be the exact ref string presented with the cursor; verify it separately with
    `verify_reference` (a cursor does not extend the life of its ref). Raises like
    `verify_reference`.
    """
    key = _derive_key(SIGNING_LABEL_CURSOR)
    data = _b64decode_strict(token, _CURSOR_MAX_CHARS)
    if len(data) != _CURSOR_BYTES or not isinstance(ref, str):
        raise ReferenceInvalid
    payload, tag = data[:-_TAG_BYTES], data[-_TAG_BYTES:]
    version, issued_at, offset, consumed, window_start, window_end = _CURSOR_PAYLOAD.unpack(payload)
    if version != CURSOR_VERSION:
        raise ReferenceInvalid
    expected = _mac(
        key, SIGNING_LABEL_CURSOR, payload, identity, _optional(run_id), _ref_digest(ref)
    )
    if not hmac.compare_digest(tag, expected):
        raise ReferenceInvalid
    _check_clock(issued_at, now)
    try:
        return CursorClaims(
            ref=ref,
            run_id=run_id,
            offset=offset,
            consumed=consumed,
            window_start=window_start,
            window_end=window_end,
            issued_at=issued_at,
        )
    except (TypeError, ValueError):
        raise ReferenceInvalid from None
