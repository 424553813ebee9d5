"""Pure rules of what a principal sees: prefix narrowing, keys, settle-token steps,
and the early settle an approver policy adopts (issue 11 part 2)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from troth_server.domain import visibility
from troth_server.domain.access import Principal, Role, narrow
from troth_server.domain.approvers import Approvers, Rule, early_refusal
from troth_server.domain.promise import Payload, Promise, PromiseState

ACME = ("acme-",)


@pytest.mark.parametrize(
    ("glob", "prefixes", "expected"),
    [
        ("*", (), ()),
        ("*", ACME, ACME),
        ("acme-*", ACME, ()),
        ("acme-order-*", ACME, ()),
        ("ac*", ACME, ACME),
        ("*-order", ACME, ACME),
        ("globex-*", ACME, None),
        ("globex-1", ACME, None),
        ("acme-1", ACME, ()),
        ("a*", ("acme-", "beta-", "abc-"), ("acme-", "abc-")),
    ],
)
def test_a_glob_is_narrowed_to_the_prefixes_it_can_match(
    glob: str, prefixes: tuple[str, ...], expected: tuple[str, ...] | None
) -> None:
    assert narrow(glob, prefixes) == expected


def _principal(name: str, *roles: Role, groups: tuple[str, ...] = ()) -> Principal:
    return Principal(name=name, roles=frozenset(roles), groups=frozenset(groups))


GATEWAY = _principal("gw", Role.GATEWAY)
OTHER = _principal("gw-2", Role.GATEWAY)
ADMIN = _principal("root", Role.ADMIN)
WORKER = _principal("wk", Role.WORKER, groups=("g",))
STRANGER = _principal("wk-2", Role.WORKER, groups=("h",))

TOP = Promise(
    id="p",
    state=PromiseState.RESOLVED,
    param=Payload(),
    value=Payload(data=b"1"),
    tags={},
    create_time=0,
    idempotency_key_for_create="ck",
    idempotency_key_for_settle="sk",
    started_by="gw",
    settled_by="gw-2",
)
TOKEN_STEP = replace(
    TOP,
    id="wf.1",
    parent_id="wf",
    root_id="wf",
    tags={"troth:kind": "settle_token"},
    value=Payload(data=b'"the-token"'),
    settled_by="wk",
)


def _keys(p: Promise) -> tuple[str | None, str | None]:
    return p.idempotency_key_for_create, p.idempotency_key_for_settle


def test_keys_go_to_their_writers_and_admins() -> None:
    assert _keys(visibility.view(TOP, GATEWAY)) == ("ck", None)
    assert _keys(visibility.view(TOP, OTHER)) == (None, "sk")
    assert _keys(visibility.view(TOP, WORKER, "g")) == (None, None)  # not a step
    assert visibility.view(TOP, ADMIN) is TOP
    # The key a call sent is its own.
    assert _keys(visibility.view(TOP, WORKER, sent_key="ck")) == ("ck", None)


def test_a_settle_token_step_is_whole_only_for_its_workflows_workers() -> None:
    for reader, group in ((WORKER, "g"), (ADMIN, None)):
        shown = visibility.view(TOKEN_STEP, reader, group)
        assert shown.value == TOKEN_STEP.value
        assert _keys(shown) == ("ck", "sk")
    for reader, group in ((GATEWAY, "g"), (STRANGER, "g"), (WORKER, None)):
        shown = visibility.view(TOKEN_STEP, reader, group)
        assert shown.value == visibility.REDACTED_TOKEN
        assert shown.idempotency_key_for_create is None
    assert visibility.needs_group(TOKEN_STEP, WORKER)
    assert not visibility.needs_group(TOKEN_STEP, GATEWAY)
    assert not visibility.needs_group(TOP, WORKER)


EARLY = replace(TOP, settled_by="carol", tags={"troth:early": "true"})


@pytest.mark.parametrize(
    ("policy", "rule"),
    [
        (None, None),
        (Approvers(), None),
        (Approvers(principals=frozenset({"carol"})), None),
        (Approvers(principals=frozenset({"dave"})), Rule.APPROVERS),
        (Approvers(roles=frozenset({"gateway"})), Rule.APPROVERS),
        (Approvers(principals=frozenset({"carol"}), roles=frozenset({"x"})), None),
        (Approvers(not_requester=True), Rule.NOT_REQUESTER),
        (Approvers(distinct=True, quorum="q"), Rule.DISTINCT),
    ],
)
def test_an_early_settle_counts_only_where_the_policy_names_its_settler(
    policy: Approvers | None, rule: Rule | None
) -> None:
    refusal = early_refusal(
        policy, EARLY, starter="carol" if policy and policy.not_requester else "gw"
    )
    assert (None if refusal is None else refusal.rule) == rule
    assert early_refusal(Approvers(), replace(EARLY, settled_by=None), "gw") is not None


@pytest.mark.parametrize(
    ("roles", "whole"),
    [
        ({Role.OPERATOR}, True),
        ({Role.ADMIN}, True),
        ({Role.GATEWAY}, False),
        ({Role.WORKER}, False),
        ({Role.WORKER, Role.GATEWAY}, False),
    ],
)
def test_a_task_is_seen_whole_only_by_those_who_may_read_tasks(
    roles: set[Role], whole: bool
) -> None:
    reader = Principal(name="r", roles=frozenset(roles), groups=frozenset({"g"}))
    assert visibility.sees_task_details(reader) is whole
