"""Who may settle a promise, decided before the write (DESIGN §7; §4 rules 14 and 16).

`SettleGuard` runs, on the caller's thread or event loop (never on the group
commit's writer), what a settle needs beyond the promise's state machine:

- a settle carrying a settle token: the token verified (`domain.settle_tokens`,
  an HMAC and a few comparisons); the settle is then the settle of the principal
  the token acts for, recorded as `<principal> via settle-token <key>:<id>`;
- every resolve or reject, with a token or not: the promise's approver policy
  checked against the principal the settle acts for (`domain.approvers`), from a
  point read of the promise and, for a distinct quorum, of the workflow's other
  steps. A token's principal is its name and the roles it held at mint, with the
  permissions it held then of those the policy lists (a token carries no more).

The writer then only compares: the policy it sees with the one checked (else
`PolicyNotChecked`, and the service checks again), the quorum's settlers with
the settle's principal (by principal: `settle_tokens.settler`), and a token's
promise instance and id with the promise's (`settle_tokens.check_use`).

It also mints tokens (`MintSettleToken`): only for someone the policy would let
settle now, by the same decision. A token acts for its minter, or, minted by a
principal holding the gateway role with `acts_for`, for that named approver;
the server cannot know a named principal's roles, so only the policy's list of
principals (with four-eyes and distinct quorums) admits one.
"""

from __future__ import annotations

import secrets
from dataclasses import replace
from typing import TYPE_CHECKING

from troth_server.domain import approvers as policies
from troth_server.domain import settle_tokens, steps
from troth_server.domain.access import Principal, Role, may_call
from troth_server.domain.errors import InvalidArgument, PromiseAlreadySettled, PromiseNotFound
from troth_server.domain.promise import PromiseState
from troth_server.writes.ops.leases import HeldTaskOp

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

    from troth_server.domain.approvers import NotAnApprover
    from troth_server.domain.promise import Promise, SettleRequest
    from troth_server.domain.settle_tokens import SettleToken
    from troth_server.domain.steps import Fence
    from troth_server.settle_keys import SettleKeys
    from troth_server.store import Store
    from troth_server.writes.group_commit import GroupCommitter

NEVER_EXPIRES_TOKEN_MS = 7 * 86_400_000
"""A token for a promise that never expires lasts this long unless asked otherwise."""


class SettleGuard:
    def __init__(
        self,
        store: Store,
        committer: GroupCommitter,
        clock: Callable[[], int],
        keys: SettleKeys | None = None,
    ) -> None:
        self._store = store
        self._committer = committer
        self._clock = clock
        self.keys = keys

    # -- settles ---------------------------------------------------------------------

    def with_token(self, request: SettleRequest, token: str) -> SettleRequest:
        """`request`, made by the principal the settle token it carries acts for, once
        verified (`SettleRequest.token`: the policy is checked against `acting()`)."""
        if request.create_if_missing:
            raise InvalidArgument(
                "settle_token", "cannot go with create_if_missing: a token is for a promise "
                "that exists",
            )  # fmt: skip
        if self.keys is None:
            raise settle_tokens.TokensOff()
        granted = settle_tokens.verify(
            self.keys.keyring(), token, request.id, request.state, self._clock()
        )
        return replace(
            request, principal=granted.settled_by, token=granted, checked_policy=None, quorum=()
        )

    def precheck(
        self, request: SettleRequest, found: Promise | None, caller: Principal
    ) -> SettleRequest:
        """`request`, checked against `found`'s approver policy as the settle of
        `caller`, or of the principal its settle token acts for (whoever presented it).
        Raises `NotAnApprover`, and `PromiseReplaced` for a token of another instance."""
        if request.state is PromiseState.REJECTED_CANCELED:
            return request
        token = request.token
        if token is not None:
            caller = token.acting()
            if found is not None and found.instance != token.instance:
                raise settle_tokens.PromiseReplaced(found.id)
        if found is None or found.is_settled or found.approvers is None:
            # The writer refuses it (PolicyNotChecked) if the promise it sees has a policy.
            return replace(request, checked_policy=None, quorum=())
        refusal, quorum = self._decide(found, caller)
        if refusal is not None:
            raise refusal
        return replace(request, checked_policy=found.approvers, quorum=tuple(p.id for p in quorum))

    def may_settle(self, found: Promise, caller: Principal) -> bool:
        """Whether `caller` may resolve or reject `found` now, as `precheck` and the
        writer would decide (the inbox's `mine`): pending, an RPC its roles allow, an id
        inside its prefixes, no workflow's checkpoint, and the approver policy."""
        if found.is_settled or not caller.may_touch(found.id):
            return False
        if not (may_call(caller, "ResolvePromise") or may_call(caller, "RejectPromise")):
            return False
        if found.parent_id is not None and steps.is_checkpoint(found.tags):
            return False
        return self._decide(found, caller)[0] is None

    def _decide(
        self, found: Promise, principal: Principal
    ) -> tuple[NotAnApprover | None, list[Promise]]:
        """The policy's decision on `principal` settling `found` now (`approvers.decide`),
        and the other promises of its distinct quorum that it read."""
        policy = found.approvers
        if policy is None:
            return None, []
        quorum = self._quorum(found) if policy.distinct else []
        settlers = [p.settled_by for p in quorum]
        return policies.decide(found.id, policy, principal, found.started_by, settlers), quorum

    def _quorum(self, promise: Promise) -> list[Promise]:
        """The other promises of `promise`'s distinct quorum: its workflow's steps
        (by record) with the same quorum. None for a promise of no workflow."""
        if promise.parent_id is None:
            return []
        _, siblings = self._store.promise_tree(promise.parent_id)
        return [
            s
            for s in siblings
            if s.id != promise.id and policies.same_quorum(promise.approvers, s.approvers)
        ]

    # -- tokens ----------------------------------------------------------------------

    def mint(
        self,
        promise_id: str,
        outcomes: Collection[PromiseState],
        ttl_ms: int | None,
        caller: Principal,
        fence: Fence | None,
        acts_for: str | None = None,
    ) -> tuple[str, SettleToken]:
        """A settle token for the pending promise `promise_id`, acting for `caller`, or
        for the approver `acts_for` (a gateway's link "for bob"): only for a principal
        the promise's approver policy would let settle it now. Gateways and admins mint
        for any promise; a worker for its own workflow's steps, with its fence."""
        if self.keys is None:
            raise settle_tokens.TokensOff()
        found = self._store.get_promise(promise_id)
        if found is None:
            raise PromiseNotFound(promise_id)
        if not caller.has(Role.GATEWAY):
            self._check_worker(found, caller, fence)
        now = self._clock()
        if found.is_settled or (found.expire_time is not None and now >= found.expire_time):
            raise PromiseAlreadySettled(
                found,
                f"promise {promise_id!r} is no longer pending: no settle token is minted for it",
            )
        principal = self._acting(found, caller, acts_for)
        latest = found.expire_time if found.expire_time is not None else None
        default = latest if latest is not None else now + NEVER_EXPIRES_TOKEN_MS
        expire_time = default if ttl_ms is None else now + ttl_ms
        if latest is not None:
            expire_time = min(expire_time, latest)  # a token never outlives its promise
        return settle_tokens.mint(
            self.keys.keyring(),
            (promise_id, found.instance),
            outcomes or settle_tokens.OUTCOMES,
            expire_time,
            secrets.token_bytes(settle_tokens.TOKEN_ID_BYTES),
            principal,
        )

    def _acting(self, found: Promise, caller: Principal, acts_for: str | None) -> Principal:
        """Whom a token `caller` mints for `found` acts for: `caller` itself (its name and
        roles), or the approver `acts_for`, named by a principal holding the gateway role
        (its roles and permissions unknown: none). Refused as that principal's settle
        would be now."""
        named = acts_for is not None and acts_for != caller.name
        if named:
            assert acts_for is not None
            if Role.GATEWAY not in caller.roles:
                raise settle_tokens.MintForAnother(acts_for)
            principal = Principal(name=acts_for, roles=frozenset())
        else:
            if not settle_tokens.is_principal_name(caller.name):
                raise InvalidArgument(
                    "troth-principal",
                    f"{caller.name!r}: a settle token acts for its minter, whose name must be "
                    "printable ASCII without spaces; declare another name",
                )
            # Of its permissions, only those the promise's policy lists go into the
            # token: all the decision needs, and a link shows no more of the grant.
            listed = found.approvers.permissions if found.approvers is not None else frozenset()
            principal = Principal(
                name=caller.name, roles=caller.roles, permissions=caller.permissions & listed
            )
        refusal, _ = self._decide(found, principal)
        if refusal is None:
            return principal
        hint = ""
        if not named and Role.GATEWAY in caller.roles:
            hint = "; a gateway may mint one for an approver the policy names (acts_for)"
        elif named and refusal.rule is policies.Rule.APPROVERS and found.approvers is not None:
            hint = (
                "; a named approver is admitted only by the policy's list of principals "
                "(the server cannot know a named principal's roles or permissions)"
            )
        raise policies.NotAnApprover(
            found.id, refusal.rule, refusal.why + hint, then="no settle token was minted"
        )

    def _check_worker(self, found: Promise, caller: Principal, fence: Fence | None) -> None:
        if fence is None:
            raise steps.ReservedForWorkflow(
                found.id,
                "needs the fence of its workflow's task for a worker to mint a settle token for it",
            )
        task = self._committer.submit(HeldTaskOp(fence))
        if found.parent_id != task.root_promise_id:
            raise steps.ReservedForWorkflow(
                found.id, f"is not a step of workflow {task.root_promise_id!r}"
            )
        if not caller.may_work_for(task.group):
            raise steps.ReservedForWorkflow(
                found.id, f"belongs to group {task.group!r}, which this worker may not work for"
            )
