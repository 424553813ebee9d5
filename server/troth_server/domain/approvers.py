"""Approver policy: who may resolve or reject a promise (DESIGN §7, issue 11 part 3).

Pure: `decide` answers from the policy recorded on the promise, the caller's
`Principal`, the principal that started the workflow (`Promise.started_by`) and,
for a distinct quorum, who settled the other approvals of that quorum. The
service runs it before the write, off the group commit's writer; the writer only
compares the policy it sees with the one checked (`SettleRequest.checked_policy`)
and the quorum's settlers with the caller (`check_distinct`), which are cheap.

Rules, in the order they are checked (the refusal names the first broken one):

| rule            | a settle is refused when                                          |
|-----------------|-------------------------------------------------------------------|
| `approvers`     | principals, roles or permissions are listed and the caller has    |
|                 | none of them (is not named, holds no listed role nor permission)  |
| `not_requester` | four-eyes: the caller is the principal who started the workflow  |
| `distinct`      | the caller already settled another approval of the same quorum    |

Roles are compared by name with the caller's roles; `admin` counts only where it
is listed: an administrator may do everything *but* stand in for an approver.
Permissions (`payouts:approve`) are compared by name with the permission names the
caller's credential grants (`Principal.permissions`: a token-file entry's
`permissions`, a JWT's permissions claim); no role implies one.

The caller of a settle that carries a settle token is the principal the token
acts for (DESIGN §4 rule 16): its name, and the roles it held when the token was
minted, and those of the permissions the policy lists that it held then (none
for a named approver a gateway minted it for). Settlers are compared
by principal (`settle_tokens.settler`), so a token's settle counts as its
principal's in a distinct quorum.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from troth.errors import Reason
from troth_server.domain.access import Principal, permission_problem
from troth_server.domain.errors import DomainError, InvalidArgument
from troth_server.domain.settle_tokens import settler

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable

    from troth_server.domain.promise import Promise

MAX_APPROVERS = 100
"""Most principals (and, separately, roles, and permissions) one policy may list."""
MAX_QUORUM_LENGTH = 128


class Rule(enum.StrEnum):
    APPROVERS = "approvers"
    NOT_REQUESTER = "not_requester"
    DISTINCT = "distinct"


@dataclass(frozen=True, slots=True)
class Approvers:
    """Who may settle a promise. Empty principals, roles and permissions: any principal."""

    principals: frozenset[str] = field(default_factory=frozenset)
    roles: frozenset[str] = field(default_factory=frozenset)
    not_requester: bool = False
    """Four-eyes: not the principal that started the workflow (`started_by`)."""
    distinct: bool = False
    """One principal settles at most one approval of the workflow's `quorum`."""
    quorum: str = ""
    """Names the quorum among a workflow's steps (with `distinct`)."""
    permissions: frozenset[str] = field(default_factory=frozenset)
    """Permission names: a principal holding one of them may settle (with principals
    and roles: any of the three admits)."""

    @property
    def lists_approvers(self) -> bool:
        """Whether it says who may settle (principals, roles or permissions)."""
        return bool(self.principals or self.roles or self.permissions)

    @property
    def is_open(self) -> bool:
        """Whether the policy restricts nobody (and so need not be recorded)."""
        return not (self.lists_approvers or self.not_requester or self.distinct)

    def to_json(self) -> str:
        body: dict[str, Any] = {}
        if self.principals:
            body["principals"] = sorted(self.principals)
        if self.roles:
            body["roles"] = sorted(self.roles)
        if self.permissions:  # only when listed: a policy without keeps its record
            body["permissions"] = sorted(self.permissions)
        if self.not_requester:
            body["not_requester"] = True
        if self.distinct:
            body["distinct"] = True
        if self.quorum:
            body["quorum"] = self.quorum
        return json.dumps(body, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, value: str | dict[str, Any]) -> Approvers:
        """From `to_json`'s text (or, as a PostgreSQL JSONB column reads, its dict)."""
        body = json.loads(value) if isinstance(value, str) else value
        return cls(
            principals=frozenset(body.get("principals", ())),
            roles=frozenset(body.get("roles", ())),
            not_requester=bool(body.get("not_requester", False)),
            distinct=bool(body.get("distinct", False)),
            quorum=str(body.get("quorum", "")),
            permissions=frozenset(body.get("permissions", ())),
        )

    def describe(self) -> str:
        """The policy in words, for messages and the inbox."""
        parts = []
        if self.lists_approvers:
            who = [*(repr(p) for p in sorted(self.principals))]
            who += [f"role {r!r}" for r in sorted(self.roles)]
            who += [f"permission {p!r}" for p in sorted(self.permissions)]
            parts.append("one of " + ", ".join(who))
        if self.not_requester:
            parts.append("not the principal who started the workflow")
        if self.distinct:
            named = f" {self.quorum!r}" if self.quorum else ""
            parts.append(f"distinct from the approvers of the other steps of quorum{named}")
        return "; ".join(parts) or "anyone"


def approvers(
    principals: Iterable[str] = (),
    roles: Iterable[str] = (),
    *,
    not_requester: bool = False,
    distinct: bool = False,
    quorum: str = "",
    permissions: Iterable[str] = (),
) -> Approvers | None:
    """A checked policy from request fields; None when it restricts nobody."""
    names = _names(principals, "approvers.principals")
    role_names = _names(roles, "approvers.roles")
    permission_names = _permissions(permissions, "approvers.permissions")
    if len(quorum) > MAX_QUORUM_LENGTH:
        raise InvalidArgument(
            "approvers.quorum",
            f"is {len(quorum)} characters long; the limit is {MAX_QUORUM_LENGTH}",
        )
    if quorum and not distinct:
        raise InvalidArgument("approvers.quorum", "names a distinct quorum: set distinct too")
    policy = Approvers(names, role_names, not_requester, distinct, quorum, permission_names)
    return None if policy.is_open else policy


def _permissions(values: Iterable[str], field: str) -> frozenset[str]:
    found = list(values)
    if len(found) > MAX_APPROVERS:
        raise InvalidArgument(field, f"lists {len(found)}; the limit is {MAX_APPROVERS}")
    for i, name in enumerate(found):
        problem = permission_problem(name)
        if problem is not None:
            raise InvalidArgument(f"{field}[{i}]", problem)
    return frozenset(found)


def _names(values: Iterable[str], field: str) -> frozenset[str]:
    found = list(values)
    if len(found) > MAX_APPROVERS:
        raise InvalidArgument(field, f"lists {len(found)}; the limit is {MAX_APPROVERS}")
    for i, name in enumerate(found):
        if not name or name != name.strip() or len(name) > 256:
            raise InvalidArgument(
                f"{field}[{i}]", "must be a name of 1 to 256 characters, without surrounding spaces"
            )
    return frozenset(found)


class NotAnApprover(DomainError):
    """A resolve or reject by a principal the promise's policy does not allow."""

    reason = Reason.NOT_AN_APPROVER

    def __init__(
        self, promise_id: str, rule: Rule, why: str, then: str = "nothing was changed"
    ) -> None:
        super().__init__(
            f"promise {promise_id!r} may not be settled by this principal (rule {rule.value}): "
            f"{why}; {then}",
            promise_id=promise_id,
            rule=rule.value,
        )
        self.rule = rule
        self.why = why


class PolicyNotChecked(DomainError):
    """A settle reached the writer checked against another policy than the promise's
    (the promise was created meanwhile): the service checks again and resends it."""

    def __init__(self, promise_id: str) -> None:
        super().__init__(
            f"promise {promise_id!r}: the settle was not checked against the promise's "
            "approver policy before the write; this is a server bug, please report it",
            promise_id=promise_id,
        )


def decide(
    promise_id: str,
    policy: Approvers | None,
    caller: Principal,
    starter: str | None,
    quorum_settlers: Collection[str | None] = (),
) -> NotAnApprover | None:
    """None if `caller` may settle the promise under `policy`, else the refusal.

    Args:
        promise_id: For the refusal's message.
        policy: The promise's policy (None: anyone).
        caller: Who settles.
        starter: The principal that started the workflow (`Promise.started_by`).
        quorum_settlers: Who settled the other promises of the same distinct quorum
            (None for those not settled by a principal).
    """
    if policy is None:
        return None
    if policy.lists_approvers:
        named = caller.name in policy.principals
        by_role = not policy.roles.isdisjoint(role.value for role in caller.roles)
        by_permission = not policy.permissions.isdisjoint(caller.permissions)
        if not (named or by_role or by_permission):
            return NotAnApprover(
                promise_id,
                Rule.APPROVERS,
                f"{caller.name!r} is not among its approvers ({policy.describe()})",
            )
    if policy.not_requester and starter is not None and caller.name == starter:
        return NotAnApprover(
            promise_id,
            Rule.NOT_REQUESTER,
            f"{caller.name!r} started the workflow, and the policy asks for four eyes: "
            "someone else must decide",
        )
    if policy.distinct:
        return check_distinct(promise_id, caller.name, quorum_settlers)
    return None


def early_refusal(
    policy: Approvers | None, early: Promise, starter: str | None
) -> NotAnApprover | None:
    """Whether the policy of a create refuses the settle that came before it
    (`create_if_missing`): None when that settle counts.

    It was made before any policy existed, so it is checked now, from what the
    promise records of it: the settler's name. A policy that lists roles or
    permissions, or asks for a distinct quorum, cannot be decided from a name afterwards: it
    refuses every early settle (its approvers settle once the promise exists).
    """
    if policy is None:
        return None
    settler = early.settled_by
    if policy.distinct:
        return NotAnApprover(
            early.id,
            Rule.DISTINCT,
            "it was settled before it existed, and a distinct quorum is counted only "
            "from settles of the created promise",
        )
    if settler is None or (
        (policy.roles or policy.permissions) and settler not in policy.principals
    ):
        who = "an unnamed caller" if settler is None else repr(settler)
        return NotAnApprover(
            early.id,
            Rule.APPROVERS,
            f"it was settled before it existed by {who}, whose roles and permissions the policy "
            f"({policy.describe()}) cannot check afterwards; only a principal it names "
            "may settle it early",
        )
    return decide(early.id, policy, Principal(name=settler, roles=frozenset()), starter)


def check_distinct(
    promise_id: str, caller: str | None, quorum_settlers: Collection[str | None]
) -> NotAnApprover | None:
    """The writer's part of `distinct`: a comparison with who settled the quorum.

    `caller` and `quorum_settlers` are `settled_by` values (or names): each is
    compared as the principal it names (`settle_tokens.settler`), so a settle with a
    settle token counts as its principal's, never as a token's."""
    principal = settler(caller)
    if principal is not None and principal in {settler(s) for s in quorum_settlers}:
        return NotAnApprover(
            promise_id,
            Rule.DISTINCT,
            f"{principal!r} already settled another approval of this quorum; "
            "each approval needs a different principal",
        )
    return None


def same_quorum(policy: Approvers | None, other: Approvers | None) -> bool:
    """Whether a sibling step with policy `other` is in the distinct quorum of `policy`."""
    return (
        policy is not None
        and other is not None
        and policy.distinct
        and other.distinct
        and policy.quorum == other.quorum
    )
