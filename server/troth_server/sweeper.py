"""Expires overdue promises in batches, so watchers and the store catch up with time;
gives back the tasks whose lease ran out; and keeps the history from growing without end.

Readers never depend on it (reads apply expiry themselves); it makes the
stored state and `WatchPromise` streams follow within one interval. On the
same beat, in small transactions that take turns with queued requests, it
deletes completed tasks once a repeated CompleteTask can no longer come
(`forget_completed`), and, with a retention, prunes settled promises older
than it: finished workflows whole, and standalone promises (`PromiseService.prune_batch`).

Last in each pass, with `LeaseExpiry` (River's `job_rescuer` is the model: its config,
checked when the sweeper is built; `run_once`; what it did in `SweepCounts`), up to one
batch of tasks whose lease ran out go back to their group (`writes.ops.leases.ReclaimOp`),
but none within one lease length of when this server last came back from being away
(frozen, or cut off from the store: DESIGN §4), asked inside the transaction, at its time.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from troth_server.store import StoreError
from troth_server.writes.ops.leases import ReclaimOp

if TYPE_CHECKING:
    from collections.abc import Callable

    from troth_server.domain.task import Task
    from troth_server.service import PromiseService
    from troth_server.writes.group_commit import GroupCommitter

log = structlog.get_logger("troth.sweeper")


@dataclass(frozen=True, slots=True)
class SweepCounts:
    expired: int
    """Promises this pass settled by expiry."""
    batches: int
    """Write transactions it took (none when nothing was overdue)."""
    pruned: int = 0
    """Promises deleted by retention (roots, their steps, standalone promises)."""
    forgotten_tasks: int = 0
    """Completed tasks deleted."""
    leases_expired: int = 0
    """Tasks given back to their group because their lease ran out."""


@dataclass(frozen=True, slots=True)
class LeaseExpiry:
    """The sweeper's lease rescue: what it needs besides the sweeper's batch size."""

    committer: GroupCommitter
    """The single writer, which runs the rescue (`ReclaimOp`) in a transaction of its own."""
    came_back: Callable[[int], int] | None = None
    """When this server last came back from being away (`tasks.lease_expired`), asked
    inside the transaction at its time: no lease is taken for one lease length from
    then, since workers could not heartbeat (`clock.OutageGuard.tick`)."""
    on_expired: Callable[[list[Task]], None] | None = None
    """Told of the tasks whose lease ran out, on the writer, before the commit that makes
    them PENDING wakes anyone (the dispatcher stalls their streams)."""
    on_lost: Callable[[list[Task]], None] | None = None
    """Told of them after that commit (the dispatcher offers them to others; metrics)."""


PRUNE_BATCHES_PER_PASS = 10
"""Retention batches one pass may run: a backlog (retention just turned on, a mass of
workflows ending together) is worked off over several passes, never in one long one."""


class Sweeper:
    def __init__(
        self,
        service: PromiseService,
        *,
        interval: float,
        batch_size: int,
        on_tick: Callable[[], None] | None = None,
        others_waiting: Callable[[], bool] = lambda: False,
        on_store_error: Callable[[], None] = lambda: None,
        retention_ms: int = 0,
        forget_completed: Callable[[int], int] | None = None,
        on_pass: Callable[[SweepCounts | None, float], None] | None = None,
        leases: LeaseExpiry | None = None,
    ) -> None:
        if interval <= 0 or batch_size <= 0:
            raise ValueError("sweeper interval and batch size must be positive")
        self._service = service
        self._interval = interval
        self._batch_size = batch_size
        self._on_tick = on_tick
        """More periodic work on the same beat (the dispatch and watch fallbacks)."""
        self._others_waiting = others_waiting
        """Whether requests wait for the writer: a long sweep then takes turns with them."""
        self._on_store_error = on_store_error
        """A pass failed to reach the store (the outage guard hears of it)."""
        self._retention_ms = retention_ms
        """Settled promises older than this are pruned; 0 keeps them forever."""
        self._prune_after: tuple[int, int] | None = None
        """Where the next retention batch starts (None: from the oldest)."""
        self._forget_completed = forget_completed
        """Deletes one batch of completed tasks past their keeping; returns how many."""
        self._on_pass = on_pass
        """Each pass of the loop: what it did (None: it failed) and its seconds (metrics)."""
        self._leases = leases
        """Lease expiry (None: leases are not this sweeper's)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="troth-sweeper", daemon=True)
        self.swept = threading.Event()
        """Set after every pass; tests wait on it instead of sleeping."""

    def run_once(self, now: int | None = None) -> SweepCounts:
        """Expire everything overdue at `now` (default: the clock), a batch per transaction;
        forget completed tasks and prune by retention; then give back up to one batch of
        tasks whose lease ran out at `now` (default: the transaction's time)."""
        expired = batches = 0
        while True:
            started = time.monotonic()
            n = self._service.expire_overdue(self._batch_size, now)
            if n:
                batches += 1
                expired += n
            if n < self._batch_size:
                break
            if self._others_waiting():
                # A mass expiry (a deadline thousands of promises share) must not
                # starve the requests queued behind it on the one writer: after
                # each full batch, give them as long as the batch took.
                self._stop.wait(time.monotonic() - started)
        if expired:
            log.info("sweeper.expired", expired=expired, batches=batches)
        forgotten = self._run_batches(self._forget_batch)
        pruned = self._run_batches(lambda: self._prune(now), PRUNE_BATCHES_PER_PASS)
        lost = self._expire_leases(now)
        return SweepCounts(
            expired, batches, pruned=pruned, forgotten_tasks=forgotten, leases_expired=len(lost)
        )

    def _expire_leases(self, now: int | None) -> list[Task]:
        """Give back up to one batch of tasks whose lease ran out at `now` (None: at the
        transaction's time), none within one lease length of coming back."""
        leases = self._leases
        if leases is None:
            return []
        op = ReclaimOp(None, now, self._batch_size, leases.came_back, on_expired=leases.on_expired)
        lost = leases.committer.submit(op)
        if leases.on_lost is not None:
            leases.on_lost(lost)
        return lost

    def _run_batches(self, batch: Callable[[], tuple[int, bool]], most: int = 1000) -> int:
        """Run `batch` (done, more to do) until nothing is left or `most` ran, taking turns
        with the requests waiting for the writer after each."""
        total = 0
        for _ in range(most):
            started = time.monotonic()
            done, more = batch()
            total += done
            if not more:
                break
            if self._others_waiting():
                self._stop.wait(time.monotonic() - started)
        return total

    def _forget_batch(self) -> tuple[int, bool]:
        if self._forget_completed is None:
            return 0, False
        done = self._forget_completed(self._batch_size)
        return done, done == self._batch_size

    def _prune(self, now: int | None) -> tuple[int, bool]:
        if not self._retention_ms:
            return 0, False
        at = self._service.now() if now is None else now
        batch = self._service.prune_batch(at - self._retention_ms, self._prune_after)
        # At the end, start again from the oldest: what was kept back (a workflow
        # still running compensation) is looked at again next time.
        self._prune_after = batch.after
        return batch.promises, batch.after is not None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            started = time.monotonic()
            counts: SweepCounts | None = None
            try:
                counts = self.run_once()
                if self._on_tick is not None:
                    self._on_tick()
            except StoreError as exc:
                counts = None
                self._on_store_error()
                log.warning("sweeper.store_unavailable", error=str(exc))
            except Exception:
                counts = None
                log.exception("sweeper.failed")
            if self._on_pass is not None:
                self._on_pass(counts, time.monotonic() - started)
            self.swept.set()
