"""Signed references and cursors: wire format, binding, clock, keys. No database needed."""

from __future__ import annotations

import dataclasses
import pickle
import string
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from django.core.exceptions import ImproperlyConfigured
from hypothesis import assume, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from bailing_knowledge import signing
from bailing_knowledge.constants import (
    REFERENCE_MAX_FUTURE_SKEW_SECONDS,
    REFERENCE_TTL_SECONDS,
    SEARCH_MAX_RESULTS,
    SIGNING_LABEL_CURSOR,
    SIGNING_LABEL_REFERENCE,
)
from bailing_knowledge.signing import (
    CursorClaims,
    Identity,
    ReferenceClaims,
    ReferenceExpired,
    ReferenceInvalid,
    SignatureError,
    canonical_principal,
    sign_cursor,
    sign_reference,
    verify_cursor,
    verify_reference,
)

T0 = 1_750_000_000  # a fixed "now" for every test that does not vary the clock
RUN = "run_AbCdEfGhIjKlMnOpQrStUv"
HASH = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
B64URL = string.ascii_letters + string.digits + "-_"


@pytest.fixture
def identity() -> Identity:
    return Identity(
        client="acme-agent",
        session="ses_0123456789abcdefghijkl",
        principal=canonical_principal(
            id="user-1", tenant="acme", roles=["support"], audience="staff"
        ),
        on_behalf_of="",
        route="order-assistant",
    )


@pytest.fixture
def claims() -> ReferenceClaims:
    return ReferenceClaims(
        run_id=RUN,
        knowledge_scope_revision="ksr_" + "0123456789abcdef" * 2,
        document_id=42,
        revision=3,
        content_hash=HASH,
        hit_start=120,
        hit_end=980,
    )


@pytest.fixture
def ref(identity: Identity, claims: ReferenceClaims) -> str:
    return sign_reference(identity, claims, now=T0)


@pytest.fixture
def cursor_claims(ref: str) -> CursorClaims:
    return CursorClaims(
        ref=ref, run_id=RUN, offset=16000, consumed=16000, window_start=0, window_end=131072
    )


@pytest.fixture
def cursor(identity: Identity, cursor_claims: CursorClaims) -> str:
    return sign_cursor(identity, cursor_claims, now=T0)


def _replace_char(token: str, index: int) -> str:
    other = B64URL[(B64URL.index(token[index]) + 1) % len(B64URL)]
    return token[:index] + other + token[index + 1 :]


# --- Round trips ------------------------------------------------------------------------------


def test_reference_round_trips(identity, claims, ref):
    verified = verify_reference(ref, identity, run_id=RUN, now=T0)
    assert verified == dataclasses.replace(claims, issued_at=T0)
    assert verified.expires_at == datetime.fromtimestamp(T0 + REFERENCE_TTL_SECONDS, tz=UTC)


def test_cursor_round_trips(identity, ref, cursor_claims, cursor):
    verified = verify_cursor(cursor, identity, ref=ref, run_id=RUN, now=T0)
    assert verified == dataclasses.replace(cursor_claims, issued_at=T0)


def test_reference_without_run_round_trips(identity, claims):
    unbound = dataclasses.replace(claims, run_id=None)
    token = sign_reference(identity, unbound, now=T0)
    assert verify_reference(token, identity, run_id=None, now=T0).run_id is None


def test_sign_keeps_an_explicit_issued_at(identity, claims):
    token = sign_reference(identity, dataclasses.replace(claims, issued_at=T0 - 10), now=T0)
    assert verify_reference(token, identity, run_id=RUN, now=T0).issued_at == T0 - 10


def test_sign_floors_a_fractional_clock(identity, claims):
    token = sign_reference(identity, claims, now=T0 + 0.999)
    assert verify_reference(token, identity, run_id=RUN, now=T0).issued_at == T0


def test_default_clock_is_current_time(identity, claims):
    token = sign_reference(identity, claims)
    assert verify_reference(token, identity, run_id=RUN).issued_at is not None


def test_unsigned_claims_have_no_expiry(claims):
    with pytest.raises(ValueError):
        _ = claims.expires_at


def test_tokens_are_base64url_without_padding(ref, cursor):
    for token in (ref, cursor):
        assert set(token) <= set(B64URL)


# --- Tampering and strict decoding ------------------------------------------------------------


def test_reference_rejects_every_single_character_change(identity, ref):
    for index in range(len(ref)):
        with pytest.raises(ReferenceInvalid):
            verify_reference(_replace_char(ref, index), identity, run_id=RUN, now=T0)


def test_cursor_rejects_every_single_character_change(identity, ref, cursor):
    for index in range(len(cursor)):
        with pytest.raises(ReferenceInvalid):
            verify_cursor(_replace_char(cursor, index), identity, ref=ref, run_id=RUN, now=T0)


@pytest.mark.parametrize(
    "mangle",
    [
        pytest.param(lambda t: t + "=", id="padding"),
        pytest.param(lambda t: t + "==", id="double-padding"),
        pytest.param(lambda t: t[:-1] + "+", id="standard-alphabet-plus"),
        pytest.param(lambda t: t[:10] + "/" + t[11:], id="standard-alphabet-slash"),
        pytest.param(lambda t: t + "\n", id="trailing-newline"),
        pytest.param(lambda t: " " + t, id="leading-space"),
        pytest.param(lambda t: t[:5] + "é" + t[6:], id="non-ascii"),
        pytest.param(lambda t: t[:-1], id="truncated"),
        pytest.param(lambda t: t + "A", id="extended"),
        pytest.param(lambda t: t + "AAAA", id="extra-bytes"),
        pytest.param(lambda t: t * 3, id="oversized"),
        pytest.param(lambda t: "", id="empty"),
    ],
)
def test_reference_decoding_is_strict(identity, ref, mangle):
    with pytest.raises(ReferenceInvalid):
        verify_reference(mangle(ref), identity, run_id=RUN, now=T0)


def test_reference_rejects_non_canonical_final_character(identity, ref):
    # The ref's byte length leaves unused low bits in its last character; setting them gives
    # a string that a lenient decoder maps to the same bytes.
    payload = signing._b64decode_strict(ref, 1000)
    assert len(payload) % 3 != 0
    last = B64URL.index(ref[-1])
    variant = ref[:-1] + B64URL[last | 1]
    if variant == ref:
        variant = ref[:-1] + B64URL[last & ~1]
    assert variant != ref
    with pytest.raises(ReferenceInvalid):
        verify_reference(variant, identity, run_id=RUN, now=T0)


@pytest.mark.parametrize("token", [None, b"abcd", 1234, ["abcd"]])
def test_reference_rejects_non_string_tokens(identity, token):
    with pytest.raises(ReferenceInvalid):
        verify_reference(token, identity, run_id=RUN, now=T0)


def test_reference_rejects_an_unknown_version_even_with_a_valid_mac(identity, ref):
    data = signing._b64decode_strict(ref, 1000)
    payload = bytes([signing.REFERENCE_VERSION + 1]) + data[1 : -signing._TAG_BYTES]
    key = signing._derive_key(SIGNING_LABEL_REFERENCE)
    tag = signing._mac(key, SIGNING_LABEL_REFERENCE, payload, identity, signing._optional(RUN))
    with pytest.raises(ReferenceInvalid):
        verify_reference(signing._b64encode(payload + tag), identity, run_id=RUN, now=T0)


# --- Domain separation ------------------------------------------------------------------------


def test_read_rejects_reference_presented_as_cursor(identity, ref):
    with pytest.raises(ReferenceInvalid):
        verify_cursor(ref, identity, ref=ref, run_id=RUN, now=T0)


def test_read_rejects_cursor_presented_as_reference(identity, cursor):
    with pytest.raises(ReferenceInvalid):
        verify_reference(cursor, identity, run_id=RUN, now=T0)


def test_reference_and_cursor_keys_differ():
    assert signing._derive_key(SIGNING_LABEL_REFERENCE) != signing._derive_key(SIGNING_LABEL_CURSOR)


def test_reference_layout_tagged_with_the_cursor_key_is_invalid(identity, ref):
    # Even a token with a perfect ref layout fails when its tag comes from the cursor key.
    payload = signing._b64decode_strict(ref, 1000)[: -signing._TAG_BYTES]
    key = signing._derive_key(SIGNING_LABEL_CURSOR)
    tag = signing._mac(key, SIGNING_LABEL_REFERENCE, payload, identity, signing._optional(RUN))
    with pytest.raises(ReferenceInvalid):
        verify_reference(signing._b64encode(payload + tag), identity, run_id=RUN, now=T0)


# --- Binding ----------------------------------------------------------------------------------

OTHER_IDENTITY_FIELDS = {
    "client": "other-agent",
    "session": "ses_zzzzzzzzzzzzzzzzzzzzzz",
    "principal": canonical_principal(
        id="user-2", tenant="acme", roles=["support"], audience="staff"
    ),
    "on_behalf_of": "someone-else",
    "route": "billing-assistant",
}


@pytest.mark.parametrize(("name", "value"), OTHER_IDENTITY_FIELDS.items())
def test_reference_is_invalid_for_another_identity(identity, ref, name, value):
    other = dataclasses.replace(identity, **{name: value})
    with pytest.raises(ReferenceInvalid):
        verify_reference(ref, other, run_id=RUN, now=T0)


@pytest.mark.parametrize(("name", "value"), OTHER_IDENTITY_FIELDS.items())
def test_cursor_is_invalid_for_another_identity(identity, ref, cursor, name, value):
    other = dataclasses.replace(identity, **{name: value})
    with pytest.raises(ReferenceInvalid):
        verify_cursor(cursor, other, ref=ref, run_id=RUN, now=T0)


@pytest.mark.parametrize("run_id", [None, "", "run_other", RUN + "x"])
def test_reference_is_invalid_in_another_run(identity, ref, run_id):
    with pytest.raises(ReferenceInvalid):
        verify_reference(ref, identity, run_id=run_id, now=T0)


def test_unbound_reference_is_invalid_inside_a_run(identity, claims):
    token = sign_reference(identity, dataclasses.replace(claims, run_id=None), now=T0)
    for run_id in ("", RUN):
        with pytest.raises(ReferenceInvalid):
            verify_reference(token, identity, run_id=run_id, now=T0)


@pytest.mark.parametrize("run_id", [None, "", "run_other"])
def test_cursor_is_invalid_in_another_run(identity, ref, cursor, run_id):
    with pytest.raises(ReferenceInvalid):
        verify_cursor(cursor, identity, ref=ref, run_id=run_id, now=T0)


def test_cursor_is_invalid_with_another_ref(identity, claims, cursor):
    other_ref = sign_reference(identity, dataclasses.replace(claims, hit_start=0), now=T0)
    with pytest.raises(ReferenceInvalid):
        verify_cursor(cursor, identity, ref=other_ref, run_id=RUN, now=T0)


def test_cursor_is_invalid_with_the_same_ref_reissued_later(identity, claims, cursor):
    # The cursor binds the exact ref string, not the hit it names.
    reissued = sign_reference(identity, claims, now=T0 + 1)
    with pytest.raises(ReferenceInvalid):
        verify_cursor(cursor, identity, ref=reissued, run_id=RUN, now=T0)


def test_binding_is_injective_across_field_boundaries(identity, claims):
    left = dataclasses.replace(identity, client="ab", session="c")
    right = dataclasses.replace(identity, client="a", session="bc")
    token = sign_reference(left, claims, now=T0)
    with pytest.raises(ReferenceInvalid):
        verify_reference(token, right, run_id=RUN, now=T0)
    shifted = dataclasses.replace(identity, route="order-assistant" + "x", on_behalf_of="")
    moved = dataclasses.replace(identity, route="order-assistant", on_behalf_of="x")
    with pytest.raises(ReferenceInvalid):
        verify_reference(sign_reference(shifted, claims, now=T0), moved, run_id=RUN, now=T0)


def test_framing_is_injective():
    assert signing._framed([b"ab", b"c"]) != signing._framed([b"a", b"bc"])
    assert signing._framed([b"", b"a"]) != signing._framed([b"a", b""])
    assert signing._optional(None) != signing._optional("")


def test_canonical_principal_ignores_role_order_and_repeats():
    one = canonical_principal(id="u", tenant="t", roles=["b", "a", "a"], audience="x")
    assert one == canonical_principal(id="u", tenant="t", roles=("a", "b"), audience="x")
    assert one != canonical_principal(id="u", tenant="t", roles=["a"], audience="x")
    assert canonical_principal(id="a,b") != canonical_principal(id="a", tenant="b")


def test_canonical_principal_refuses_a_string_for_roles():
    with pytest.raises(TypeError):
        canonical_principal(id="u", roles="admin")


def test_identity_for_session_reads_the_session_fields():
    session = SimpleNamespace(
        client=SimpleNamespace(app_id="acme-agent"),
        session_id="ses_1",
        principal={"id": "user-1", "tenant": "acme", "roles": ["b", "a"], "audience": "staff"},
        on_behalf_of="",
    )
    assert Identity.for_session(session, "orders") == Identity(
        client="acme-agent",
        session="ses_1",
        principal=canonical_principal(
            id="user-1", tenant="acme", roles=["a", "b"], audience="staff"
        ),
        on_behalf_of="",
        route="orders",
    )


# --- Clock ------------------------------------------------------------------------------------


def test_reference_is_valid_at_exactly_the_ttl(identity, ref):
    verify_reference(ref, identity, run_id=RUN, now=T0 + REFERENCE_TTL_SECONDS)


def test_reference_expires_just_after_the_ttl(identity, ref):
    with pytest.raises(ReferenceExpired):
        verify_reference(ref, identity, run_id=RUN, now=T0 + REFERENCE_TTL_SECONDS + 0.001)
    with pytest.raises(ReferenceExpired):
        verify_reference(ref, identity, run_id=RUN, now=T0 + REFERENCE_TTL_SECONDS + 1)


def test_cursor_expires_like_a_reference(identity, ref, cursor):
    verify_cursor(cursor, identity, ref=ref, run_id=RUN, now=T0 + 300)
    with pytest.raises(ReferenceExpired):
        verify_cursor(cursor, identity, ref=ref, run_id=RUN, now=T0 + 301)


def test_reference_tolerates_sixty_seconds_of_clock_skew(identity, ref):
    verify_reference(ref, identity, run_id=RUN, now=T0 - REFERENCE_MAX_FUTURE_SKEW_SECONDS)


def test_reference_issued_too_far_in_the_future_is_invalid(identity, ref, cursor):
    now = T0 - REFERENCE_MAX_FUTURE_SKEW_SECONDS - 1
    with pytest.raises(ReferenceInvalid):
        verify_reference(ref, identity, run_id=RUN, now=now)
    with pytest.raises(ReferenceInvalid):
        verify_cursor(cursor, identity, ref=ref, run_id=RUN, now=now)


def test_forged_expired_reference_is_invalid_not_expired(identity, ref):
    late = T0 + 10 * REFERENCE_TTL_SECONDS
    with pytest.raises(ReferenceInvalid):
        verify_reference(_replace_char(ref, 20), identity, run_id=RUN, now=late)
    with pytest.raises(ReferenceInvalid):
        verify_reference(ref, identity, run_id="run_other", now=late)


def test_forged_expired_cursor_is_invalid_not_expired(identity, ref, cursor):
    late = T0 + 10 * REFERENCE_TTL_SECONDS
    with pytest.raises(ReferenceInvalid):
        verify_cursor(_replace_char(cursor, 3), identity, ref=ref, run_id=RUN, now=late)


@pytest.mark.parametrize("now", [datetime.now(tz=UTC), "1750000000", True, float("nan")])
def test_clock_must_be_a_unix_timestamp(identity, ref, now):
    with pytest.raises(TypeError):
        verify_reference(ref, identity, run_id=RUN, now=now)


# --- Keys -------------------------------------------------------------------------------------


def test_rotated_secret_key_does_not_honour_fallbacks(settings, identity, claims):
    settings.SECRET_KEY = "old-secret-key-old-secret-key-old-secret-key"
    token = sign_reference(identity, claims, now=T0)
    settings.SECRET_KEY = "new-secret-key-new-secret-key-new-secret-key"
    settings.SECRET_KEY_FALLBACKS = ["old-secret-key-old-secret-key-old-secret-key"]
    with pytest.raises(ReferenceInvalid):
        verify_reference(token, identity, run_id=RUN, now=T0)


def test_secret_key_is_read_at_call_time(settings, identity, claims):
    settings.SECRET_KEY = "first-key-first-key-first-key-first-key"
    first = sign_reference(identity, claims, now=T0)
    settings.SECRET_KEY = "second-key-second-key-second-key-second-key"
    assert sign_reference(identity, claims, now=T0) != first
    settings.SECRET_KEY = "first-key-first-key-first-key-first-key"
    verify_reference(first, identity, run_id=RUN, now=T0)


def test_empty_secret_key_is_refused(settings, identity, claims, ref, cursor_claims, cursor):
    settings.SECRET_KEY = ""
    with pytest.raises(ImproperlyConfigured):
        sign_reference(identity, claims, now=T0)
    with pytest.raises(ImproperlyConfigured):
        verify_reference(ref, identity, run_id=RUN, now=T0)
    with pytest.raises(ImproperlyConfigured):
        sign_cursor(identity, cursor_claims, now=T0)
    with pytest.raises(ImproperlyConfigured):
        verify_cursor(cursor, identity, ref=ref, run_id=RUN, now=T0)


# --- Errors -----------------------------------------------------------------------------------


def _failures(identity, ref, cursor):
    """Each way verification can fail, with the token that was presented."""
    late = T0 + 10 * REFERENCE_TTL_SECONDS
    yield ref, lambda: verify_reference(ref, identity, run_id=RUN, now=late)
    yield ref, lambda: verify_reference(ref, identity, run_id="run_x", now=T0)
    yield ref, lambda: verify_reference(ref + "=", identity, run_id=RUN, now=T0)
    yield ref, lambda: verify_reference(ref[:-4], identity, run_id=RUN, now=T0)
    yield ref, lambda: verify_reference(ref * 2, identity, run_id=RUN, now=T0)
    yield cursor, lambda: verify_cursor(cursor, identity, ref=ref, run_id=RUN, now=late)
    yield cursor, lambda: verify_cursor(cursor + "!", identity, ref=ref, run_id=RUN, now=T0)
    yield cursor, lambda: verify_cursor(cursor, identity, ref="x", run_id=RUN, now=T0)


def test_error_messages_never_echo_the_token(identity, ref, cursor):
    for token, attempt in _failures(identity, ref, cursor):
        with pytest.raises(SignatureError) as excinfo:
            attempt()
        exc = excinfo.value
        rendered = " ".join([str(exc), repr(exc), *map(str, exc.args)])
        for start in range(0, len(token) - 8):
            assert token[start : start + 8] not in rendered
        assert exc.__cause__ is None
        assert str(exc) in {ReferenceInvalid.default_message, ReferenceExpired.default_message}


def test_errors_pickle_without_gaining_detail():
    for cls in (ReferenceInvalid, ReferenceExpired):
        copy = pickle.loads(pickle.dumps(cls()))  # noqa: S301 - our own bytes
        assert type(copy) is cls
        assert str(copy) == cls.default_message


def test_errors_share_a_base_class():
    assert issubclass(ReferenceInvalid, SignatureError)
    assert issubclass(ReferenceExpired, SignatureError)
    assert not issubclass(ReferenceExpired, ReferenceInvalid)


# --- Size and claim validation ----------------------------------------------------------------


def test_reference_stays_compact_with_maximal_values():
    long_id = "x" * 64
    identity = Identity(
        client=long_id,
        session=long_id,
        principal=canonical_principal(
            id=long_id, tenant=long_id, roles=[long_id] * 8, audience=long_id
        ),
        on_behalf_of=long_id,
        route=long_id,
    )
    claims = ReferenceClaims(
        run_id=long_id,
        knowledge_scope_revision="k" * signing.MAX_SCOPE_REVISION_BYTES,
        document_id=2**63 - 1,
        revision=2**31 - 1,
        content_hash="f" * 64,
        hit_start=2**32 - 2,
        hit_end=2**32 - 1,
        issued_at=2**40,
    )
    token = sign_reference(identity, claims)
    assert len(token.encode("ascii")) < 300
    # Three hints' refs leave most of the 4096-byte search budget to titles and summaries.
    assert SEARCH_MAX_RESULTS * len(token) < 700


def test_cursor_is_compact(cursor):
    assert len(cursor) == 76


@pytest.mark.parametrize(
    "changes",
    [
        {"document_id": -1},
        {"document_id": 2**64},
        {"revision": 2**32},
        {"hit_start": 10, "hit_end": 9},
        {"hit_start": True},
        {"document_id": 1.0},
        {"content_hash": HASH.upper()},
        {"content_hash": HASH[:-2]},
        {"knowledge_scope_revision": "k" * 65},
        {"knowledge_scope_revision": "é" * 33},
        {"run_id": 7},
        {"issued_at": -1},
    ],
)
def test_reference_claims_refuse_values_the_wire_cannot_carry(claims, changes):
    with pytest.raises((TypeError, ValueError)):
        dataclasses.replace(claims, **changes)


@pytest.mark.parametrize(
    "changes",
    [
        {"offset": -1},
        {"consumed": 2**32},
        {"window_start": 5, "window_end": 4},
        {"ref": None},
        {"run_id": b"run"},
    ],
)
def test_cursor_claims_refuse_values_the_wire_cannot_carry(cursor_claims, changes):
    with pytest.raises((TypeError, ValueError)):
        dataclasses.replace(cursor_claims, **changes)


def test_identity_fields_must_be_strings(identity):
    with pytest.raises(TypeError):
        dataclasses.replace(identity, client=7)


# --- Properties -------------------------------------------------------------------------------

# Any code point, lone surrogates included: the encoding must stay total and injective.
texts = st.text(st.characters(exclude_categories=()), max_size=24)
identities = st.builds(
    Identity,
    client=texts,
    session=texts,
    principal=texts,
    on_behalf_of=texts,
    route=texts,
)
run_ids = st.none() | texts
spans = st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)).map(sorted)
reference_claims = st.builds(
    lambda run_id, scope, doc, rev, digest, span, issued: ReferenceClaims(
        run_id=run_id,
        knowledge_scope_revision=scope,
        document_id=doc,
        revision=rev,
        content_hash=digest.hex(),
        hit_start=span[0],
        hit_end=span[1],
        issued_at=issued,
    ),
    run_ids,
    st.text(st.characters(exclude_categories=()), max_size=16),  # <= 64 UTF-8 bytes
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**32 - 1),
    st.binary(min_size=32, max_size=32),
    spans,
    st.integers(0, 2**40),
)
cursor_claims_strategy = st.builds(
    lambda ref, run_id, offset, consumed, window, issued: CursorClaims(
        ref=ref,
        run_id=run_id,
        offset=offset,
        consumed=consumed,
        window_start=window[0],
        window_end=window[1],
        issued_at=issued,
    ),
    texts,
    run_ids,
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
    spans,
    st.integers(0, 2**40),
)
fast = hypothesis_settings(deadline=None, max_examples=200)


@fast
@given(identity=identities, claims=reference_claims)
def test_any_reference_round_trips(identity, claims):
    token = sign_reference(identity, claims)
    assert len(token) < 300
    now = claims.issued_at
    assert verify_reference(token, identity, run_id=claims.run_id, now=now) == claims


@fast
@given(identity=identities, other=identities, claims=reference_claims)
def test_any_reference_fails_under_another_identity(identity, other, claims):
    assume(identity != other)
    token = sign_reference(identity, claims)
    with pytest.raises(ReferenceInvalid):
        verify_reference(token, other, run_id=claims.run_id, now=claims.issued_at)


@fast
@given(identity=identities, claims=reference_claims, other_run=run_ids)
def test_any_reference_fails_in_another_run(identity, claims, other_run):
    assume(other_run != claims.run_id)
    token = sign_reference(identity, claims)
    with pytest.raises(ReferenceInvalid):
        verify_reference(token, identity, run_id=other_run, now=claims.issued_at)


@fast
@given(identity=identities, claims=cursor_claims_strategy)
def test_any_cursor_round_trips(identity, claims):
    token = sign_cursor(identity, claims)
    verified = verify_cursor(
        token, identity, ref=claims.ref, run_id=claims.run_id, now=claims.issued_at
    )
    assert verified == claims


@fast
@given(
    identity=identities,
    other=identities,
    claims=cursor_claims_strategy,
    other_ref=texts,
    other_run=run_ids,
)
def test_any_cursor_fails_under_another_identity_ref_or_run(
    identity, other, claims, other_ref, other_run
):
    assume((identity, claims.ref, claims.run_id) != (other, other_ref, other_run))
    token = sign_cursor(identity, claims)
    with pytest.raises(ReferenceInvalid):
        verify_cursor(token, other, ref=other_ref, run_id=other_run, now=claims.issued_at)


@fast
@given(identity=identities, claims=reference_claims)
def test_any_reference_is_never_a_cursor(identity, claims):
    token = sign_reference(identity, claims)
    with pytest.raises(ReferenceInvalid):
        verify_cursor(token, identity, ref=token, run_id=claims.run_id, now=claims.issued_at)
