"""`Client.schedules`: workflows started on a cron schedule by the server, one run per
tick (`troth schedules ...` in the CLI; docs/schedules.md).

A schedule's runs are ordinary workflows: each tick starts one, with the id
`<name>@<tick in UTC>` (e.g. `nightly@2026-12-07T08:00:00Z`), tagged
`troth:schedule=<name>`, which `Client.search(tags=...)` and `troth workflows list`
find.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from troth import _arguments as check
from troth._convert import (
    datetime_from_proto,
    payload_from_proto,
    payload_to_proto,
    timedelta_to_proto,
)
from troth.v1 import schedules_pb2

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from datetime import datetime

    from troth._calls import Connection
    from troth.codec import Codec, Payload

__all__ = ["CATCH_UP_POLICIES", "ScheduleInfo", "Schedules"]

SCHEDULE_TAG = "troth:schedule"
"""The tag on each scheduled run's root: its schedule's name."""
CATCH_UP_POLICIES = ("skip", "one", "all")


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A schedule, as the server holds it.

    .. versionadded:: 0.3.0
    """

    name: str
    cron: str
    """A 5-field cron expression: minute hour day-of-month month day-of-week."""
    timezone: str
    """The IANA time zone the expression is read in."""
    workflow: str
    group: str
    args: Payload
    """The workflow's arguments, as the client's codec encoded them (a list)."""
    catch_up: str
    """After downtime, a clock jump or a pause: `skip`, `one` or `all`."""
    jitter: timedelta
    """Each tick fires up to this much later (the same delay on every replica)."""
    ttl: timedelta | None
    """Each run's lifetime; None: the server's default workflow lifetime."""
    paused: bool
    next_tick_time: datetime | None
    """The next tick (None while paused)."""
    next_fire_time: datetime | None
    """When that tick fires: the tick plus its jitter."""
    last_tick_time: datetime | None
    last_run_id: str | None
    """The id of the latest run a tick started."""
    skipped: int
    """Ticks the catch-up policy skipped so far."""
    created_by: str | None
    create_time: datetime | None
    update_time: datetime | None

    @classmethod
    def from_proto(cls, message: schedules_pb2.Schedule) -> ScheduleInfo:
        def when(field: str) -> datetime | None:
            return datetime_from_proto(getattr(message, field)) if message.HasField(field) else None

        return cls(
            name=message.name,
            cron=message.cron,
            timezone=message.timezone,
            workflow=message.workflow,
            group=message.group,
            args=payload_from_proto(message.args),
            catch_up=message.catch_up,
            jitter=message.jitter.ToTimedelta(),
            ttl=message.ttl.ToTimedelta() if message.HasField("ttl") else None,
            paused=message.paused,
            next_tick_time=when("next_tick_time"),
            next_fire_time=when("next_fire_time"),
            last_tick_time=when("last_tick_time"),
            last_run_id=message.last_run_id or None,
            skipped=message.skipped,
            created_by=message.created_by or None,
            create_time=when("create_time"),
            update_time=when("update_time"),
        )


class Schedules:
    """The schedule calls of a `Client` (`client.schedules`: create, update, get, list,
    pause, resume, delete): an operator's or admin's.

    .. versionadded:: 0.3.0
    """

    def __init__(self, connection: Connection, codec: Codec) -> None:
        self._connection = connection
        self._codec = codec

    def create(
        self,
        name: str,
        workflow: str | Callable[..., Any],
        *args: Any,
        cron: str,
        group: str = "workers",
        timezone: str = "UTC",
        catch_up: str = "skip",
        jitter: timedelta | None = None,
        ttl: timedelta | None = None,
        paused: bool = False,
    ) -> ScheduleInfo:
        """Start `workflow(*args)` in `group` at every tick of `cron`, read in `timezone`.

        A repeat with the same definition answers the existing schedule; another
        definition under the same name is refused (delete it first).

        Args:
            name: The schedule's name; each run's id is `<name>@<tick in UTC>`.
            workflow: The registered workflow name, or the workflow function.
            args: The workflow's arguments after `ctx` (encoded with the codec).
            cron: 5 fields, minute hour day-of-month month day-of-week, e.g.
                `"0 9 * * 1-5"` (09:00 on weekdays).
            group: The group whose workers run it.
            timezone: An IANA name, e.g. `"Europe/Paris"`.
            catch_up: After downtime: `"skip"` missed ticks, run `"one"` for them
                all, or run `"all"` of them (at most the latest 50).
            jitter: Each tick fires up to this much later (at most 1 h).
            ttl: Each run's lifetime (default: the server's workflow lifetime).
            paused: Create it paused (`resume` starts it).

        Raises:
            InvalidArgumentError: A bad cron, time zone, catch-up, name or jitter
                (`.field` names it).
            AlreadyExistsError: The name is another definition's.
            PermissionDeniedError: The caller is not an operator or admin.
        """
        call = "Client.schedules.create"
        check.texts(call, name=name, cron=cron, group=group, timezone=timezone)
        check.text(call, catch_up, "catch_up")
        request = schedules_pb2.CreateScheduleRequest(
            name=name,
            cron=cron,
            timezone=timezone,
            workflow=check.workflow_name(workflow),
            group=group,
            catch_up=catch_up,
            paused=bool(paused),
        )
        request.args.CopyFrom(payload_to_proto(self._codec.encode(list(args))))
        jitter = check.duration(call, jitter, "jitter")
        if jitter is not None:
            request.jitter.CopyFrom(timedelta_to_proto(jitter))
        ttl = check.duration(call, ttl, "ttl")
        if ttl is not None:
            request.ttl.CopyFrom(timedelta_to_proto(ttl))
        stub = self._connection.transport.tasks
        response = self._connection.call(stub.CreateSchedule, request)
        return ScheduleInfo.from_proto(response.schedule)

    def update(
        self,
        name: str,
        *,
        cron: str | None = None,
        workflow: str | Callable[..., Any] | None = None,
        args: Sequence[Any] | None = None,
        group: str | None = None,
        timezone: str | None = None,
        catch_up: str | None = None,
        jitter: timedelta | None = None,
        ttl: timedelta | None = None,
    ) -> ScheduleInfo:
        """Change a schedule's definition: the arguments given replace what it has (the
        others are kept), and it runs from the new definition's first tick after now (a
        paused one stays paused). Its runs so far are left as they are.

        Raises:
            NotFoundError: No schedule has this name.
            InvalidArgumentError: A bad value (`.field` names it), as for `create`.
        """
        call = "Client.schedules.update"
        current = self.get(name)
        check.texts(call, optional=True, cron=cron, group=group, timezone=timezone)
        check.optional_text(call, catch_up, "catch_up")
        request = schedules_pb2.UpdateScheduleRequest(
            name=name,
            cron=current.cron if cron is None else cron,
            timezone=current.timezone if timezone is None else timezone,
            workflow=current.workflow if workflow is None else check.workflow_name(workflow),
            group=current.group if group is None else group,
            catch_up=current.catch_up if catch_up is None else catch_up,
        )
        payload = current.args if args is None else self._codec.encode(list(args))
        request.args.CopyFrom(payload_to_proto(payload))
        jitter = current.jitter if jitter is None else check.duration(call, jitter, "jitter")
        if jitter:
            request.jitter.CopyFrom(timedelta_to_proto(jitter))
        ttl = current.ttl if ttl is None else check.duration(call, ttl, "ttl")
        if ttl is not None:
            request.ttl.CopyFrom(timedelta_to_proto(ttl))
        stub = self._connection.transport.tasks
        response = self._connection.call(stub.UpdateSchedule, request)
        return ScheduleInfo.from_proto(response.schedule)

    def get(self, name: str) -> ScheduleInfo:
        """The schedule (NotFoundError: none has this name)."""
        request = schedules_pb2.GetScheduleRequest(
            name=check.text("Client.schedules.get", name, "name")
        )
        stub = self._connection.transport.tasks
        return ScheduleInfo.from_proto(self._connection.call(stub.GetSchedule, request).schedule)

    def list(self) -> builtins.list[ScheduleInfo]:
        """Every schedule, by name."""
        return [s for page in self._pages() for s in page]

    def _pages(self) -> Iterator[builtins.list[ScheduleInfo]]:
        request = schedules_pb2.SearchSchedulesRequest(page_size=100)
        stub = self._connection.transport.tasks
        while True:
            response = self._connection.call(stub.SearchSchedules, request)
            yield [ScheduleInfo.from_proto(s) for s in response.schedules]
            if not response.next_page_token:
                return
            request.page_token = response.next_page_token

    def pause(self, name: str) -> ScheduleInfo:
        """Pause it: no tick fires until `resume` (pausing a paused one changes nothing)."""
        request = schedules_pb2.PauseScheduleRequest(
            name=check.text("Client.schedules.pause", name, "name")
        )
        stub = self._connection.transport.tasks
        return ScheduleInfo.from_proto(self._connection.call(stub.PauseSchedule, request).schedule)

    def resume(self, name: str) -> ScheduleInfo:
        """Resume it from its first tick after now: the ticks while it was paused are not
        run, whatever its catch-up policy."""
        request = schedules_pb2.ResumeScheduleRequest(
            name=check.text("Client.schedules.resume", name, "name")
        )
        stub = self._connection.transport.tasks
        return ScheduleInfo.from_proto(self._connection.call(stub.ResumeSchedule, request).schedule)

    def delete(self, name: str) -> ScheduleInfo:
        """Delete it (its runs are left as they are); returns it as it was."""
        request = schedules_pb2.DeleteScheduleRequest(
            name=check.text("Client.schedules.delete", name, "name")
        )
        stub = self._connection.transport.tasks
        return ScheduleInfo.from_proto(self._connection.call(stub.DeleteSchedule, request).schedule)
