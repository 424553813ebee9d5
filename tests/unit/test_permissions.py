"""Permission names (issue 31 item 2), as pure functions: who holds them (a token
file's entry, a JWT's configurable claim), what a policy listing them admits, what a
settle token carries of them, and what they leave unchanged (policies and replay
digests recorded before them)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import jwt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from troth import Approvers as SdkApprovers
from troth._commands import CreatePromise
from troth._digests import args_digest
from troth.errors import Reason
from troth_server.auth import AuthConfigError, Authenticator, AuthSources, Unauthenticated, mint
from troth_server.auth._jwt import JwtVerifier, _Key, permissions_claim_problem
from troth_server.domain import settle_tokens as tokens
from troth_server.domain.access import (
    MAX_PERMISSION_LENGTH,
    MAX_PERMISSIONS,
    Principal,
    Role,
    check_permissions,
    permission_problem,
)
from troth_server.domain.approvers import Approvers, Rule, approvers, decide, early_refusal
from troth_server.domain.errors import InvalidArgument
from troth_server.domain.promise import Promise, PromiseState

if TYPE_CHECKING:
    from pathlib import Path

PAYOUTS = "payouts:approve"
SECRET = b"s" * 32
RING = tokens.Keyring({"k1": b"1" * 32}, active="k1")
NOW = 1_800_000_000_000


def _who(name: str, *permissions: str, roles: frozenset[Role] = frozenset()) -> Principal:
    return Principal(name, roles or frozenset({Role.GATEWAY}), permissions=frozenset(permissions))


# -- names --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["payouts:approve", "read:messages", "api://billing/Payouts.Approve", "a", "x" * 128, "a+b=c"],
)
def test_permission_names_people_use_are_names(name: str) -> None:
    assert permission_problem(name) is None


@pytest.mark.parametrize(
    "name", ["", " payouts", "pay outs", "payouts\x00", "x" * 129, "pay*", "é", 'a"b', 7]
)
def test_other_text_is_no_permission_name_and_the_problem_says_what_one_is(name: object) -> None:
    problem = permission_problem(name)
    assert problem is not None
    if isinstance(name, str):
        assert f"1 to {MAX_PERMISSION_LENGTH}" in problem and "payouts:approve" in problem


def test_a_list_of_permissions_is_checked_by_index_and_count() -> None:
    with pytest.raises(ValueError, match=r"where\[1\]: 'no way'"):
        check_permissions(["ok", "no way"], "where", 5)
    with pytest.raises(ValueError, match="lists 6 permissions; the limit is 5"):
        check_permissions(["a"] * 6, "where", 5)
    assert check_permissions(["b", "a", "b"], "where", 5) == frozenset({"a", "b"})


def test_a_policy_s_permissions_are_checked_as_request_fields() -> None:
    with pytest.raises(InvalidArgument) as bad:
        approvers(permissions=["payouts:approve", "pay outs"])
    assert bad.value.field == "approvers.permissions[1]"
    with pytest.raises(InvalidArgument) as many:
        approvers(permissions=[f"p{i}" for i in range(101)])
    assert many.value.field == "approvers.permissions"
    policy = approvers(permissions=[PAYOUTS])
    assert policy == Approvers(permissions=frozenset({PAYOUTS}))


# -- the policy ---------------------------------------------------------------------


def test_a_listed_permission_admits_its_holders_and_nobody_else() -> None:
    policy = Approvers(permissions=frozenset({PAYOUTS}))
    assert decide("p", policy, _who("ann", PAYOUTS), None) is None
    refused = decide("p", policy, _who("bob", "payouts:read"), None)
    assert refused is not None and refused.rule is Rule.APPROVERS
    assert "permission 'payouts:approve'" in refused.message
    # No role implies a permission, admin included.
    root = Principal("root", frozenset(Role))
    assert decide("p", policy, root, None) is not None


def test_permissions_roles_and_principals_each_admit() -> None:
    policy = Approvers(
        principals=frozenset({"carol"}),
        roles=frozenset({"operator"}),
        permissions=frozenset({PAYOUTS}),
    )
    assert decide("p", policy, _who("carol"), None) is None
    assert decide("p", policy, _who("op", roles=frozenset({Role.OPERATOR})), None) is None
    assert decide("p", policy, _who("ann", PAYOUTS), None) is None
    assert decide("p", policy, _who("bob"), None) is not None


def test_four_eyes_and_distinct_quorums_hold_for_permission_holders() -> None:
    four_eyes = Approvers(permissions=frozenset({PAYOUTS}), not_requester=True)
    refused = decide("p", four_eyes, _who("ann", PAYOUTS), "ann")
    assert refused is not None and refused.rule is Rule.NOT_REQUESTER
    assert decide("p", four_eyes, _who("ann", PAYOUTS), "bob") is None
    quorum = Approvers(permissions=frozenset({PAYOUTS}), distinct=True, quorum="q")
    refused = decide("p", quorum, _who("ann", PAYOUTS), None, ["ann"])
    assert refused is not None and refused.rule is Rule.DISTINCT
    assert decide("p", quorum, _who("ann", PAYOUTS), None, ["bob"]) is None


@given(
    st.frozensets(st.sampled_from(["a:1", "b:2", "c:3"]), max_size=3),
    st.frozensets(st.sampled_from(["a:1", "b:2", "c:3"]), max_size=3),
)
def test_a_permission_policy_admits_exactly_the_holders_of_one_it_lists(
    listed: frozenset[str], held: frozenset[str]
) -> None:
    policy = approvers(permissions=listed)
    admitted = decide("p", policy, _who("x", *held), None) is None
    assert admitted == (not listed or bool(listed & held))


def test_a_policy_without_permissions_keeps_its_record_and_one_with_reads_back() -> None:
    old = Approvers(principals=frozenset({"ann"}), roles=frozenset({"gateway"}))
    assert "permissions" not in old.to_json()
    assert Approvers.from_json(old.to_json()) == old
    new = Approvers(permissions=frozenset({PAYOUTS, "a:b"}), distinct=True)
    assert json.loads(new.to_json())["permissions"] == ["a:b", PAYOUTS]
    assert Approvers.from_json(new.to_json()) == new
    assert Approvers.from_json(json.loads(new.to_json())) == new  # JSONB reads a dict


def test_an_early_settle_cannot_be_judged_by_permissions_afterwards() -> None:
    early = Promise(
        id="p", state=PromiseState.RESOLVED, param=None, value=None, tags={},  # type: ignore[arg-type]
        create_time=0, settle_time=1, expire_time=None, settled_by="ann",
    )  # fmt: skip
    policy = Approvers(permissions=frozenset({PAYOUTS}))
    refused = early_refusal(policy, early, None)
    assert refused is not None and refused.rule is Rule.APPROVERS
    named = Approvers(principals=frozenset({"ann"}), permissions=frozenset({PAYOUTS}))
    assert early_refusal(named, early, None) is None


# -- settle tokens ------------------------------------------------------------------


def test_a_token_carries_its_principal_s_permissions_and_verifies_as_them() -> None:
    ann = _who("ann", PAYOUTS, "a:b")
    token, granted = tokens.mint(RING, ("p", 7), tokens.OUTCOMES, NOW + 1000, b"\x01" * 12, ann)
    assert token.startswith("st3.")
    assert granted.permissions == frozenset({PAYOUTS, "a:b"})
    verified = tokens.verify(RING, token, "p", PromiseState.RESOLVED, NOW)
    assert verified == granted
    assert verified.acting().permissions == frozenset({PAYOUTS, "a:b"})
    # Another principal's permissions cannot be written in: the signature covers them.
    prefix, key_id, payload, mac = token.split(".")
    raw = tokens._unb64(payload).replace(b"a:b", b"x:y")
    forged = ".".join((prefix, key_id, tokens._b64(raw), mac))
    with pytest.raises(tokens.BadSignature):
        tokens.verify(RING, forged, "p", PromiseState.RESOLVED, NOW)
    # Nor can an st3 be passed for an st2 (each format its own MAC).
    with pytest.raises(tokens.BadSignature):
        tokens.verify(RING, "st2." + token[4:], "p", PromiseState.RESOLVED, NOW)


def test_a_token_without_permissions_is_the_st2_it_always_was() -> None:
    token, granted = tokens.mint(
        RING, ("p", 7), tokens.OUTCOMES, NOW + 1000, b"\x01" * 12, _who("ann")
    )
    assert token.startswith("st2.") and granted.permissions == frozenset()
    assert tokens.verify(RING, token, "p", PromiseState.REJECTED, NOW) == granted


# -- sources ------------------------------------------------------------------------


def test_a_token_file_entry_grants_permissions_and_troth_tokens_new_writes_them(
    tmp_path: Path,
) -> None:
    minted = mint("ann", ["gateway"], permissions=[PAYOUTS])
    assert f'permissions = ["{PAYOUTS}"]' in minted.entry
    (tmp_path / "tokens.toml").write_text(minted.entry)
    auth = Authenticator(AuthSources(tokens_file=tmp_path / "tokens.toml"))
    assert auth.verify(minted.token).permissions == frozenset({PAYOUTS})
    with pytest.raises(ValueError, match=r"permissions\[0\]"):
        mint("bob", ["gateway"], permissions=["pay outs"])


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('permissions = "payouts:approve"', "must be a list of permission names"),
        ('permissions = ["pay outs"]', r"permissions\[0\]: 'pay outs' is no permission name"),
        (
            "permissions = [" + ", ".join(f'"p{i}"' for i in range(MAX_PERMISSIONS + 1)) + "]",
            f"the limit is {MAX_PERMISSIONS}",
        ),
    ],
)
def test_a_bad_permissions_entry_is_refused_saying_why(
    tmp_path: Path, line: str, message: str
) -> None:
    entry = mint("ann", ["gateway"]).entry.replace("key_id", f"{line}\nkey_id")
    (tmp_path / "tokens.toml").write_text(entry)
    with pytest.raises(AuthConfigError, match=message):
        Authenticator(AuthSources(tokens_file=tmp_path / "tokens.toml"))


def _jwt(claims: dict[str, object]) -> str:
    now = int(time.time())
    body = {"sub": "ann", "exp": now + 300, "troth_roles": ["gateway"], **claims}
    return jwt.encode(body, SECRET, algorithm="HS256")


@pytest.mark.parametrize(
    ("claim", "value", "held"),
    [
        ("permissions", [PAYOUTS, "a:b"], {PAYOUTS, "a:b"}),
        ("permissions", f"{PAYOUTS} a:b", {PAYOUTS, "a:b"}),  # space-separated, as `scope`
        ("scope", "openid payouts:approve", {"openid", PAYOUTS}),
        ("permissions", None, set()),
    ],
)
def test_a_jwt_s_permissions_come_from_the_configured_claim(
    claim: str, value: object, held: set[str]
) -> None:
    verifier = JwtVerifier([_Key(None, "HS256", SECRET)], permissions_claim=claim)
    claims = {} if value is None else {claim: value}
    assert verifier.verify(_jwt(claims)).permissions == frozenset(held)
    # Another claim than the configured one grants nothing.
    other = JwtVerifier([_Key(None, "HS256", SECRET)], permissions_claim="other")
    assert other.verify(_jwt(claims)).permissions == frozenset()


@pytest.mark.parametrize("value", [["pay outs"], [7], {"a": 1}, ["x" * 129]])
def test_a_jwt_with_a_bad_permissions_claim_is_refused_naming_it(value: object) -> None:
    verifier = JwtVerifier([_Key(None, "HS256", SECRET)], permissions_claim="perms")
    with pytest.raises(Unauthenticated) as refused:
        verifier.verify(_jwt({"perms": value}))
    assert refused.value.reason is Reason.TOKEN_INVALID
    assert "'perms' claim" in str(refused.value)


def test_the_permissions_claim_must_be_a_claim_of_no_other_meaning() -> None:
    assert permissions_claim_problem("permissions") is None
    assert permissions_claim_problem("scope") is None
    for name in ("", " scope", "sub", "troth_roles", "exp"):
        assert permissions_claim_problem(name) is not None, name


# -- the SDK and replay -------------------------------------------------------------


def test_the_sdk_sends_permissions_and_reads_them_back() -> None:
    policy = SdkApprovers(permissions=[PAYOUTS, PAYOUTS, "a:b"], not_requester=True)
    assert policy.permissions == ("a:b", PAYOUTS)
    message = policy.to_proto()
    assert list(message.permissions) == ["a:b", PAYOUTS]
    assert SdkApprovers.from_proto(message) == policy
    with pytest.raises(TypeError, match="list of names"):
        SdkApprovers(permissions=PAYOUTS)


def test_a_promise_digest_without_permissions_is_what_it_was_before_them() -> None:
    # Pinned before permissions existed: a history recorded then replays as it did.
    asked = CreatePromise(title="t", approvers=SdkApprovers(principals=["ann"], distinct=True))
    assert args_digest(asked) == "v2:7fc0afa4f0d82e7e"
    with_permissions = CreatePromise(
        title="t", approvers=SdkApprovers(principals=["ann"], distinct=True, permissions=["a:b"])
    )
    assert args_digest(with_permissions) not in (None, args_digest(asked))
