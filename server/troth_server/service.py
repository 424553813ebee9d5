"""Use cases of the Promises API: one function per RPC, each one transaction.

Writes go through the group committer (so they share commits); reads go
straight to the store. A read that finds a PENDING promise past its
expire_time (by the store's clock: `troth_server.clock`) does not decide the
timeout itself: it asks the writer, which settles it at the transaction's time
unless a settle committed first, and answers what was committed. So a read
after expire_time never shows PENDING, sweeper or not, and a timeout a reader
was told of is already in the store: no replica then accepts a settle of that
promise, and no reader sees it change (§4 rules 3 and 4).
Nothing here knows protobuf or gRPC.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from troth_server import paging
from troth_server.checks import SchemaChecks
from troth_server.domain import approvers as policies
from troth_server.domain import promise as domain
from troth_server.domain import settle_tokens, steps
from troth_server.domain.access import LOCAL_DEVELOPER
from troth_server.domain.errors import PromiseNotFound, SettleTargetNotFound
from troth_server.domain.promise import PromiseState, SettleRequest
from troth_server.guard import SettleGuard
from troth_server.store import (
    PromiseOrder,
    PromiseQuery,
    PruneBatch,
    Store,
    StoreEvent,
)
from troth_server.watch import (
    AsyncEventSubscription,
    AsyncEventWatch,
    AsyncSubscription,
)
from troth_server.writes.ops.create import CreateOp
from troth_server.writes.ops.expire import ExpireOp, ReadDueOp
from troth_server.writes.ops.settle import Settled, SettleOp
from troth_server.writes.ops.states import StateStepOp

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterable

    from troth_server.domain.access import Principal
    from troth_server.domain.promise import CreateRequest, Payload, Promise
    from troth_server.domain.steps import Fence
    from troth_server.watch import EventFilter, WatchHub
    from troth_server.writes.batch import StateChange
    from troth_server.writes.group_commit import GroupCommitter

log = structlog.get_logger("troth.promises")


@dataclass(frozen=True, slots=True)
class PruneCounts:
    """What a prune deleted (in a dry run: would delete)."""

    promises: int = 0
    """Every row: the pruned workflows' roots and steps, and the standalone promises."""
    workflows: int = 0
    standalone: int = 0

    def plus(self, batch: PruneBatch) -> PruneCounts:
        return PruneCounts(
            self.promises + batch.promises,
            self.workflows + batch.workflows,
            self.standalone + batch.standalone,
        )


PRUNE_BATCH = 100
"""Top-level promises (each a standalone promise, or a workflow with its tree) looked at
per retention transaction: small, so that requests never wait long for the writer."""


@dataclass(frozen=True, slots=True)
class SearchPage:
    promises: list[Promise]
    next_page_token: str


class PromiseService:
    def __init__(
        self,
        store: Store,
        committer: GroupCommitter,
        hub: WatchHub,
        clock: Callable[[], int],
        checks: SchemaChecks | None = None,
        guard: SettleGuard | None = None,
    ) -> None:
        self._store = store
        self._committer = committer
        self._hub = hub
        self._clock = clock
        self.checks = checks or SchemaChecks()
        """Schema checks: never on the writer, never on the event loop."""
        self.guard = guard or SettleGuard(store, committer, clock)
        """Approver policies and settle tokens: checked before the write."""
        self.stopping = threading.Event()

    async def create_async(
        self,
        request: CreateRequest,
        principal: str | None = None,
        settled_with: SettleRequest | None = None,
        fence: Fence | None = None,
    ) -> tuple[Promise, bool]:
        """Create a promise (already settled, with `settled_with`), or find its repeat;
        with `fence`, as a step of the workflow whose task the fence names."""
        if request.schema is not None:
            await self.checks.schema_async(request.schema)
            if settled_with is not None:
                settled_with = await self.checks.precheck_async(settled_with, _as_created(request))
        op = CreateOp(request, principal, settled_with, fence)
        return await self._committer.submit_async(op)

    async def state_step_async(
        self,
        request: CreateRequest,
        principal: str | None,
        fence: Fence,
        name: str,
        value: Payload | None,
    ) -> tuple[Promise, bool]:
        """A workflow's read (`value` None) or write of its state slot `name`, recorded
        as its step `request.id` (`StateStepOp`)."""
        return await self._committer.submit_async(
            StateStepOp(request, principal, fence, name, value)
        )

    def with_settle_token(self, request: SettleRequest, token: str) -> SettleRequest:
        """`request` carrying the settle token `token`, once verified: a settle of the
        principal the token acts for (`SettleGuard.with_token`); cheap (an HMAC)."""
        return self.guard.with_token(request, token)

    async def settle_async(
        self,
        request: SettleRequest,
        fence: Fence | None = None,
        caller: Principal = LOCAL_DEVELOPER,
    ) -> Settled:
        """Settle a promise; a resolve value is checked against the promise's schema
        first, on the check pool (never on the loop or the writer), and an unfenced
        resolve or reject against its approver policy as `caller`'s, or, with a settle
        token (`with_settle_token`), as the settle of the principal the token acts for."""
        if fence is None and request.token is None:
            self.check_settle_reach(request, caller)  # point reads, as GetPromise's

        async def write(checked: SettleRequest) -> Settled:
            return await self._committer.submit_async(SettleOp(checked, fence))

        for attempt in range(_POLICY_ATTEMPTS):
            # A point read by primary key (as GetPromise), for the policy (`_reads`).
            found = self._store.get_promise(request.id) if _reads(request, fence, attempt) else None
            if fence is None and found is not None and _quorum_read(found):
                # A distinct quorum reads the workflow's steps: off the loop.
                request = await asyncio.to_thread(self.guard.precheck, request, found, caller)
            elif fence is None:
                request = self.guard.precheck(request, found, caller)
            if request.state is PromiseState.RESOLVED:
                request = await self.checks.precheck_async(request, found)
            try:
                return await self.checks.settle_checked_async(request, write)
            except policies.PolicyNotChecked:
                if attempt == _POLICY_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def mint_settle_token(
        self,
        promise_id: str,
        outcomes: frozenset[PromiseState],
        ttl_ms: int | None,
        caller: Principal,
        fence: Fence | None,
        acts_for: str | None = None,
    ) -> tuple[str, settle_tokens.SettleToken]:
        """A settle token for a pending promise, acting for `caller` or the approver
        `acts_for` (see `SettleGuard.mint`); blocking."""
        token, granted = self.guard.mint(promise_id, outcomes, ttl_ms, caller, fence, acts_for)
        log.info(
            "settle_token.minted",
            promise_id=promise_id,
            key_id=granted.key_id,
            token_id=granted.token_id,
            outcomes=sorted(o.value for o in granted.outcomes),
            expire_time=granted.expire_time,
            principal=caller.name,
            acts_for=granted.principal,
        )
        return token, granted

    def expire_overdue(self, limit: int, now: int | None = None) -> int:
        """Settle up to `limit` promises overdue at `now` (default: the store's clock,
        read inside the transaction) in one transaction; returns how many it settled."""
        # A read first: a quiet sweep costs no write transaction.
        if not self._store.expired_promise_ids(self._clock() if now is None else now, 1):
            return 0
        return self._committer.submit(ExpireOp(now, limit))

    def now(self) -> int:
        """The store's clock now (never behind it: see `troth_server.clock`)."""
        return self._clock()

    def prune_batch(
        self,
        settled_before: int,
        after: tuple[int, int] | None = None,
        *,
        limit: int = PRUNE_BATCH,
        dry_run: bool = False,
    ) -> PruneBatch:
        """One retention transaction: of the next `limit` settled top-level promises
        (after the cursor `after`) settled at or before `settled_before` (ms, the store's
        clock), delete the standalone ones and the finished workflows with their trees."""
        batch = self._store.write(
            lambda tx: tx.prune_settled(settled_before, after, limit, delete=not dry_run)
        )
        if batch.promises and not dry_run:
            log.info(
                "retention.pruned",
                promises=batch.promises,
                workflows=batch.workflows,
                standalone=batch.standalone,
            )
        return batch

    def prune(self, older_than_ms: int, *, dry_run: bool = False) -> PruneCounts:
        """Prune (or count, with `dry_run`) everything settled more than `older_than_ms`
        ago, a batch per transaction; between batches, requests waiting for the writer
        get as long as the batch took."""
        # One cutoff for the whole run, so that it ends however fast promises settle.
        cutoff = self._clock() - older_than_ms
        total, after = PruneCounts(), None
        while True:
            started = time.monotonic()
            batch = self.prune_batch(cutoff, after, dry_run=dry_run)
            total = total.plus(batch)
            if batch.after is None:
                return total
            after = batch.after
            if self._committer.busy():
                time.sleep(time.monotonic() - started)

    async def get_async(self, promise_id: str) -> Promise:
        """The promise as a reader sees it now: a timeout is decided by the writer
        (`decided`), without blocking the loop."""
        found = self._store.get_promise(promise_id)
        if found is None:
            raise PromiseNotFound(promise_id)
        return (await self.decided_async([found], self._clock()))[0]

    def decided(self, found: list[Promise], now: int) -> list[Promise]:
        """`found` as a reader at `now` must see it: a PENDING promise past its
        expire_time as the writer settled it (timed out, or settled just before)."""
        due = _due(found, now)
        if not due:
            return found
        return _merge(found, self._committer.submit(ReadDueOp(due)))

    async def decided_async(self, found: list[Promise], now: int) -> list[Promise]:
        due = _due(found, now)
        if not due:
            return found
        return _merge(found, await self._committer.submit_async(ReadDueOp(due)))

    def search(
        self,
        id_glob: str,
        states: frozenset[PromiseState],
        tags: dict[str, str],
        page_size: int,
        page_token: str,
        order: PromiseOrder = PromiseOrder.CREATED_ASC,
        created_before: int | None = None,
        settleable_by: Principal | None = None,
        prefixes: tuple[str, ...] = (),
        parent_id: str | None = None,
    ) -> SearchPage:
        """A page of matching promises; with `prefixes`, only those whose ids start with
        one of them (a scoped principal's search); with `settleable_by`, only those it may
        settle now (`SettleGuard.may_settle`, row by row: the page may come out shorter,
        even empty, and keeps the token of the rows it read); with `parent_id`, only the
        steps of that workflow."""
        query = paging.fingerprint(id_glob, states, tags, order, created_before, parent_id)
        after = paging.decode(page_token, order, query) if page_token else paging.START
        now = self._clock()
        rows = self._store.search_promises(
            PromiseQuery(
                id_glob,
                states,
                tags,
                after_seq=after.seq,
                limit=page_size + 1,
                order=order,
                after_expire_time=after.expire_time,
                created_before=created_before,
                id_prefixes=prefixes,
                parent_id=parent_id,
            ),
            now,
        )
        more = len(rows) > page_size
        rows = rows[:page_size]
        last = paging.Cursor(rows[-1].seq, rows[-1].promise.expire_time) if more else None
        token = paging.encode(last, order, query) if last is not None else ""
        found = self.decided([r.promise for r in rows], now)
        if states:
            # A row the filter took as timed out that the writer found settled
            # otherwise (or, at its time, not yet due) is not what was asked for.
            found = [p for p in found if p.state in states]
        if settleable_by is not None:
            found = [p for p in found if self.guard.may_settle(p, settleable_by)]
        return SearchPage(found, token)

    def workflow_groups(self, workflow_ids: Iterable[str]) -> dict[str, str]:
        """The task group of each of these workflows (roots or child roots) that exists:
        whose workers see its steps' keys and settle tokens (`domain.visibility`), and
        reach its steps (`domain.steps.check_worker_reach`)."""
        wanted = set(workflow_ids)
        return steps.groups_of(self._store.get_promises(wanted)) if wanted else {}

    def check_reach(self, promise: Promise, reader: Principal, action: str) -> None:
        """Refuse `reader` a promise outside its reach (a worker's: its groups'
        workflows, `domain.steps.check_worker_reach`); a point read of the promise's
        workflow when the rule needs its group."""
        parent = steps.reach_parent(promise, reader)
        group = None if parent is None else self.workflow_groups([parent]).get(parent)
        steps.check_worker_reach(reader, promise, group, action)

    def check_settle_reach(self, request: SettleRequest, caller: Principal) -> None:
        """An unfenced settle by a worker, of a promise of its groups' workflows only:
        read before the write (a promise's workflow never changes while it is pending;
        a settled one is only answered, as it was)."""
        if not steps.is_confined(caller) or request.state is PromiseState.REJECTED_CANCELED:
            return
        found = self._store.get_promise(request.id)
        if found is None:
            if request.create_if_missing:
                steps.check_worker_early(caller, request.id)
            raise SettleTargetNotFound(request.id)
        self.check_reach(found, caller, "settle")

    def watch_async(self, promise_id: str, until: float | None = None) -> PromiseWatch:
        """The promise now, then once more when it settles: iterate it with `async for`
        on this event loop (see `PromiseWatch`)."""
        loop = asyncio.get_running_loop()
        subscription = self._hub.subscribe(promise_id, loop)
        assert isinstance(subscription, AsyncSubscription)
        return PromiseWatch(self, subscription, until)

    async def wait_async(self, promise_id: str, seconds: float) -> Promise:
        """The promise once it is settled, or as it is after `seconds` if that comes
        first (`WaitPromise`, a long poll; at once at server shutdown)."""
        seen = [p async for p in self.watch_async(promise_id, time.monotonic() + seconds)]
        return seen[-1]  # a watch yields the promise first (or raises), then once settled

    def watch_events_async(self, wanted: EventFilter, backlog: int) -> AsyncEventWatch:
        """Events of the promises `wanted` matches, from now on: iterate it with
        `async for` (see `AsyncEventWatch`)."""
        subscription = self._hub.subscribe_events(wanted, backlog, asyncio.get_running_loop())
        assert isinstance(subscription, AsyncEventSubscription)
        return AsyncEventWatch(subscription, self.stopping)

    def on_remote_changes(self, event: StoreEvent) -> None:
        """Another replica committed: event watchers here hear of its creates and
        settles, or, after a gap in announcements, that they may have missed some."""
        if event.resync:
            self._hub.events_missed()
        else:
            self._hub.publish_remote(event.created_ids, event.settled_ids, self._store.get_promises)

    def stop_watches(self) -> None:
        """End every open watch stream (server shutdown)."""
        self.stopping.set()
        self._hub.wake_all()

    def on_remote_settled(self, promise_ids: Iterable[str] | None) -> None:
        """Another replica settled these promises (None: it may have settled any):
        watchers here read them from the store and hear of those now settled."""
        watched = self._hub.watched_ids()
        wanted = watched if promise_ids is None else watched.intersection(promise_ids)
        if wanted:
            self._hub.publish(p for p in self._store.get_promises(wanted) if p.is_settled)

    def on_commit(self, changes: list[StateChange]) -> None:
        """Tell watchers, then log every state change (after commit, never before)."""
        self._hub.publish(c.promise for c in changes if c.promise.is_settled)
        self._hub.publish_changes(changes)
        for change in changes:
            log.info(
                "promise.state_changed",
                promise_id=change.promise.id,
                old_state=change.old_state.value if change.old_state else None,
                new_state=change.promise.state.value,
                principal=change.principal,
            )


_POLICY_ATTEMPTS = 3
"""A policy never changes once created: a settle meets at most one it was not checked
against (the first attempt, which checks none, or the promise appeared after the check
read it)."""


def _reads(request: SettleRequest, fence: Fence | None, attempt: int) -> bool:
    """Whether a settle reads its promise before the write: an unfenced one, for the
    approver policy, once the writer refused it for a policy it was not checked
    against (`PolicyNotChecked`). The first attempt reads nothing: most promises have
    no policy and no schema, and the writer refuses a settle whose promise has one it
    was not checked against; the value is then checked against the schema the refusal
    names (`ValueNotChecked`), the policy against the promise read here, and the
    settle sent again. A read before every settle cost a round trip to the database
    on the event loop, and cost more than the second pass even for typed decisions
    under load (bench/README.md, issue 13 part 6)."""
    return attempt > 0 and fence is None and request.state is not PromiseState.REJECTED_CANCELED


def _quorum_read(found: Promise) -> bool:
    return (
        found.approvers is not None
        and found.approvers.distinct
        and found.parent_id is not None
        and not found.is_settled
    )


def _as_created(request: CreateRequest) -> Promise:
    """What a create-already-settled checks its value against: the new promise."""
    return domain.Promise(
        id=request.id,
        state=PromiseState.PENDING,
        param=request.param,
        value=domain.EMPTY,
        tags=request.tags,
        create_time=0,
        schema=request.schema,
    )


def _due(found: list[Promise], now: int) -> tuple[str, ...]:
    return tuple(p.id for p in found if domain.is_expired(p, now))


def _merge(found: list[Promise], decided: list[Promise]) -> list[Promise]:
    by_id = {p.id: p for p in decided}
    return [by_id.get(p.id, p) for p in found]


class PromiseWatch:
    """Iterate with `async for` to get the promise now, then settled; `cancel()` ends it
    from any thread.

    Subscribes before the first read, so a settle between the read and the
    wait cannot be missed. Wakes at the promise's expire_time on its own, so a
    timeout is seen at once, whether or not the sweeper has run. With `until` (a
    `time.monotonic()` instant), it ends then, settled or not.
    """

    def __init__(
        self, service: PromiseService, subscription: AsyncSubscription, until: float | None = None
    ) -> None:
        self._service = service
        self._subscription = subscription
        self._cancelled = False
        self._until = until

    def cancel(self) -> None:
        self._cancelled = True
        self._subscription.wake()

    def _wait_for(self, current: Promise) -> float | None:
        """How long to wait for a settle (None: forever); -1 when the watch is over."""
        if self._cancelled or self._service.stopping.is_set():
            return -1
        left = None if self._until is None else self._until - time.monotonic()
        if left is not None and left <= 0:
            return -1
        if current.expire_time is None:
            return left
        expiry = max(0.0, (current.expire_time - self._service.now()) / 1000)
        return expiry if left is None else min(expiry, left)

    async def _woken(self, current: Promise) -> Promise:
        if self._subscription.settled is not None:
            return self._subscription.settled
        return (await self._service.decided_async([current], self._service.now()))[0]

    async def __aiter__(self) -> AsyncIterator[Promise]:
        try:
            current = await self._service.get_async(self._subscription.promise_id)
            yield current
            while not current.is_settled:
                timeout = self._wait_for(current)
                if timeout is not None and timeout < 0:
                    return
                await self._subscription.wait_async(timeout)
                current = await self._woken(current)
                if current.is_settled:
                    yield current
        finally:
            self._subscription.close()
