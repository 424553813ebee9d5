"""Schedules on the server: the use cases of the schedule RPCs (`ScheduleService`) and the
loop that fires them (`Scheduler`, a maintenance pass beside the sweeper's).

Each pass submits one `FireSchedulesOp` to the single writer: in one transaction, at the
store's time (DESIGN §4 rule 12: PostgreSQL's clock, or the one SQLite server's), it reads
the due schedules by `ix_schedules_due` (locked, skipping those another replica is firing),
advances each past its due ticks and starts their runs. A run's id is derived from the
schedule and the tick, so a replica, a retried transaction or a restart never starts a
tick twice; a crash before the commit loses nothing (the schedule was not advanced).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import structlog

from troth_server.domain.schedules import ScheduleNotFound
from troth_server.store import StoreError
from troth_server.writes.ops.schedules import (
    CreateScheduleOp,
    DeleteScheduleOp,
    Fired,
    FireSchedulesOp,
    PauseScheduleOp,
    UpdateScheduleOp,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from troth_server.domain.schedules import Schedule, ScheduleSpec
    from troth_server.store import Store
    from troth_server.writes.group_commit import GroupCommitter

log = structlog.get_logger("troth.schedules")

FIRE_BATCH = 20
"""Schedules one firing transaction advances (each starts at most `MAX_CATCH_UP` runs)."""
MAX_BATCHES_PER_PASS = 10


class ScheduleService:
    def __init__(
        self,
        store: Store,
        committer: GroupCommitter,
        clock: Callable[[], int],
        default_ttl_ms: int,
    ) -> None:
        self._store = store
        self._committer = committer
        self._clock = clock
        self._default_ttl_ms = default_ttl_ms
        """A run's lifetime when its schedule names none (`--default-workflow-ttl`)."""

    def now(self) -> int:
        return self._clock()

    async def create_async(
        self, spec: ScheduleSpec, principal: str | None, *, paused: bool = False
    ) -> tuple[Schedule, bool]:
        return await self._committer.submit_async(CreateScheduleOp(spec, principal, paused))

    async def update_async(self, spec: ScheduleSpec) -> tuple[Schedule, bool]:
        return await self._committer.submit_async(UpdateScheduleOp(spec))

    async def pause_async(self, name: str, paused: bool) -> tuple[Schedule, bool]:
        return await self._committer.submit_async(PauseScheduleOp(name, paused))

    async def delete_async(self, name: str) -> Schedule:
        schedule, _ = await self._committer.submit_async(DeleteScheduleOp(name))
        return schedule

    def get(self, name: str) -> Schedule:
        found = self._store.read_schedule(name)
        if found is None:
            raise ScheduleNotFound(name)
        return found

    def list(self, after: str, limit: int) -> list[Schedule]:
        return self._store.list_schedules(after, limit)

    def due(self) -> bool:
        """Whether a schedule may be due now: a read of the due index's first entry,
        so that a pass with nothing due costs the single writer no transaction. (The
        writer decides at its own time: a schedule found due here a moment early is
        left for the next pass.)"""
        soonest = self._store.soonest_fire_time()
        return soonest is not None and soonest <= self._clock()

    def fire(self, limit: int = FIRE_BATCH) -> Fired:
        """One firing transaction, at the store's time (blocks until committed)."""
        return self._committer.submit(FireSchedulesOp(limit, self._default_ttl_ms))


class Scheduler:
    """Fires due schedules every `interval` seconds; `start()` and `stop()` bound its thread."""

    def __init__(
        self,
        service: ScheduleService,
        *,
        interval: float,
        batch_size: int = FIRE_BATCH,
        on_store_error: Callable[[], None] = lambda: None,
    ) -> None:
        if interval <= 0 or batch_size <= 0:
            raise ValueError("scheduler interval and batch size must be positive")
        self._service = service
        self._interval = interval
        self._batch_size = batch_size
        self._on_store_error = on_store_error
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="troth-scheduler", daemon=True)
        self.passed = threading.Event()
        """Set after every pass; tests wait on it instead of sleeping."""

    def run_once(self) -> list[str]:
        """Fire every due schedule (a batch per transaction, a bounded number of them);
        returns the ids of the runs started."""
        started: list[str] = []
        if not self._service.due():
            return started
        for _ in range(MAX_BATCHES_PER_PASS):
            fired = self._service.fire(self._batch_size)
            started.extend(fired.started)
            if fired.schedules < self._batch_size:
                break
        return started

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.run_once()
            except StoreError as exc:
                self._on_store_error()
                log.warning("scheduler.store_unavailable", error=str(exc))
            except Exception:
                log.exception("scheduler.failed")
            self.passed.set()
