"""Schedules: a workflow started on a cron schedule, one run per tick (pure: `now` is a
parameter, no I/O, no clock).

A schedule names a workflow, its group and arguments, a 5-field cron expression read
in an IANA time zone, a catch-up policy and a jitter. Its **ticks** are the instants
the expression names (cronsim iterates them; in a time zone with daylight saving, a
tick at a fixed local time that falls in a spring-forward gap runs at the first
minute after the gap, and one in a fall-back overlap runs once, at its first
occurrence, as Debian's cron does; an expression with a `*` in its minute or hour
field follows real time, so `*/30 * * * *` runs every 30 real minutes through both).

Each tick starts one run whose id is derived from the schedule and the tick
(`run_id`: `<name>@<tick in UTC, ISO 8601>`), so that two replicas, a retried
transaction or a restart can never start a tick twice: a start is idempotent by id.
A tick fires at its time plus a jitter drawn from the schedule's name and the tick
(`jitter_for`: the same on every replica), in tick order.

What fires at `now` is decided by `plan`: the ticks due since the stored next tick,
under the schedule's catch-up policy (after downtime, a clock jump or a pause):

- `skip`: only a tick that is on time (fired within `ON_TIME_MS` of its fire time)
  runs; missed ticks are skipped, the schedule goes on with its next tick;
- `one`: the latest missed tick runs, once, for all of them;
- `all`: every missed tick runs, oldest first, at most the latest `MAX_CATCH_UP`.
"""

from __future__ import annotations

import enum
import hashlib
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from cronsim import CronSim, CronSimError

from troth.errors import Reason
from troth_server.domain.errors import DomainError, InvalidArgument

if TYPE_CHECKING:
    from collections.abc import Iterator

    from troth_server.domain.promise import Payload

SCHEDULE_TAG = "troth:schedule"
"""The tag on a scheduled run's root: the schedule's name (search a schedule's runs by it)."""
TICK_TAG = "troth:tick"
"""The tag on a scheduled run's root: its tick, in UTC, ISO 8601."""

MAX_CATCH_UP = 50
"""`all`: the most missed ticks one catch-up runs (the latest ones; older are skipped)."""
ON_TIME_MS = 60_000
"""`skip`: a tick fired at most this late is on time; a later one was missed."""
MAX_JITTER_MS = 3_600_000
"""The largest jitter a schedule may ask for (1 hour)."""
MAX_NAME_LENGTH = 200
NAME_PATTERN = re.compile(r"[A-Za-z0-9._~:/+=\-]+")
NAME_CHARSET = "letters, digits and . _ ~ : / + = -"
MAX_CRON_LENGTH = 200


class CatchUp(enum.StrEnum):
    SKIP = "skip"
    ONE = "one"
    ALL = "all"


class ScheduleNotFound(DomainError):
    reason = Reason.NOT_FOUND

    def __init__(self, name: str) -> None:
        super().__init__(
            f"schedule {name!r} does not exist; list them with `troth schedules list`",
            schedule=name,
        )
        self.name = name


class ScheduleAlreadyExists(DomainError):
    reason = Reason.ALREADY_EXISTS

    def __init__(self, name: str) -> None:
        super().__init__(
            f"schedule {name!r} already exists with another definition; delete it first "
            "(`troth schedules delete NAME`) or pick another name",
            schedule=name,
        )
        self.name = name


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """What a schedule's creator says: checked by `check_spec`."""

    name: str
    cron: str
    workflow: str
    group: str
    args: Payload
    timezone: str = "UTC"
    catch_up: CatchUp = CatchUp.SKIP
    jitter_ms: int = 0
    ttl_ms: int | None = None
    """Each run's lifetime; None for the server's default workflow lifetime."""


@dataclass(frozen=True, slots=True)
class Schedule:
    """A schedule as stored."""

    spec: ScheduleSpec
    create_time: int
    update_time: int
    created_by: str | None = None
    paused: bool = False
    next_tick: int | None = None
    """The next tick to fire (ms), whatever the jitter; None while paused."""
    next_fire_time: int | None = None
    """When that tick fires: `next_tick` plus its jitter (the due index's key)."""
    last_tick: int | None = None
    """The latest tick that started a run."""
    last_run_id: str | None = None
    skipped: int = 0
    """Ticks skipped by the catch-up policy so far (at least: `all` past its bound counts
    only what it saw)."""

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True, slots=True)
class Plan:
    """What a schedule does at `now`: the ticks to run (oldest first), how many it skips,
    and where it goes on."""

    runs: tuple[int, ...]
    skipped: int
    next_tick: int
    next_fire_time: int
    seen: tuple[int, ...] = field(default=())
    """Every due tick looked at (oldest first): `runs` and the skipped ones."""


# --- checks ------------------------------------------------------------------------


def check_name(name: str, field_name: str = "name") -> str:
    if not name:
        raise InvalidArgument(field_name, "is required: give the schedule a name, e.g. nightly")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidArgument(
            field_name, f"is {len(name)} characters long; the limit is {MAX_NAME_LENGTH}"
        )
    if not NAME_PATTERN.fullmatch(name):
        raise InvalidArgument(field_name, f"{name!r} has characters outside {NAME_CHARSET}")
    return name


def check_cron(expression: str) -> str:
    """A 5-field cron expression (minute hour day-of-month month day-of-week), as cronsim
    reads it (names such as MON and JAN, `L` for the last day, `#` for the nth weekday)."""
    text = " ".join(expression.split())
    if len(text) > MAX_CRON_LENGTH:
        raise InvalidArgument("cron", f"is longer than {MAX_CRON_LENGTH} characters")
    if len(text.split(" ")) != 5 or not text:
        raise InvalidArgument(
            "cron",
            f"{expression!r} must have 5 fields: minute hour day-of-month month day-of-week, "
            'e.g. "0 9 * * 1-5" (09:00 on weekdays)',
        )
    try:
        it = CronSim(text, datetime(2000, 1, 1, tzinfo=UTC))
        next(it)
    except CronSimError as exc:
        raise InvalidArgument(
            "cron", f'{expression!r}: {exc}; e.g. "0 9 * * 1-5" (09:00 on weekdays)'
        ) from exc
    except StopIteration as exc:
        raise InvalidArgument("cron", f"{expression!r} names no time that ever comes") from exc
    return text


def check_timezone(name: str) -> ZoneInfo:
    if not name:
        raise InvalidArgument("timezone", "is required: an IANA name, e.g. Europe/Paris or UTC")
    try:
        # Only names of the tz database: no file paths, no POSIX TZ strings.
        if name not in _zone_names():
            raise ZoneInfoNotFoundError(name)
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidArgument(
            "timezone", f"{name!r} is not an IANA time zone name; e.g. Europe/Paris or UTC"
        ) from exc


_ZONES: frozenset[str] | None = None


def _zone_names() -> frozenset[str]:
    global _ZONES
    if _ZONES is None:
        _ZONES = frozenset(available_timezones()) | {"UTC"}
    return _ZONES


def check_catch_up(value: str) -> CatchUp:
    try:
        return CatchUp(value or CatchUp.SKIP)
    except ValueError as exc:
        raise InvalidArgument(
            "catch_up", f"{value!r} must be one of skip, one, all (default skip)"
        ) from exc


def check_jitter(ms: int) -> int:
    if not 0 <= ms <= MAX_JITTER_MS:
        raise InvalidArgument("jitter", "must be between 0 and 1h")
    return ms


def check_spec(spec: ScheduleSpec) -> ScheduleSpec:
    """The spec with every field checked (InvalidArgument naming the field)."""
    check_name(spec.name)
    cron = check_cron(spec.cron)
    check_timezone(spec.timezone)
    check_jitter(spec.jitter_ms)
    if not spec.workflow:
        raise InvalidArgument("workflow", "is required: the registered workflow's name")
    if not spec.group:
        raise InvalidArgument("group", "is required: the group whose workers run it")
    return ScheduleSpec(
        name=spec.name,
        cron=cron,
        workflow=spec.workflow,
        group=spec.group,
        args=spec.args,
        timezone=spec.timezone,
        catch_up=check_catch_up(spec.catch_up),
        jitter_ms=spec.jitter_ms,
        ttl_ms=spec.ttl_ms,
    )


# --- ticks -------------------------------------------------------------------------


def _ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


def ticks_after(spec: ScheduleSpec, after: int) -> Iterator[int]:
    """The schedule's ticks strictly after `after` (ms), oldest first."""
    zone = ZoneInfo(spec.timezone)
    start = datetime.fromtimestamp(after / 1000, UTC).astimezone(zone)
    try:
        for moment in CronSim(spec.cron, start.replace(microsecond=0)):
            tick = _ms(moment)
            if tick > after:  # cronsim's fixed-time DST adjustment may step back
                yield tick
    except StopIteration:  # pragma: no cover - no tick in the next 50 years
        return


def ticks_until(spec: ScheduleSpec, until: int) -> Iterator[int]:
    """The schedule's ticks at or before `until` (ms), newest first."""
    zone = ZoneInfo(spec.timezone)
    # cronsim steps back one second before it looks: start a second after `until`'s
    # whole second, so that a tick at that very second is found.
    whole = until - until % 1000
    start = datetime.fromtimestamp(whole / 1000 + 1, UTC).astimezone(zone)
    try:
        for moment in CronSim(spec.cron, start, reverse=True):
            tick = _ms(moment)
            if tick <= until:
                yield tick
    except StopIteration:  # pragma: no cover - no tick in the previous 50 years
        return


def next_tick(spec: ScheduleSpec, after: int) -> int | None:
    return next(ticks_after(spec, after), None)


def jitter_for(name: str, tick: int, jitter_ms: int) -> int:
    """The delay of `tick` in [0, jitter_ms]: drawn from the name and the tick, so every
    replica (and every restart) agrees."""
    if jitter_ms <= 0:
        return 0
    digest = hashlib.sha256(f"{name}@{tick}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (jitter_ms + 1)


def fire_time(spec: ScheduleSpec, tick: int) -> int:
    return tick + jitter_for(spec.name, tick, spec.jitter_ms)


def tick_text(tick: int) -> str:
    """A tick in UTC, ISO 8601 to the second: 2026-12-07T09:00:00Z (ms when it has any)."""
    moment = datetime.fromtimestamp(tick / 1000, UTC)
    spec = "milliseconds" if tick % 1000 else "seconds"
    return moment.isoformat(timespec=spec).replace("+00:00", "Z")


def run_id(name: str, tick: int) -> str:
    """The id of the run a tick starts: `<name>@<tick>` (`tick_text`)."""
    return f"{name}@{tick_text(tick)}"


# --- what fires ----------------------------------------------------------------------

_FAR = timedelta(days=366 * 60)


def start(spec: ScheduleSpec, now: int) -> tuple[int, int] | None:
    """(next tick, its fire time) for a schedule created or resumed at `now`: the first
    tick after `now` (ticks while it was paused are not run); None: no tick ever comes."""
    tick = next_tick(spec, now)
    if tick is None:
        return None
    return tick, fire_time(spec, tick)


def plan(schedule: Schedule, now: int) -> Plan | None:
    """What `schedule` does at `now`: None when nothing is due (paused, or its next tick
    fires later); else the ticks to run and where it goes on.

    The due ticks are those from the stored next tick on whose fire time has come, in
    tick order (a tick whose jitter puts it after `now` waits, and so do the ticks after
    it). Only the latest `MAX_CATCH_UP + 1` due ticks are looked at: what a catch-up
    runs, and one more to know that older ones were missed.
    """
    spec = schedule.spec
    if schedule.paused or schedule.next_tick is None or schedule.next_fire_time is None:
        return None
    if schedule.next_fire_time > now:
        return None
    newest = []
    for tick in ticks_until(spec, now):
        if tick < schedule.next_tick:
            break
        newest.append(tick)
        if len(newest) > MAX_CATCH_UP:
            break
    newest.reverse()
    if len(newest) <= MAX_CATCH_UP and (not newest or newest[0] != schedule.next_tick):
        # The stored next tick came from iterating forward; should iterating back not
        # meet it (a daylight-saving edge), it is due all the same: never lost.
        newest.insert(0, schedule.next_tick)
    due: list[int] = []
    waiting: int | None = None
    for tick in newest:
        if fire_time(spec, tick) > now:
            waiting = tick
            break
        due.append(tick)
    older_missed = 1 if len(newest) > MAX_CATCH_UP and newest[0] > schedule.next_tick else 0
    runs = _runs(spec, due, now)
    skipped = len(due) - len(runs) + older_missed
    if waiting is None:
        after = next_tick(spec, max(now, due[-1] if due else now))
        if after is None:
            after = now + int(_FAR.total_seconds() * 1000)
        waiting = after
    return Plan(
        runs=tuple(runs),
        skipped=skipped,
        next_tick=waiting,
        next_fire_time=fire_time(spec, waiting),
        seen=tuple(due),
    )


def _runs(spec: ScheduleSpec, due: list[int], now: int) -> list[int]:
    if not due:
        return []
    match spec.catch_up:
        case CatchUp.ALL:
            return due[-MAX_CATCH_UP:]
        case CatchUp.ONE:
            return due[-1:]
        case CatchUp.SKIP:
            latest = due[-1]
            return [latest] if now - fire_time(spec, latest) <= ON_TIME_MS else []


def fired(schedule: Schedule, firing: Plan, now: int) -> Schedule:
    """The schedule after `firing` ran at `now`."""
    last = firing.runs[-1] if firing.runs else schedule.last_tick
    return Schedule(
        spec=schedule.spec,
        create_time=schedule.create_time,
        update_time=now,
        created_by=schedule.created_by,
        paused=False,
        next_tick=firing.next_tick,
        next_fire_time=firing.next_fire_time,
        last_tick=last,
        last_run_id=run_id(schedule.name, last) if last is not None else schedule.last_run_id,
        skipped=schedule.skipped + firing.skipped,
    )


def paused(schedule: Schedule, now: int) -> Schedule:
    return Schedule(
        spec=schedule.spec,
        create_time=schedule.create_time,
        update_time=now,
        created_by=schedule.created_by,
        paused=True,
        next_tick=None,
        next_fire_time=None,
        last_tick=schedule.last_tick,
        last_run_id=schedule.last_run_id,
        skipped=schedule.skipped,
    )


def resumed(schedule: Schedule, now: int) -> Schedule:
    """Running again from the first tick after `now` (a schedule not paused is kept)."""
    if not schedule.paused:
        return schedule
    first = start(schedule.spec, now)
    return Schedule(
        spec=schedule.spec,
        create_time=schedule.create_time,
        update_time=now,
        created_by=schedule.created_by,
        paused=False,
        next_tick=None if first is None else first[0],
        next_fire_time=None if first is None else first[1],
        last_tick=schedule.last_tick,
        last_run_id=schedule.last_run_id,
        skipped=schedule.skipped,
    )


def updated(schedule: Schedule, spec: ScheduleSpec, now: int) -> Schedule:
    """The schedule with a new definition: from its first tick after `now` (a paused one
    stays paused); what it ran and skipped is kept."""
    first = None if schedule.paused else start(spec, now)
    if not schedule.paused and first is None:
        raise InvalidArgument("cron", f"{spec.cron!r} names no time after now")
    return Schedule(
        spec=spec,
        create_time=schedule.create_time,
        update_time=now,
        created_by=schedule.created_by,
        paused=schedule.paused,
        next_tick=None if first is None else first[0],
        next_fire_time=None if first is None else first[1],
        last_tick=schedule.last_tick,
        last_run_id=schedule.last_run_id,
        skipped=schedule.skipped,
    )


def created(spec: ScheduleSpec, now: int, by: str | None, *, paused: bool = False) -> Schedule:
    first = None if paused else start(spec, now)
    if not paused and first is None:
        raise InvalidArgument("cron", f"{spec.cron!r} names no time after now")
    return Schedule(
        spec=spec,
        create_time=now,
        update_time=now,
        created_by=by,
        paused=paused,
        next_tick=None if first is None else first[0],
        next_fire_time=None if first is None else first[1],
    )
