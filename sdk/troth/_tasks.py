"""`TaskCalls`: the `TaskService` RPCs, each with its deadline, for the worker, `troth tasks`
and `troth workflows`.

The worker's poll loop opens the stream here, its leases heartbeat and
release here, and its runner suspends, completes and fails tasks here; the
CLI searches a group's tasks and fails workflows. Every unary call has the connection's deadline
(the heartbeat gives its own); errors come out as `troth.errors`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, NamedTuple, Protocol

from troth._convert import payload_to_proto, promise_from_proto, timedelta_to_proto
from troth.v1 import tasks_pb2

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from troth._calls import Connection
    from troth._promise import Promise
    from troth._transport import Metadata
    from troth.codec import Payload
    from troth.v1 import promises_pb2

__all__ = [
    "POLL_BATCH_METADATA",
    "POLL_OPEN_METADATA",
    "PollCall",
    "Suspended",
    "TaskCalls",
    "poll_taken",
]

POLL_BATCH_METADATA = ("troth-poll-batch", "1")
"""The worker reads tasks delivered together in one message (`PollResponse.more`)."""
POLL_OPEN_METADATA = ("troth-poll-open", "1")
"""The server's initial metadata on a Poll stream it took: the worker is connected
(before its first task; a server older than it sends it with the first task)."""


class PollCall(Protocol):
    """An open `Poll` stream: iterate its deliveries; `cancel()` ends it."""

    def __iter__(self) -> Iterator[tasks_pb2.PollResponse]: ...

    def cancel(self) -> bool: ...

    def initial_metadata(self) -> Iterable[tuple[str, str | bytes]] | None:
        """The server's initial metadata (waits for it, or for the stream to end)."""
        ...


def poll_taken(call: PollCall) -> bool:
    """Wait until the server took the stream (True: `POLL_OPEN_METADATA`) or ended it
    (False; iterating it then raises why)."""
    return POLL_OPEN_METADATA in tuple(call.initial_metadata() or ())


class Suspended(NamedTuple):
    """What a suspension answers."""

    settled: list[Promise]
    """Promises waited on that had settled: then the task is still the worker's and the
    workflow goes on with them; [] once suspended."""
    recorded: Promise | None = None
    """With `record_step`: the step as the server recorded it."""


class TaskCalls:
    """The `TaskService` as worker `worker_id` of `group` calls it (the CLI's is "")."""

    def __init__(self, connection: Connection, worker_id: str = "", group: str = "") -> None:
        self.connection = connection
        self.worker_id = worker_id
        self.group = group
        self._stub = connection.transport.tasks

    def poll(self, request: tasks_pb2.PollRequest) -> tuple[PollCall, Metadata]:
        """Open the task stream (no deadline: it stays open as long as the worker runs),
        with the current token; returns it and the metadata it opened with (for
        `Transport.renewed`, when the server ends it refusing the token)."""
        sent = self.connection.transport.metadata
        call: PollCall = self._stub.Poll(request, metadata=(*sent, POLL_BATCH_METADATA))
        return call, sent

    def heartbeat(self, lease: timedelta, timeout: float) -> tasks_pb2.HeartbeatResponse:
        """Extend every lease this worker holds in its group; the answer lists the tasks
        still its own (another group's worker under the same id has its own)."""
        request = tasks_pb2.HeartbeatRequest(
            worker_id=self.worker_id, lease=timedelta_to_proto(lease), group=self.group
        )
        return self.connection.call(self._stub.Heartbeat, request, timeout=timeout)

    def suspend(
        self,
        task_id: str,
        counter: int,
        awaiting: Iterable[str],
        *,
        record_step: promises_pb2.CreatePromiseRequest | None = None,
    ) -> Suspended:
        """Suspend the task on `awaiting` (recording `record_step`, the step the task
        ran last, in the same call); answers those already settled (then the task is
        still ours and the workflow goes on), or [] once suspended."""
        request = tasks_pb2.CompleteTaskRequest(
            task_id=task_id, counter=counter, worker_id=self.worker_id, suspend_on=list(awaiting)
        )
        if record_step is not None:
            request.record_step.CopyFrom(record_step)
        response = self.connection.call(self._stub.CompleteTask, request)
        return Suspended(
            [promise_from_proto(p) for p in response.settled],
            promise_from_proto(response.recorded_step) if record_step is not None else None,
        )

    def complete(
        self,
        task_id: str,
        counter: int,
        *,
        resolve: Payload | None = None,
        reject: Payload | None = None,
        record_step: promises_pb2.CreatePromiseRequest | None = None,
    ) -> Promise | None:
        """Complete the task, settling its root with `resolve` or `reject` if given (and
        recording `record_step`, the step the task ran last, in the same call: then
        answers that step as recorded)."""
        request = tasks_pb2.CompleteTaskRequest(
            task_id=task_id, counter=counter, worker_id=self.worker_id
        )
        if resolve is not None:
            request.resolve_root.CopyFrom(payload_to_proto(resolve))
        elif reject is not None:
            request.reject_root.CopyFrom(payload_to_proto(reject))
        if record_step is not None:
            request.record_step.CopyFrom(record_step)
        response = self.connection.call(self._stub.CompleteTask, request)
        return promise_from_proto(response.recorded_step) if record_step is not None else None

    def fail(self, task_id: str, counter: int, error: str, traceback: str) -> tasks_pb2.Task:
        """Fail the task: the workflow's code raised (a bug). The server records `error`
        and `traceback` and gives the task back to the group after a backoff; the
        root stays PENDING. Returns the task as the server left it."""
        request = tasks_pb2.FailTaskRequest(
            task_id=task_id,
            counter=counter,
            worker_id=self.worker_id,
            error=error,
            traceback=traceback,
        )
        return self.connection.call(self._stub.FailTask, request).task

    def fail_workflow(self, workflow_id: str, reason: str) -> Promise:
        """Reject workflow `workflow_id`'s root with `reason` (an operator's call)."""
        request = tasks_pb2.FailWorkflowRequest(id=workflow_id, reason=reason)
        return promise_from_proto(self.connection.call(self._stub.FailWorkflow, request).root)

    def move_workflow(
        self, workflow_id: str, to_version: str | None
    ) -> tasks_pb2.MoveWorkflowResponse:
        """Move workflow `workflow_id` to version `to_version` of its code (None: the
        newest connected); an operator's call. Returns its root and waiting task."""
        request = tasks_pb2.MoveWorkflowRequest(
            id=workflow_id, to_version=to_version or "", to_current=to_version is None
        )
        return self.connection.call(self._stub.MoveWorkflow, request)

    def release(self, task_id: str, counter: int) -> None:
        """Give the task back to its group, for another worker to take at once."""
        request = tasks_pb2.ReleaseTaskRequest(
            task_id=task_id, counter=counter, worker_id=self.worker_id
        )
        self.connection.call(self._stub.ReleaseTask, request)

    def search(self, group: str, limit: int, root_id: str = "") -> list[tasks_pb2.Task]:
        """The group's tasks not completed yet, oldest first (at most `limit`); with
        `root_id`, only that workflow's active task."""
        request = tasks_pb2.SearchTasksRequest(
            group=group, page_size=limit, root_promise_id=root_id
        )
        return list(self.connection.call(self._stub.SearchTasks, request).tasks)
