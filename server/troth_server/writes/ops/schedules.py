"""Schedules' writes: create, update, pause or resume, delete a schedule; and fire the due ones
(`FireSchedulesOp`), which advances each schedule and starts its runs in one
transaction, so that a crash between the two can neither lose a tick nor start it twice.

The schedule rows are read, locked and written in `keys` (inside the transaction, before
the batch's promises are loaded: a run's id must be known to load it); `keys` never
raises a refusal, it keeps the outcome for `apply`, so that one bad request never fails
the batch it shares.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from troth_server.domain import schedules
from troth_server.domain.errors import DomainError
from troth_server.domain.promise import CreateRequest
from troth_server.domain.routing import FUNC_TAG
from troth_server.domain.schedules import (
    SCHEDULE_TAG,
    TICK_TAG,
    Schedule,
    ScheduleAlreadyExists,
    ScheduleNotFound,
    ScheduleSpec,
)
from troth_server.domain.steps import INVOKE_TAG
from troth_server.writes.batch import Batch, Keys
from troth_server.writes.ops.create import CreateOp

if TYPE_CHECKING:
    from collections.abc import Callable

    from troth_server.store import WriteTx

log = structlog.get_logger("troth.schedules")


@dataclass(slots=True)
class CreateScheduleOp:
    """Create a schedule; a repeat of the same definition answers the existing one
    (created False); another definition under the name is refused."""

    spec: ScheduleSpec
    principal: str | None
    paused: bool = False
    _outcome: tuple[Schedule, bool] | DomainError | None = field(default=None, repr=False)

    def keys(self, tx: WriteTx, now: int) -> Keys:
        existing = tx.get_schedule(self.spec.name)
        if existing is not None:
            same = existing.spec == self.spec
            self._outcome = (existing, False) if same else ScheduleAlreadyExists(self.spec.name)
            return Keys()
        try:
            schedule = schedules.created(self.spec, now, self.principal, paused=self.paused)
        except DomainError as exc:
            self._outcome = exc
            return Keys()
        tx.insert_schedule(schedule)
        self._outcome = (schedule, True)
        return Keys()

    def apply(self, batch: Batch) -> tuple[Schedule, bool]:
        return _answer(self._outcome)


@dataclass(slots=True)
class UpdateScheduleOp:
    """Replace a schedule's definition (`schedules.updated`); the same one changes nothing."""

    spec: ScheduleSpec
    _outcome: tuple[Schedule, bool] | DomainError | None = field(default=None, repr=False)

    def keys(self, tx: WriteTx, now: int) -> Keys:
        def edit(existing: Schedule) -> Schedule | None:
            same = existing.spec == self.spec
            return None if same else schedules.updated(existing, self.spec, now)

        self._outcome = _edit(tx, self.spec.name, edit)
        return Keys()

    def apply(self, batch: Batch) -> tuple[Schedule, bool]:
        return _answer(self._outcome)


@dataclass(slots=True)
class PauseScheduleOp:
    """Pause (`paused` True) or resume a schedule: a resumed schedule runs from its first
    tick after now (the ticks while it was paused are not run, whatever its catch-up)."""

    name: str
    paused: bool
    _outcome: tuple[Schedule, bool] | DomainError | None = field(default=None, repr=False)

    def keys(self, tx: WriteTx, now: int) -> Keys:
        def edit(existing: Schedule) -> Schedule | None:
            if existing.paused == self.paused:
                return None
            return (schedules.paused if self.paused else schedules.resumed)(existing, now)

        self._outcome = _edit(tx, self.name, edit)
        return Keys()

    def apply(self, batch: Batch) -> tuple[Schedule, bool]:
        return _answer(self._outcome)


@dataclass(slots=True)
class DeleteScheduleOp:
    """Delete a schedule (its runs are left as they are)."""

    name: str
    _outcome: tuple[Schedule, bool] | DomainError | None = field(default=None, repr=False)

    def keys(self, tx: WriteTx, now: int) -> Keys:
        existing = tx.get_schedule(self.name)
        if existing is None:
            self._outcome = ScheduleNotFound(self.name)
            return Keys()
        tx.delete_schedule(self.name)
        self._outcome = (existing, True)
        return Keys()

    def apply(self, batch: Batch) -> tuple[Schedule, bool]:
        return _answer(self._outcome)


def _edit(
    tx: WriteTx, name: str, edit: Callable[[Schedule], Schedule | None]
) -> tuple[Schedule, bool] | DomainError:
    """The outcome of changing schedule `name` by `edit` (None: it is so already),
    written if it changed; a refusal (an unknown name, what `edit` raises) kept."""
    existing = tx.get_schedule(name)
    if existing is None:
        return ScheduleNotFound(name)
    try:
        changed = edit(existing)
    except DomainError as exc:
        return exc
    if changed is None:
        return existing, False
    tx.update_schedules([changed])
    return changed, True


def _answer(outcome: tuple[Schedule, bool] | DomainError | None) -> tuple[Schedule, bool]:
    if isinstance(outcome, DomainError):
        raise outcome
    assert outcome is not None, "keys runs before apply"
    return outcome


@dataclass(frozen=True, slots=True)
class Fired:
    """What one firing pass did."""

    schedules: int
    """Schedules advanced."""
    started: list[str]
    """Runs started (their ids)."""
    skipped: int
    """Ticks skipped by catch-up policies."""
    refused: int
    """Ticks whose run could not be started (its id is another promise's)."""


@dataclass(slots=True)
class FireSchedulesOp:
    """Fire up to `limit` due schedules at the transaction's time: each is advanced past
    the ticks its catch-up policy runs or skips, and each run is started (a workflow
    start, `CreateOp`, id `<name>@<tick>`) in the same transaction."""

    limit: int
    default_ttl_ms: int
    _firing: list[tuple[Schedule, int, list[CreateOp]]] = field(default_factory=list, repr=False)

    def keys(self, tx: WriteTx, now: int) -> Keys:
        self._firing = []
        advanced: list[Schedule] = []
        promises: list[str] = []
        for schedule in tx.due_schedules(now, self.limit):
            firing = schedules.plan(schedule, now)
            if firing is None:  # pragma: no cover - the read asked for due ones
                continue
            advanced.append(schedules.fired(schedule, firing, now))
            creates = [self._start(schedule, tick) for tick in firing.runs]
            for create in creates:
                promises.extend(create.keys(tx, now).promises)
            self._firing.append((schedule, firing.skipped, creates))
        tx.update_schedules(advanced)
        return Keys(promises=promises)

    def _start(self, schedule: Schedule, tick: int) -> CreateOp:
        spec = schedule.spec
        request = CreateRequest(
            id=schedules.run_id(spec.name, tick),
            param=spec.args,
            tags={
                INVOKE_TAG: spec.group,
                FUNC_TAG: spec.workflow,
                SCHEDULE_TAG: spec.name,
                TICK_TAG: schedules.tick_text(tick),
            },
            ttl=spec.ttl_ms if spec.ttl_ms is not None else self.default_ttl_ms,
        )
        return CreateOp(request, schedule.created_by)

    def apply(self, batch: Batch) -> Fired:
        started: list[str] = []
        refused = skipped = 0
        for schedule, missed, creates in self._firing:
            if missed:
                skipped += missed
                log.warning(
                    "schedule.ticks_skipped", schedule=schedule.name, skipped=missed,
                    catch_up=schedule.spec.catch_up.value,
                )  # fmt: skip
            for create in creates:
                try:
                    promise, created = create.apply(batch)
                except DomainError as exc:
                    refused += 1
                    log.error(
                        "schedule.run_refused", schedule=schedule.name,
                        run_id=create.request.id, reason=exc.reason.value, error=exc.message,
                    )  # fmt: skip
                    continue
                if created:
                    started.append(promise.id)
                    log.info(
                        "schedule.run_started", schedule=schedule.name, run_id=promise.id,
                        workflow=schedule.spec.workflow, group=schedule.spec.group,
                    )  # fmt: skip
        return Fired(len(self._firing), started, skipped, refused)
