"""The `troth.v1.TaskService` servicer (grpc.aio), for workers."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeAlias

import structlog

from troth.v1 import tasks_pb2, tasks_pb2_grpc
from troth_server import paging
from troth_server.api import _audit as audit
from troth_server.api import _convert as convert
from troth_server.api import _states as states_api
from troth_server.api import _workflows as workflows_api
from troth_server.api._auth import caller, caller_name, require_group, require_inside
from troth_server.api._batches import batched
from troth_server.api._rpc import aio_server_stream, aio_unary
from troth_server.api.promises import create_args
from troth_server.api.schedules import ScheduleHandlers
from troth_server.dispatch import Delivery, PollStream
from troth_server.domain import visibility, workers
from troth_server.domain.errors import InvalidArgument
from troth_server.domain.promise import Payload, PromiseState, SettleRequest
from troth_server.domain.routing import MAX_WORKFLOW_VERSION, registration
from troth_server.domain.task import MAX_ERROR_CHARS, MAX_TRACEBACK_CHARS, TaskState

log = structlog.get_logger("troth.tasks")

POLL_BATCH_METADATA = ("troth-poll-batch", "1")
POLL_OPEN_METADATA = ("troth-poll-open", "1")
"""The initial metadata of a Poll stream the server took (the SDK's `troth._tasks`)."""
"""Sent by a worker that reads tasks batched in `PollResponse.more`."""

POLL_BATCH_BYTES = 1 << 20
"""The deliveries sent in one Poll message stop growing at this size (a larger one goes alone)."""

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import grpc.aio

    from troth_server.api._mux import CallMux
    from troth_server.config import Limits
    from troth_server.dispatch import Dispatcher
    from troth_server.domain.access import Principal
    from troth_server.domain.promise import Promise
    from troth_server.domain.task import Task
    from troth_server.task_service import StepRecord, TaskService
    from troth_server.workflows import WorkflowService
    from troth_server.writes.ops.leases import Heartbeat

    AioContext: TypeAlias = grpc.aio.ServicerContext[Any, Any]


def bound_principal() -> Principal | None:
    """Who the task a call is about must be leased to: the authenticated caller;
    None with authentication off (nothing is compared)."""
    who = caller()
    return who if who.authenticated else None


class _Handlers:
    def __init__(
        self,
        tasks: TaskService,
        dispatcher: Dispatcher,
        limits: Limits,
        workflows: WorkflowService | None = None,
    ) -> None:
        self._tasks = tasks
        self._dispatcher = dispatcher
        self._limits = limits
        self._workflows = workflows

    @property
    def _workflow_service(self) -> WorkflowService:
        if self._workflows is None:
            raise RuntimeError("TaskServiceServicer was built without its WorkflowService")
        return self._workflows

    def _stream(
        self, request: tasks_pb2.PollRequest, loop: asyncio.AbstractEventLoop, context: AioContext
    ) -> PollStream:
        group = convert.name(request.group, self._limits, "group")
        require_group(group, context)
        who = bound_principal()
        return PollStream(
            group=group,
            worker_id=convert.name(request.worker_id, self._limits, "worker_id"),
            capacity=convert.capacity(request.capacity, self._limits),
            lease_ms=convert.lease_ms(
                request.lease if request.HasField("lease") else None, self._limits
            ),
            loop=loop,
            registration=registration(convert.workflows(request.workflows)),
            principal=None if who is None else who.name,
        )

    def _alive(self, worker_id: str) -> None:
        """A task call of `worker_id` succeeded: its own streams (opened by the same
        principal) are alive. Never before the call succeeded, never for another
        principal's streams under the same worker id."""
        who = bound_principal()
        self._dispatcher.alive(worker_id, None if who is None else who.name)

    def _search(self, request: tasks_pb2.SearchTasksRequest) -> tasks_pb2.SearchTasksResponse:
        group = convert.name(request.group, self._limits, "group")
        root_id = (
            convert.promise_id(request.root_promise_id, self._limits, "root_promise_id")
            if request.root_promise_id
            else None
        )
        size = convert.page_size(request.page_size, self._limits)
        found = self._tasks.search(group, size, root_id)
        # A principal scoped to id prefixes sees the tasks of its workflows only
        # (a page may come back shorter than asked).
        found = [t for t in found if caller().may_touch(t.root_promise_id)]
        return tasks_pb2.SearchTasksResponse(tasks=self._described(found))

    def _search_workflows(
        self, request: tasks_pb2.SearchWorkflowsRequest, context: AioContext
    ) -> tasks_pb2.SearchWorkflowsResponse:
        reader = caller()
        query = workflows_api.workflow_query(request, self._limits, reader, context)
        if query is None:
            # Nothing the reader may see can match (its prefixes, its groups).
            return tasks_pb2.SearchWorkflowsResponse()
        page = self._workflow_service.search(query, request.page_token)
        return tasks_pb2.SearchWorkflowsResponse(
            workflows=workflows_api.summaries(page.workflows, reader, self._described),
            next_page_token=page.next_page_token,
        )

    def _described(self, found: list[Task]) -> list[tasks_pb2.Task]:
        """Tasks on the wire, each PENDING one with why it waits (and, waiting for a
        version no worker here runs, since when)."""
        waiting = self._dispatcher.waiting_for([t for t in found if t.state is TaskState.PENDING])
        now = self._tasks.now()
        described = []
        for t in found:
            why = waiting.get(t.id)
            words = "" if why is None else why.words
            if t.state is TaskState.PENDING and not t.claimable(now):
                words = _backing_off(t)
            since = None if why is None or why.absence is None else why.absence.since_ms
            described.append(convert.task_to_pb(t, words, since))
        return described

    def workflow_waiting(self, root_id: str) -> str:
        """Why workflow `root_id`'s task waits, if it waits for a version no worker here
        runs ("" otherwise): what a settle that resumes it tells the settler. Reads."""
        task = self._tasks.active_task(root_id)
        return "" if task is None else self.task_waiting(task)

    def task_waiting(self, task: Task) -> str:
        """Why the workflow whose active task is `task` waits for a version no worker
        here runs, if it waits for one ("" otherwise). No read."""
        if task.state is not TaskState.PENDING:
            return ""
        why = self._dispatcher.waiting_for([task])[task.id]
        return why.words if why.absence is not None else ""

    def _workers(self, request: tasks_pb2.SearchWorkersRequest) -> tasks_pb2.SearchWorkersResponse:
        group = convert.optional_group(request.group, self._limits)
        size = convert.page_size(request.page_size, self._limits)
        after = paging.decode_workers(request.page_token, group) if request.page_token else None
        streams = self._dispatcher.streams()
        if caller().prefixes:
            streams = workers.for_tenant(streams)
        shown, more = workers.page(workers.summarize(streams, group), size, after)
        return tasks_pb2.SearchWorkersResponse(
            workers=[convert.worker_to_pb(w) for w in shown],
            next_page_token="" if more is None else paging.encode_workers(more, group),
        )

    def _complete_args(
        self, request: tasks_pb2.CompleteTaskRequest
    ) -> tuple[str, int, str, SettleRequest | None]:
        worker = convert.name(request.worker_id, self._limits, "worker_id")
        task_id = convert.name(request.task_id, self._limits, "task_id")
        outcome = None
        which = request.WhichOneof("root_result")
        if which is not None:
            state = PromiseState.RESOLVED if which == "resolve_root" else PromiseState.REJECTED
            value = convert.payload(getattr(request, which), self._limits, which)
            # The root id is the task's; the op fills it in from the task it loads. It is
            # settled by the authenticated worker principal (with auth off, by worker id).
            who = caller()
            settler = who.name if who.authenticated else worker
            outcome = SettleRequest(id="", state=state, value=value, principal=settler)
        return task_id, convert.counter(request.counter), worker, outcome

    def _record_step(
        self,
        request: tasks_pb2.CompleteTaskRequest,
        task: tuple[str, int, str],
        context: AioContext,
    ) -> StepRecord | None:
        """The step `record_step` carries, read as its own `CreatePromise` would be
        (`create_args`: one reading of a create), under this call's task fence."""
        if not request.HasField("record_step"):
            return None
        if not request.record_step.HasField("fence"):
            raise _not_this_fence()
        try:
            create, principal, result, fence = create_args(
                request.record_step, context, self._limits, self._tasks.now()
            )
        except InvalidArgument as exc:
            raise exc.within("record_step") from None
        if result is None:
            raise InvalidArgument(
                "record_step",
                "must carry the step's result (resolved_with or rejected_with): only a "
                "finished step is recorded with CompleteTask; create a pending one with "
                "CreatePromise",
            )
        if create.schema is not None:
            raise InvalidArgument(
                "record_step.schema",
                "a step recorded with CompleteTask has no schema; create a decision with "
                "CreatePromise",
            )
        if fence is None or (fence.task_id, fence.counter, fence.worker_id) != task:
            raise _not_this_fence()
        return create, principal, result, fence

    def _suspend_on(self, request: tasks_pb2.CompleteTaskRequest) -> list[str]:
        if request.suspend_on and request.WhichOneof("root_result") is not None:
            raise InvalidArgument(
                "suspend_on",
                "cannot go with a root result: a workflow that finished waits on nothing",
            )
        return [convert.promise_id(p, self._limits, "suspend_on") for p in request.suspend_on]

    def _held_args(
        self,
        request: tasks_pb2.ReleaseTaskRequest
        | tasks_pb2.RegisterCallbacksRequest
        | tasks_pb2.FailTaskRequest,
    ) -> tuple[str, int, str]:
        return (
            convert.name(request.task_id, self._limits, "task_id"),
            convert.counter(request.counter),
            convert.name(request.worker_id, self._limits, "worker_id"),
        )

    def _promise_ids(self, request: tasks_pb2.RegisterCallbacksRequest) -> list[str]:
        if not request.promise_ids:
            raise InvalidArgument("promise_ids", "give at least one promise to wait on")
        return [convert.promise_id(p, self._limits, "promise_ids") for p in request.promise_ids]

    def _fail_args(self, request: tasks_pb2.FailTaskRequest) -> tuple[str, int, str, str, str]:
        task_id, counter, worker = self._held_args(request)
        if not request.error:
            raise InvalidArgument(
                "error", "is required: the exception the workflow raised, as `Type: message`"
            )
        return (
            task_id,
            counter,
            worker,
            _bounded(request.error, MAX_ERROR_CHARS, "error"),
            _bounded(request.traceback, MAX_TRACEBACK_CHARS, "traceback"),
        )

    def _fail_workflow_args(
        self, request: tasks_pb2.FailWorkflowRequest, context: AioContext
    ) -> tuple[str, str]:
        root_id = convert.promise_id(request.id, self._limits, "id")
        if not request.reason.strip():
            raise InvalidArgument(
                "reason", "is required: say why the workflow fails (`--reason TEXT`)"
            )
        reason = _bounded(request.reason, MAX_ERROR_CHARS, "reason")
        require_inside(root_id, context, "FailWorkflow")
        return root_id, reason

    def _move_args(
        self, request: tasks_pb2.MoveWorkflowRequest, context: AioContext
    ) -> tuple[str, str | None]:
        root_id = convert.promise_id(request.id, self._limits, "id")
        if request.to_current == bool(request.to_version):
            raise InvalidArgument(
                "to_version",
                "give either a version (`--to-version V`) or to_current (`--to-current`), "
                "not both or neither",
            )
        version: str | None = None
        if request.to_version:
            if len(request.to_version) > MAX_WORKFLOW_VERSION:
                raise InvalidArgument(
                    "to_version", f"is longer than {MAX_WORKFLOW_VERSION} characters"
                )
            version = request.to_version
        require_inside(root_id, context, "MoveWorkflow")
        return root_id, version

    def _heartbeat_args(self, request: tasks_pb2.HeartbeatRequest) -> tuple[str, int, str | None]:
        return (
            convert.name(request.worker_id, self._limits, "worker_id"),
            convert.lease_ms(request.lease if request.HasField("lease") else None, self._limits),
            convert.optional_group(request.group, self._limits) or None,
        )


def _poll_response(delivery: Delivery) -> tasks_pb2.PollResponse:
    # The worker works for the task's group: it sees its workflow's steps whole
    # (keys, settle tokens); of the root, what any reader sees (`domain.visibility`).
    reader, group = caller(), delivery.task.group
    response = tasks_pb2.PollResponse(
        task=convert.task_to_pb(delivery.task),
        history=[convert.to_pb(visibility.view(p, reader, group)) for p in delivery.history],
    )
    if delivery.root is not None:
        response.root.CopyFrom(convert.to_pb(visibility.view(delivery.root, reader)))
    return response


def _not_this_fence() -> InvalidArgument:
    return InvalidArgument(
        "record_step.fence",
        "must name this call's task, counter and worker: a step is recorded under the "
        "fence of the task it ran in",
    )


def _completed(
    result: tuple[Any, Any], recorded: Promise | None = None
) -> tasks_pb2.CompleteTaskResponse:
    task, root = result
    response = tasks_pb2.CompleteTaskResponse(task=convert.task_to_pb(task))
    if root is not None:
        response.root.CopyFrom(convert.to_pb(visibility.view(root, caller())))
    if recorded is not None:
        response.recorded_step.CopyFrom(_recorded_step(recorded))
    return response


def _not_suspended(
    task: Any, settled: list[Any], recorded: Promise | None
) -> tasks_pb2.CompleteTaskResponse:
    response = _completed((task, None), recorded)
    response.settled.extend(_awaited(settled))
    return response


def _recorded_step(step: Promise) -> Any:
    """The step as recorded, as its worker sees it (its own workflow's step)."""
    return convert.to_pb(visibility.view(step, caller()))


def _awaited(settled: list[Any]) -> list[Any]:
    """Promises a workflow waits for (latent ones), as the worker may see them (each
    one its reach allows: `TaskService.check_reach`, called first)."""
    reader = caller()
    return [convert.to_pb(visibility.view(p, reader)) for p in settled]


class TaskServiceServicer(_Handlers, ScheduleHandlers, tasks_pb2_grpc.TaskServiceServicer):
    """For the grpc.aio server: a Poll stream is a coroutine waiting on its mailbox."""

    mux: CallMux | None = None
    """What serves `Calls` (it needs every servicer; set once they are built)."""

    @aio_server_stream("Calls")
    async def Calls(
        self, request: AsyncIterator[tasks_pb2.CallsRequest], context: AioContext
    ) -> AsyncIterator[tasks_pb2.CallsResponse]:
        if self.mux is None:
            raise RuntimeError("TaskServiceServicer.mux was not set")
        async for answer in self.mux.serve(request, context):
            yield answer

    @aio_server_stream("Poll")
    async def Poll(
        self, request: tasks_pb2.PollRequest, context: AioContext
    ) -> AsyncIterator[tasks_pb2.PollResponse]:
        stream = self._stream(request, asyncio.get_running_loop(), context)
        batching = POLL_BATCH_METADATA in tuple(context.invocation_metadata() or ())
        self._dispatcher.connect(stream)
        try:
            # The worker learns at once that its stream is taken (counted, its
            # credential accepted), not at its first task: what it logs as connected.
            await context.send_initial_metadata((POLL_OPEN_METADATA,))
            while True:
                delivery = await stream.next_async()
                if delivery is None:
                    return
                response = _poll_response(delivery)
                messages, ended = [response], False
                if batching:  # those ready too go in the same message (`more`), up to a MiB
                    ready = (None if d is None else _poll_response(d) for d in stream.take_ready())
                    messages, ended = batched(response, ready, POLL_BATCH_BYTES)
                for message in messages:
                    yield message
                if ended:
                    return
        finally:
            # Also on cancellation (the worker went away): non-blocking by design.
            self._dispatcher.disconnect_later(stream)

    @aio_unary("CompleteTask")
    async def CompleteTask(
        self, request: tasks_pb2.CompleteTaskRequest, context: AioContext
    ) -> tasks_pb2.CompleteTaskResponse:
        task_id, counter, worker, outcome = self._complete_args(request)
        suspend_on = self._suspend_on(request)
        step = self._record_step(request, (task_id, counter, worker), context)
        who = bound_principal()
        # `step`, if any, is recorded in the same transaction (`RecordThenOp`).
        if suspend_on:
            recorded, (task, settled) = await self._tasks.record_then_suspend_async(
                step, task_id, counter, worker, suspend_on, who
            )
            self._alive(worker)
            if settled:
                self._tasks.check_reach(settled, caller(), "read")
                return _not_suspended(task, settled, recorded)
            result: tuple[Any, Any] = (task, None)
        else:
            recorded, result = await self._tasks.record_then_complete_async(
                step, task_id, counter, worker, outcome, who
            )
            self._alive(worker)
            root = result[1]
            if outcome is not None and root is not None and root.state is outcome.state:
                # The workflow's result, settled by its worker: audited like any settle.
                audit.settled("CompleteTask", root, caller(), None, context)
        self._dispatcher.done(worker, task_id)
        return _completed(result, recorded)

    @aio_unary("Heartbeat")
    async def Heartbeat(
        self, request: tasks_pb2.HeartbeatRequest, context: AioContext
    ) -> tasks_pb2.HeartbeatResponse:
        worker, lease, group = self._heartbeat_args(request)
        held = await self._tasks.heartbeat_async(worker, lease, bound_principal(), group)
        self._alive(worker)
        return _heartbeat_response(held)

    @aio_unary("ReleaseTask")
    async def ReleaseTask(
        self, request: tasks_pb2.ReleaseTaskRequest, context: AioContext
    ) -> tasks_pb2.ReleaseTaskResponse:
        task_id, counter, worker = self._held_args(request)
        task = await self._tasks.release_async(task_id, counter, worker, bound_principal())
        self._alive(worker)
        self._dispatcher.done(worker, task_id)
        self._dispatcher.wake([task.group])
        return tasks_pb2.ReleaseTaskResponse(task=convert.task_to_pb(task))

    @aio_unary("RegisterCallbacks")
    async def RegisterCallbacks(
        self, request: tasks_pb2.RegisterCallbacksRequest, context: AioContext
    ) -> tasks_pb2.RegisterCallbacksResponse:
        task_id, counter, worker = self._held_args(request)
        settled = await self._tasks.register_callbacks_async(
            task_id, counter, worker, self._promise_ids(request), bound_principal()
        )
        self._alive(worker)
        self._tasks.check_reach(settled, caller(), "read")
        return tasks_pb2.RegisterCallbacksResponse(settled=_awaited(settled))

    @aio_unary("FailTask")
    async def FailTask(
        self, request: tasks_pb2.FailTaskRequest, context: AioContext
    ) -> tasks_pb2.FailTaskResponse:
        task_id, counter, worker, error, traceback = self._fail_args(request)
        task, _ = await self._tasks.fail_async(
            task_id, counter, worker, error, traceback, bound_principal()
        )
        self._alive(worker)
        log.warning(
            "task.failed", task_id=task.id, root_promise_id=task.root_promise_id,
            worker_id=worker, attempts=task.failed_attempts, error=error,
            next_attempt_time=task.next_attempt_time, state=task.state.value,
        )  # fmt: skip
        self._dispatcher.done(worker, task_id)
        return tasks_pb2.FailTaskResponse(task=convert.task_to_pb(task))

    @aio_unary("FailWorkflow")
    async def FailWorkflow(
        self, request: tasks_pb2.FailWorkflowRequest, context: AioContext
    ) -> tasks_pb2.FailWorkflowResponse:
        root_id, reason = self._fail_workflow_args(request, context)
        by = caller_name(context, self._limits)
        root, applied = await self._tasks.fail_workflow_async(
            root_id, _failure_value(reason, by), by
        )
        if applied:
            audit.settled("FailWorkflow", root, caller(), None, context)
        return tasks_pb2.FailWorkflowResponse(root=convert.to_pb(visibility.view(root, caller())))

    @aio_unary("MoveWorkflow")
    async def MoveWorkflow(
        self, request: tasks_pb2.MoveWorkflowRequest, context: AioContext
    ) -> tasks_pb2.MoveWorkflowResponse:
        root_id, version = self._move_args(request, context)
        root, task = await self._tasks.move_workflow_async(root_id, version)
        log.info(
            "workflow.moved", root_promise_id=root_id, to_version=version or "(current)",
            task_id=None if task is None else task.id, by=caller_name(context, self._limits),
        )  # fmt: skip
        response = tasks_pb2.MoveWorkflowResponse(
            root=convert.to_pb(visibility.view(root, caller()))
        )
        if task is not None:
            (described,) = await asyncio.to_thread(self._described, [task])
            response.task.CopyFrom(described)
        return response

    @aio_unary("SearchWorkflows")
    async def SearchWorkflows(
        self, request: tasks_pb2.SearchWorkflowsRequest, context: AioContext
    ) -> tasks_pb2.SearchWorkflowsResponse:
        # Range reads: off the event loop, as SearchPromises is.
        return await asyncio.to_thread(self._search_workflows, request, context)

    @aio_unary("GetWorkflowState")
    async def GetWorkflowState(
        self, request: tasks_pb2.GetWorkflowStateRequest, context: AioContext
    ) -> tasks_pb2.GetWorkflowStateResponse:
        root_id, name = states_api.get_args(request, self._limits)
        require_inside(root_id, context, "GetWorkflowState")
        slot, root, why = await asyncio.to_thread(
            self._workflow_service.get_state, root_id, name, require_parked=request.require_parked
        )
        self._tasks.check_reach([root], caller(), "read")  # what reading the root needs
        return tasks_pb2.GetWorkflowStateResponse(
            state=states_api.state_to_pb(slot), parked=why is None, not_parked_because=why or ""
        )

    @aio_unary("ReplaceWorkflowState")
    async def ReplaceWorkflowState(
        self, request: tasks_pb2.ReplaceWorkflowStateRequest, context: AioContext
    ) -> tasks_pb2.ReplaceWorkflowStateResponse:
        root_id, name, value, expected = states_api.replace_args(request, self._limits)
        require_inside(root_id, context, "ReplaceWorkflowState")
        by = caller_name(context, self._limits)
        slot, lost = await self._workflow_service.replace_state_async(
            root_id, name, value, expected, by
        )
        lost_to, message = states_api.lost_to_pb(lost)
        log.info(
            "workflow.state_replaced" if lost is None else "workflow.state_replace_lost",
            root_promise_id=root_id, name=name, expected_version=expected,
            version=slot.version, lost_to=None if lost is None else lost.to.value, by=by,
        )  # fmt: skip
        return tasks_pb2.ReplaceWorkflowStateResponse(
            won=lost is None, state=states_api.state_to_pb(slot), lost_to=lost_to, message=message
        )

    @aio_unary("RetryWorkflowNow")
    async def RetryWorkflowNow(
        self, request: tasks_pb2.RetryWorkflowNowRequest, context: AioContext
    ) -> tasks_pb2.RetryWorkflowNowResponse:
        root_id = convert.promise_id(request.id, self._limits, "id")
        require_inside(root_id, context, "RetryWorkflowNow")
        task = await self._workflow_service.retry_now_async(root_id)
        log.info(
            "workflow.retried_now", root_promise_id=root_id, task_id=task.id,
            attempts=task.failed_attempts, by=caller_name(context, self._limits),
        )  # fmt: skip
        (described,) = await asyncio.to_thread(self._described, [task])
        return tasks_pb2.RetryWorkflowNowResponse(task=described)

    @aio_unary("SearchWorkers")
    async def SearchWorkers(
        self, request: tasks_pb2.SearchWorkersRequest, context: AioContext
    ) -> tasks_pb2.SearchWorkersResponse:
        # The dispatcher's table, in memory: no store read, on the loop.
        return self._workers(request)

    @aio_unary("SearchTasks")
    async def SearchTasks(
        self, request: tasks_pb2.SearchTasksRequest, context: AioContext
    ) -> tasks_pb2.SearchTasksResponse:
        # A range read: off the event loop, as SearchPromises is.
        return await asyncio.to_thread(self._search, request)


def _backing_off(task: Task) -> str:
    assert task.next_attempt_time is not None
    at = datetime.fromtimestamp(task.next_attempt_time / 1000, UTC)
    return (
        f"waiting out its retry backoff until {at.isoformat(timespec='milliseconds')}: its "
        f"workflow code failed {task.failed_attempts} time(s) (last: {task.last_error})"
    )


def _bounded(value: str, limit: int, field: str) -> str:
    if len(value) > limit:
        raise InvalidArgument(
            field, f"is {len(value)} characters long; at most {limit} are kept: cut it"
        )
    return value


def _failure_value(reason: str, by: str | None) -> Payload:
    """What an operator's FailWorkflow rejects the root with (JSON, as the SDK's codec
    writes it): the workflow sees it as `troth.WorkflowFailed`'s rejection value."""
    value: dict[str, str] = {"type": "troth.errors.WorkflowFailed", "message": reason}
    if by:
        value["failed_by"] = by
    data = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    return Payload(headers={"content-type": "application/json"}, data=data)


def _heartbeat_response(beat: Heartbeat) -> tasks_pb2.HeartbeatResponse:
    held = beat.tasks
    response = tasks_pb2.HeartbeatResponse(
        task_ids=[t.id for t in held], counters={t.id: t.counter for t in held}
    )
    # The clock the leases were extended by: workers map leases onto their own clocks.
    response.server_time.FromMilliseconds(beat.now)
    return response
