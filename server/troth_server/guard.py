"""Who may settle a promise, decided before the write (DESIGN §7; §4 rule 14).

`SettleGuard` runs, on the caller's thread or event loop (never on the group
commit's writer), what a settle needs beyond the promise's state machine:

- a settle carrying a settle token: the token verified (`domain.settle_tokens`,
  an HMAC and a few comparisons), the settle then made in the token's name
  (`settle-token:<key id>:<token id>`) and checked against no policy;
- any other resolve or reject: the promise's approver policy checked against the
  caller (`domain.approvers`), from a point read of the promise and, for a
  distinct quorum, of the workflow's other steps.

The writer then only compares: the policy it sees with the one checked (else
`PolicyNotChecked`, and the service checks again), the quorum's settlers with
the settle's principal, and a token's id with the one the promise was settled
with (`settle_tokens.check_use`). It also mints tokens (`MintSettleToken`).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from troth_server.batch import Keys
from troth_server.domain import approvers as policies
from troth_server.domain import settle_tokens, steps
from troth_server.domain.access import Role, may_call
from troth_server.domain.errors import InvalidArgument, PromiseAlreadySettled, PromiseNotFound
from troth_server.domain.promise import PromiseState

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

    from troth_server.batch import Batch
    from troth_server.domain.access import Principal
    from troth_server.domain.promise import Promise, SettleRequest
    from troth_server.domain.settle_tokens import SettleToken
    from troth_server.domain.steps import Fence
    from troth_server.domain.task import Task
    from troth_server.group_commit import GroupCommitter
    from troth_server.settle_keys import SettleKeys
    from troth_server.store import Store, WriteTx

NEVER_EXPIRES_TOKEN_MS = 7 * 86_400_000
"""A token for a promise that never expires lasts this long unless asked otherwise."""


@dataclass(frozen=True, slots=True)
class _HeldTask:
    """Reads the task a worker's fence names, on the writer (a lookup, no write)."""

    fence: Fence

    def keys(self, tx: WriteTx, now: int) -> Keys:
        return Keys(task_ids=(self.fence.task_id,))

    def apply(self, batch: Batch) -> Task:
        return steps.check_fence(batch.task(self.fence.task_id), self.fence, pending=True)


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
        """`request`, made in the name of the settle token it carries, once verified."""
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
            request,
            principal=granted.principal,
            token_id=granted.token_id,
            checked_policy=None,
            quorum=(),
        )

    def precheck(
        self, request: SettleRequest, found: Promise | None, caller: Principal
    ) -> SettleRequest:
        """`request`, checked against `found`'s approver policy (raises `NotAnApprover`)."""
        if request.token_id is not None or request.state is PromiseState.REJECTED_CANCELED:
            return request
        if found is None or found.is_settled or found.approvers is None:
            # The writer refuses it (PolicyNotChecked) if the promise it sees has a policy.
            return replace(request, checked_policy=None, quorum=())
        policy = found.approvers
        quorum = self._quorum(found) if policy.distinct else []
        refusal = policies.decide(
            found.id, policy, caller, found.started_by, [p.settled_by for p in quorum]
        )
        if refusal is not None:
            raise refusal
        return replace(request, checked_policy=policy, quorum=tuple(p.id for p in quorum))

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
        policy = found.approvers
        if policy is None:
            return True
        quorum = self._quorum(found) if policy.distinct else []
        settlers = [p.settled_by for p in quorum]
        return policies.decide(found.id, policy, caller, found.started_by, settlers) is None

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
    ) -> tuple[str, SettleToken]:
        """A settle token for the pending promise `promise_id`. Gateways and admins
        mint for any promise; a worker for its own workflow's steps, with its fence."""
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
        latest = found.expire_time if found.expire_time is not None else None
        default = latest if latest is not None else now + NEVER_EXPIRES_TOKEN_MS
        expire_time = default if ttl_ms is None else now + ttl_ms
        if latest is not None:
            expire_time = min(expire_time, latest)  # a token never outlives its promise
        return settle_tokens.mint(
            self.keys.keyring(),
            promise_id,
            outcomes or settle_tokens.OUTCOMES,
            expire_time,
            secrets.token_bytes(settle_tokens.TOKEN_ID_BYTES),
        )

    def _check_worker(self, found: Promise, caller: Principal, fence: Fence | None) -> None:
        if fence is None:
            raise steps.ReservedForWorkflow(
                found.id,
                "needs the fence of its workflow's task for a worker to mint a settle token for it",
            )
        task = self._committer.submit(_HeldTask(fence))
        if found.parent_id != task.root_promise_id:
            raise steps.ReservedForWorkflow(
                found.id, f"is not a step of workflow {task.root_promise_id!r}"
            )
        if not caller.may_work_for(task.group):
            raise steps.ReservedForWorkflow(
                found.id, f"belongs to group {task.group!r}, which this worker may not work for"
            )
