"""Settle tokens as pure functions (`domain.settle_tokens`): mint, verify, single use,
the principal a token acts for and the promise instance it is bound to."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from troth.errors import Reason
from troth_server.domain import settle_tokens as tokens
from troth_server.domain.access import Principal, Role
from troth_server.domain.promise import Payload, Promise, PromiseState
from troth_server.domain.settle_tokens import Keyring, KeysInvalid, parse_keys, verify

K1, K2 = b"1" * 32, b"2" * 32
RING = Keyring({"k1": K1, "k2": K2}, active="k2")
NOW = 1_800_000_000_000
TID = b"\x00" * 12
INSTANCE = 4_242
BOB = Principal("bob", frozenset({Role.GATEWAY}))
ids = st.text(st.sampled_from("abcXYZ0189._-:/"), min_size=1, max_size=40)
names = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=40)
role_sets = st.frozensets(st.sampled_from(list(Role)))
instances = st.integers(0, tokens.MAX_INSTANCE)
outcome_sets = st.sampled_from(
    [
        frozenset({PromiseState.RESOLVED}),
        frozenset({PromiseState.REJECTED}),
        tokens.OUTCOMES,
    ]
)
settle_states = st.sampled_from([PromiseState.RESOLVED, PromiseState.REJECTED])


def _reason(exc: pytest.ExceptionInfo[tokens.SettleTokenError]) -> Reason:
    return exc.value.reason


def mint(
    ring: Keyring,
    promise_id: str,
    outcomes: object,
    expire_time: int,
    token_id: bytes,
    acts_for: Principal = BOB,
    instance: int = INSTANCE,
) -> tuple[str, tokens.SettleToken]:
    return tokens.mint(ring, (promise_id, instance), outcomes, expire_time, token_id, acts_for)  # type: ignore[arg-type]


@given(
    ids,
    outcome_sets,
    st.integers(1, 10**6),
    st.binary(min_size=12, max_size=12),
    names.filter(tokens.is_principal_name),
    role_sets,
    instances,
    st.frozensets(st.sampled_from(["payouts:approve", "a", "api://x/Y.Z"]), max_size=3),
)
def test_a_minted_token_verifies_for_what_it_grants(
    promise_id: str,
    outcomes: frozenset[PromiseState],
    life: int,
    token_id: bytes,
    name: str,
    roles: frozenset[Role],
    instance: int,
    permissions: frozenset[str],
) -> None:
    acts_for = Principal(name, roles, permissions=permissions)
    token, granted = mint(RING, promise_id, outcomes, NOW + life, token_id, acts_for, instance)
    # A token with permissions is st3; without, the st2 it always was.
    assert token.startswith("st3.k2." if permissions else "st2.k2.")
    assert granted.permissions == permissions
    assert all(c.isalnum() or c in "._-" for c in token)  # URL-safe as it is
    for outcome in outcomes:
        assert verify(RING, token, promise_id, outcome, NOW) == granted
    assert (granted.principal, granted.roles, granted.instance) == (name, roles, instance)
    assert granted.acting() == acts_for
    assert granted.settled_by == f"{name} via settle-token k2:{granted.token_id}"
    # The settle counts as its principal's, wherever settlers are compared.
    assert tokens.settler(granted.settled_by) == name


@given(ids, ids, outcome_sets, settle_states, st.integers(-1000, 1000))
def test_verify_refuses_each_case_with_its_own_reason(
    promise_id: str,
    other_id: str,
    outcomes: frozenset[PromiseState],
    outcome: PromiseState,
    offset: int,
) -> None:
    token, _ = mint(RING, promise_id, outcomes, NOW, TID)
    checks = []
    if other_id != promise_id:
        checks.append((other_id, outcome, NOW - 1, Reason.SETTLE_TOKEN_WRONG_PROMISE))
    if outcome not in outcomes:
        checks.append((promise_id, outcome, NOW - 1, Reason.SETTLE_TOKEN_OUTCOME_NOT_ALLOWED))
    elif offset >= 0:
        checks.append((promise_id, outcome, NOW + offset, Reason.SETTLE_TOKEN_EXPIRED))
    for target, settle, now, reason in checks:
        with pytest.raises(tokens.SettleTokenError) as refused:
            verify(RING, token, target, settle, now)
        assert _reason(refused) == reason


@given(ids, st.data())
def test_any_change_to_a_token_is_refused(promise_id: str, data: st.DataObject) -> None:
    token, _ = mint(RING, promise_id, tokens.OUTCOMES, NOW + 1000, TID)
    position = data.draw(st.integers(0, len(token) - 1))
    char = data.draw(st.sampled_from("AbZ09-_."))
    assume(token[position] != char)
    changed = token[:position] + char + token[position + 1 :]
    with pytest.raises(tokens.SettleTokenError) as refused:
        verify(RING, changed, promise_id, PromiseState.RESOLVED, NOW)
    assert _reason(refused) in {
        Reason.SETTLE_TOKEN_MALFORMED,
        Reason.SETTLE_TOKEN_OUTDATED,
        Reason.SETTLE_TOKEN_UNKNOWN_KEY,
        Reason.SETTLE_TOKEN_BAD_SIGNATURE,
    }


def test_a_token_of_a_retired_key_is_unknown_and_one_of_an_old_key_verifies() -> None:
    old, _ = mint(Keyring({"k1": K1}, "k1"), "p", tokens.OUTCOMES, NOW + 1, TID)
    assert verify(RING, old, "p", PromiseState.RESOLVED, NOW).key_id == "k1"
    with pytest.raises(tokens.UnknownKey):
        verify(Keyring({"k2": K2}, "k2"), old, "p", PromiseState.RESOLVED, NOW)
    # Same key id, another secret: a forgery.
    with pytest.raises(tokens.BadSignature):
        verify(Keyring({"k1": K2}, "k1"), old, "p", PromiseState.RESOLVED, NOW)


@pytest.mark.parametrize(
    "token",
    ["", "st2", "st3.k1.AA.AA", "st2.k 1.AA.AA", "st2.k1.A*.AA", "st2.k1.AAAA.AAAA", "a.b.c.d.e"],
)
def test_what_is_not_a_token_is_malformed(token: str) -> None:
    with pytest.raises(tokens.TokenMalformed):
        verify(RING, token, "p", PromiseState.RESOLVED, NOW)


def _st1(promise_id: str) -> str:
    """A token as an older server minted it (`st1`: no principal, no instance)."""
    payload = TID + (NOW + 1000).to_bytes(8, "big") + b"\x03" + promise_id.encode()
    mac = hmac.new(K2, b"troth-settle-token/1\0k2\0" + payload, hashlib.sha256).digest()
    return ".".join(("st1", "k2", _b64(payload), _b64(mac)))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_a_token_of_the_older_format_is_refused_saying_so() -> None:
    with pytest.raises(tokens.TokenOutdated) as refused:
        verify(RING, _st1("p"), "p", PromiseState.RESOLVED, NOW)
    assert refused.value.reason == Reason.SETTLE_TOKEN_OUTDATED
    assert "older server" in refused.value.message
    assert "new link" in refused.value.message


def test_the_principal_and_the_instance_are_signed() -> None:
    token, _ = mint(RING, "p", tokens.OUTCOMES, NOW + 1000, TID, BOB, INSTANCE)
    prefix, key_id, payload_text, mac = token.split(".")
    payload = bytearray(base64.urlsafe_b64decode(payload_text + "=" * (-len(payload_text) % 4)))
    roles_at, instance_at = 21, 22
    as_admin = payload.copy()
    as_admin[roles_at] |= 8
    other_instance = payload.copy()
    other_instance[instance_at + 7] ^= 1
    as_alice = payload[:-3] + b"ali"  # "bob" -> "ali"
    for changed in (as_admin, other_instance, as_alice):
        forged = ".".join((prefix, key_id, _b64(bytes(changed)), mac))
        with pytest.raises(tokens.BadSignature):
            verify(RING, forged, "p", PromiseState.RESOLVED, NOW)


def test_settler_reads_the_principal_of_any_settled_by() -> None:
    assert tokens.settler("bob") == "bob"
    assert tokens.settler("bob via settle-token k1:AAAAAAAAAAAAAAAA") == "bob"
    assert tokens.settler("a:b/c via settle-token key_2-x:AbC-_9") == "a:b/c"
    # An st1 token acted for nobody; nothing settled it; a near miss is a name.
    assert tokens.settler("settle-token:k1:AAAAAAAAAAAAAAAA") is None
    assert tokens.settler(None) is None
    assert tokens.settler("bob via settle-token") == "bob via settle-token"


def test_a_token_acts_only_for_a_principal_name() -> None:
    for name in ("bob", "svc:mailer", "a@b.c"):
        assert tokens.is_principal_name(name)
    for name in ("", "two words", "x" * 257, "troth:timeout", "settle-token:k1:x", "é"):
        assert not tokens.is_principal_name(name)
    with pytest.raises(ValueError, match="principal"):
        mint(RING, "p", tokens.OUTCOMES, NOW, TID, Principal("two words", frozenset()))


def test_base64_text_is_canonical() -> None:
    token, _ = mint(RING, "p", tokens.OUTCOMES, NOW + 1, TID)
    head, mac = token.rsplit(".", 1)
    # 32 bytes in 43 characters: the last one's low bits are unused; setting them
    # would spell the same bytes another way.
    last = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".index(mac[-1])
    twin = mac[:-1] + "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"[last | 1]
    if twin != mac:
        with pytest.raises(tokens.TokenMalformed):
            verify(RING, f"{head}.{twin}", "p", PromiseState.RESOLVED, NOW)


def _promise(
    state: PromiseState,
    token_id: str | None = None,
    key: str | None = None,
    instance: int = INSTANCE,
) -> Promise:
    return Promise(
        id="p",
        state=state,
        param=Payload(),
        value=Payload(),
        tags={},
        create_time=0,
        settle_token_id=token_id,
        idempotency_key_for_settle=key,
        instance=instance,
    )


def test_the_writer_refuses_a_used_or_void_token_and_answers_a_repeat() -> None:
    _, t1 = mint(RING, "p", tokens.OUTCOMES, NOW + 1000, TID)
    used = t1.token_id
    assert tokens.check_use(_promise(PromiseState.PENDING), t1, None)
    with pytest.raises(tokens.TokenUsed):
        tokens.check_use(_promise(PromiseState.RESOLVED, used), t1, None)
    assert not tokens.check_use(_promise(PromiseState.RESOLVED, used, "k"), t1, "k")
    with pytest.raises(tokens.TokenUsed):
        tokens.check_use(_promise(PromiseState.RESOLVED, used, "k"), t1, "other")
    with pytest.raises(tokens.TokenVoid):
        tokens.check_use(_promise(PromiseState.REJECTED_CANCELED), t1, None)
    # Settled otherwise: the state machine answers (ALREADY_SETTLED or TIMED_OUT).
    assert tokens.check_use(_promise(PromiseState.REJECTED), t1, None)


@given(instances, instances)
def test_a_token_is_void_for_another_instance_of_its_promise(minted: int, now: int) -> None:
    assume(minted != now)
    _, granted = mint(RING, "p", tokens.OUTCOMES, NOW + 1000, TID, BOB, minted)
    for state in (PromiseState.PENDING, PromiseState.RESOLVED, PromiseState.REJECTED_CANCELED):
        with pytest.raises(tokens.PromiseReplaced) as refused:
            tokens.check_use(_promise(state, instance=now), granted, None)
        assert refused.value.reason == Reason.SETTLE_TOKEN_PROMISE_REPLACED


def test_keys_files_are_checked() -> None:
    secret = base64.urlsafe_b64encode(K1).rstrip(b"=").decode()
    ring = parse_keys(json.dumps({"active": "k1", "keys": {"k1": secret}}))
    assert ring.keys == {"k1": K1}
    bad = [
        "not json",
        "[]",
        json.dumps({"keys": {"k1": secret}}),
        json.dumps({"active": "k2", "keys": {"k1": secret}}),
        json.dumps({"active": "k1", "keys": {"k1": "c2hvcnQ"}}),
        json.dumps({"active": "k 1", "keys": {"k 1": secret}}),
        json.dumps({"active": "k1", "keys": {"k1": 7}}),
    ]
    for text in bad:
        with pytest.raises(KeysInvalid):
            parse_keys(text)


def test_mint_refuses_what_it_cannot_sign() -> None:
    with pytest.raises(ValueError, match="outcomes"):
        mint(RING, "p", {PromiseState.REJECTED_CANCELED}, NOW, TID)
    with pytest.raises(ValueError, match="token_id"):
        mint(RING, "p", tokens.OUTCOMES, NOW, b"short")
