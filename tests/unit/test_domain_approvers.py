"""The approver policy as a pure function (`domain.approvers`), by example and by property."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from troth.errors import Reason
from troth_server.domain.access import Principal, Role
from troth_server.domain.approvers import Approvers, Rule, approvers, check_distinct, decide
from troth_server.domain.errors import InvalidArgument

names = st.sampled_from(["alice", "bob", "carol", "dave", "erin"])
role_names = st.sampled_from([r.value for r in Role] + ["finance"])
permission_names = st.sampled_from(["payouts:approve", "payouts:read", "legal:sign"])
policies = st.builds(
    Approvers,
    principals=st.frozensets(names, max_size=3),
    roles=st.frozensets(role_names, max_size=2),
    not_requester=st.booleans(),
    distinct=st.booleans(),
    quorum=st.sampled_from(["", "legal"]),
    permissions=st.frozensets(permission_names, max_size=2),
)
callers = st.builds(
    Principal,
    name=names,
    roles=st.frozensets(st.sampled_from(list(Role)), max_size=2),
    permissions=st.frozensets(permission_names, max_size=2),
)


def _who(name: str, *roles: Role) -> Principal:
    return Principal(name, frozenset(roles))


def test_no_policy_lets_anyone_settle() -> None:
    assert decide("p", None, _who("anyone"), "anyone") is None


def test_each_rule_refuses_by_its_name() -> None:
    listed = Approvers(principals=frozenset({"carol"}))
    refused = decide("p", listed, _who("bob"), None)
    assert refused is not None and refused.rule is Rule.APPROVERS
    assert refused.reason is Reason.NOT_AN_APPROVER
    assert refused.metadata == {"promise_id": "p", "rule": "approvers"}
    assert "'bob'" in refused.message and "'carol'" in refused.message
    four_eyes = Approvers(not_requester=True)
    refused = decide("p", four_eyes, _who("alice"), "alice")
    assert refused is not None and refused.rule is Rule.NOT_REQUESTER
    distinct = Approvers(distinct=True)
    refused = decide("p", distinct, _who("bob"), None, ["bob", None])
    assert refused is not None and refused.rule is Rule.DISTINCT


def test_a_role_allows_only_when_listed_and_admin_is_no_approver_by_default() -> None:
    finance = Approvers(roles=frozenset({"operator"}))
    assert decide("p", finance, _who("op", Role.OPERATOR), None) is None
    assert decide("p", finance, _who("root", Role.ADMIN), None) is not None
    admins = Approvers(roles=frozenset({"admin"}))
    assert decide("p", admins, _who("root", Role.ADMIN), None) is None


def test_request_fields_are_checked() -> None:
    assert approvers() is None  # restricts nobody: not recorded
    with pytest.raises(InvalidArgument) as bad:
        approvers(["ok", " padded"])
    assert bad.value.field == "approvers.principals[1]"
    with pytest.raises(InvalidArgument) as bad:
        approvers(quorum="legal")
    assert bad.value.field == "approvers.quorum"
    with pytest.raises(InvalidArgument):
        approvers([f"p{i}" for i in range(101)])


@given(policies)
def test_the_recorded_json_reads_back_as_the_same_policy(policy: Approvers) -> None:
    assert Approvers.from_json(policy.to_json()) == policy


@given(policies, callers, st.none() | names, st.lists(st.none() | names, max_size=4))
def test_decide_is_exactly_the_three_rules(
    policy: Approvers, caller: Principal, starter: str | None, settlers: list[str | None]
) -> None:
    listed = policy.principals or policy.roles or policy.permissions
    allowed_by_list = (
        not listed
        or caller.name in policy.principals
        or any(r.value in policy.roles for r in caller.roles)
        or any(p in policy.permissions for p in caller.permissions)
    )
    four_eyes_ok = not policy.not_requester or caller.name != starter
    distinct_ok = not policy.distinct or caller.name not in settlers
    refused = decide("p", policy, caller, starter, settlers)
    assert (refused is None) == (allowed_by_list and four_eyes_ok and distinct_ok)
    if refused is not None:
        # The first rule broken, in the documented order.
        first = (
            Rule.APPROVERS
            if not allowed_by_list
            else Rule.NOT_REQUESTER
            if not four_eyes_ok
            else Rule.DISTINCT
        )
        assert refused.rule is first


@given(names, st.lists(st.none() | names, max_size=5))
def test_the_writers_distinct_check_is_membership(caller: str, settlers: list[str | None]) -> None:
    assert (check_distinct("p", caller, settlers) is None) == (caller not in settlers)
    assert check_distinct("p", None, settlers) is None  # an unnamed settle counts for nobody


def test_a_settle_token_counts_as_its_principal_in_a_distinct_quorum() -> None:
    via = "bob via settle-token k1:AAAAAAAAAAAAAAAA"
    # Bob's link settled one approval: bob, directly or by another link, is refused.
    for caller in ("bob", "bob via settle-token k1:BBBBBBBBBBBBBBBB"):
        refused = check_distinct("p", caller, [via])
        assert refused is not None and refused.rule is Rule.DISTINCT
        assert "'bob' already settled" in refused.message
    assert check_distinct("p", "carol", [via]) is None
    # So does the policy's decision before the write.
    policy = Approvers(distinct=True)
    bob = Principal("bob", frozenset({Role.GATEWAY}))
    assert decide("p", policy, bob, None, [via]) is not None
    # An older (st1) token acted for nobody: it counts for no principal.
    assert decide("p", policy, bob, None, ["settle-token:k1:AAAAAAAAAAAAAAAA"]) is None
