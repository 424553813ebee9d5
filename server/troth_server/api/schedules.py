"""The schedule RPCs of `troth.v1.TaskService` (a base of its servicer): validation,
conversion to and from `schedules.proto`, and the calls to `ScheduleService`.

A principal scoped to id prefixes names only schedules whose runs' ids
(`<name>@<tick>`) are inside its prefixes, and lists only those.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, TypeAlias

import structlog
from google.protobuf.timestamp_pb2 import Timestamp

from troth.v1 import schedules_pb2
from troth_server import paging
from troth_server.api import _convert as convert
from troth_server.api._auth import caller, caller_name, require_inside
from troth_server.api._rpc import aio_unary
from troth_server.domain import schedules as domain
from troth_server.domain.errors import InvalidArgument
from troth_server.domain.promise import EMPTY
from troth_server.domain.schedules import ScheduleSpec

if TYPE_CHECKING:
    import grpc.aio
    from google.protobuf.duration_pb2 import Duration

    from troth_server.config import Limits
    from troth_server.domain.schedules import Schedule
    from troth_server.schedules import ScheduleService

    AioContext: TypeAlias = grpc.aio.ServicerContext[Any, Any]

log = structlog.get_logger("troth.schedules")


class ScheduleHandlers:
    """The schedule RPCs; `schedules` is set when the servicer is built (`app.servicers`)."""

    _limits: Limits
    schedules: ScheduleService | None = None

    @property
    def _schedules(self) -> ScheduleService:
        if self.schedules is None:
            raise RuntimeError("TaskServiceServicer was built without its ScheduleService")
        return self.schedules

    def _named(self, name: str, context: AioContext, rpc: str) -> str:
        domain.check_name(name)
        require_inside(f"{name}@", context, rpc)
        return name

    @aio_unary("CreateSchedule")
    async def CreateSchedule(
        self, request: schedules_pb2.CreateScheduleRequest, context: AioContext
    ) -> schedules_pb2.CreateScheduleResponse:
        spec = self._spec(request, context)
        by = caller_name(context, self._limits)
        schedule, created = await self._schedules.create_async(spec, by, paused=request.paused)
        if created:
            log.info(
                "schedule.created", schedule=spec.name, cron=spec.cron, timezone=spec.timezone,
                workflow=spec.workflow, group=spec.group, catch_up=spec.catch_up.value, by=by,
            )  # fmt: skip
        return schedules_pb2.CreateScheduleResponse(schedule=to_pb(schedule), created=created)

    @aio_unary("UpdateSchedule")
    async def UpdateSchedule(
        self, request: schedules_pb2.UpdateScheduleRequest, context: AioContext
    ) -> schedules_pb2.UpdateScheduleResponse:
        spec = self._spec(request, context, "UpdateSchedule")
        schedule, applied = await self._schedules.update_async(spec)
        if applied:
            log.info(
                "schedule.updated", schedule=spec.name, cron=spec.cron, timezone=spec.timezone,
                workflow=spec.workflow, group=spec.group, catch_up=spec.catch_up.value,
                by=caller_name(context, self._limits),
            )  # fmt: skip
        return schedules_pb2.UpdateScheduleResponse(schedule=to_pb(schedule), applied=applied)

    def _spec(
        self,
        request: schedules_pb2.CreateScheduleRequest | schedules_pb2.UpdateScheduleRequest,
        context: AioContext,
        rpc: str = "CreateSchedule",
    ) -> ScheduleSpec:
        limits = self._limits
        name = self._named(request.name, context, rpc)
        ttl: int | None = None
        if request.HasField("ttl"):
            ttl = _duration_ms(request.ttl)
            if ttl <= 0 or ttl > limits.max_ttl_ms:
                raise InvalidArgument("ttl", "must be positive and within the server's --max-ttl")
        jitter = _duration_ms(request.jitter) if request.HasField("jitter") else 0
        spec = ScheduleSpec(
            name=name,
            cron=request.cron,
            workflow=convert.name(request.workflow, limits, "workflow"),
            group=convert.name(request.group, limits, "group"),
            args=convert.payload(request.args, limits, "args")
            if request.HasField("args")
            else EMPTY,
            timezone=request.timezone or "UTC",
            catch_up=domain.check_catch_up(request.catch_up),
            jitter_ms=jitter,
            ttl_ms=ttl,
        )
        return domain.check_spec(spec)

    @aio_unary("GetSchedule")
    async def GetSchedule(
        self, request: schedules_pb2.GetScheduleRequest, context: AioContext
    ) -> schedules_pb2.GetScheduleResponse:
        name = self._named(request.name, context, "GetSchedule")
        schedule = await asyncio.to_thread(self._schedules.get, name)
        return schedules_pb2.GetScheduleResponse(schedule=to_pb(schedule))

    @aio_unary("SearchSchedules")
    async def SearchSchedules(
        self, request: schedules_pb2.SearchSchedulesRequest, context: AioContext
    ) -> schedules_pb2.SearchSchedulesResponse:
        size = convert.page_size(request.page_size, self._limits)
        after = paging.decode_schedules(request.page_token) if request.page_token else ""
        reader = caller()
        found = await asyncio.to_thread(self._schedules.list, after, size)
        response = schedules_pb2.SearchSchedulesResponse(
            schedules=[to_pb(s) for s in found if reader.may_touch(f"{s.name}@")]
        )
        if len(found) == size:
            response.next_page_token = paging.encode_schedules(found[-1].name)
        return response

    @aio_unary("PauseSchedule")
    async def PauseSchedule(
        self, request: schedules_pb2.PauseScheduleRequest, context: AioContext
    ) -> schedules_pb2.PauseScheduleResponse:
        name = self._named(request.name, context, "PauseSchedule")
        schedule, applied = await self._schedules.pause_async(name, True)
        if applied:
            log.info("schedule.paused", schedule=name, by=caller_name(context, self._limits))
        return schedules_pb2.PauseScheduleResponse(schedule=to_pb(schedule), applied=applied)

    @aio_unary("ResumeSchedule")
    async def ResumeSchedule(
        self, request: schedules_pb2.ResumeScheduleRequest, context: AioContext
    ) -> schedules_pb2.ResumeScheduleResponse:
        name = self._named(request.name, context, "ResumeSchedule")
        schedule, applied = await self._schedules.pause_async(name, False)
        if applied:
            log.info("schedule.resumed", schedule=name, by=caller_name(context, self._limits))
        return schedules_pb2.ResumeScheduleResponse(schedule=to_pb(schedule), applied=applied)

    @aio_unary("DeleteSchedule")
    async def DeleteSchedule(
        self, request: schedules_pb2.DeleteScheduleRequest, context: AioContext
    ) -> schedules_pb2.DeleteScheduleResponse:
        name = self._named(request.name, context, "DeleteSchedule")
        schedule = await self._schedules.delete_async(name)
        log.info("schedule.deleted", schedule=name, by=caller_name(context, self._limits))
        return schedules_pb2.DeleteScheduleResponse(schedule=to_pb(schedule))


def _duration_ms(value: Duration) -> int:
    return value.seconds * 1000 + value.nanos // 1_000_000


def _at(ms: int | None) -> Timestamp | None:
    return None if ms is None else Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def to_pb(schedule: Schedule) -> schedules_pb2.Schedule:
    spec = schedule.spec
    message = schedules_pb2.Schedule(
        name=spec.name,
        cron=spec.cron,
        timezone=spec.timezone,
        workflow=spec.workflow,
        group=spec.group,
        catch_up=spec.catch_up.value,
        paused=schedule.paused,
        last_run_id=schedule.last_run_id or "",
        skipped=schedule.skipped,
        created_by=schedule.created_by or "",
        next_tick_time=_at(schedule.next_tick),
        next_fire_time=_at(schedule.next_fire_time),
        last_tick_time=_at(schedule.last_tick),
        create_time=_at(schedule.create_time),
        update_time=_at(schedule.update_time),
    )
    message.args.headers.update(spec.args.headers)
    message.args.data = spec.args.data
    message.jitter.FromMilliseconds(spec.jitter_ms)
    if spec.ttl_ms is not None:
        message.ttl.FromMilliseconds(spec.ttl_ms)
    return message
