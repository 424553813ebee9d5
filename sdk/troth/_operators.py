"""What operators read about the workers' side: a group's tasks (`Client.search_tasks`) and
the connected workers (`Client.list_workers`), as typed results.

`OperatorCalls` is a base of `Client` (its methods are `Client`'s); the CLI
(`troth tasks list`, `troth workers list`) and the console call them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from troth._convert import datetime_from_proto
from troth.v1 import tasks_pb2

if TYPE_CHECKING:
    from datetime import datetime

    from troth._calls import Connection

__all__ = ["OperatorCalls", "TaskInfo", "TaskKind", "TaskState", "WorkerInfo"]

MAX_PAGE = 1000
"""The largest page the server gives (its default `--max-page-size`)."""


class TaskKind(enum.StrEnum):
    INVOKE = "INVOKE"
    """Run a new workflow from its start."""
    RESUME = "RESUME"
    """Continue a workflow after something it waited for settled."""


class TaskState(enum.StrEnum):
    PENDING = "PENDING"
    """Waiting for a worker of its group (`waiting_for` says why none has it)."""
    CLAIMED = "CLAIMED"
    """Leased to a worker (`worker_id`) until `lease_expire_time`."""
    COMPLETED = "COMPLETED"


def _enum_name(value: str) -> str:
    """`TASK_KIND_INVOKE`, `TASK_PENDING`, `INVOKE` -> the bare name, whichever the proto has."""
    for prefix in ("TASK_KIND_", "TASK_STATE_", "TASK_"):
        if value.startswith(prefix):
            return value.removeprefix(prefix)
    return value


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """A task of a worker group, not completed yet (`Client.search_tasks`)."""

    id: str
    root_id: str
    """The workflow's id (its root promise)."""
    group: str
    kind: TaskKind
    state: TaskState
    counter: int
    """Its fencing token: which lease of the task this is."""
    worker_id: str | None
    """The worker holding it (CLAIMED), or that last held it."""
    lease_expire_time: datetime | None
    workflow: str | None
    workflow_version: str | None
    create_time: datetime | None
    waiting_for: str | None
    """For a PENDING task: why no worker has it, in words."""
    worker_principal: str | None
    """With authentication on: the principal it is (or was last) leased to."""
    failed_attempts: int = 0
    """How many times its workflow's code failed on it (a bug: the root waits, PENDING)."""
    last_error: str | None = None
    """The last failure, as `Type: message`."""
    last_traceback: str | None = None
    next_attempt_time: datetime | None = None
    """For a PENDING task that failed: when it is delivered again (its retry backoff)."""
    version_absent_since: datetime | None = None
    """For a PENDING task waiting for its `workflow_version` because no worker connected
    to the server runs it: since when none has been (the last one left, or the server
    started). `troth workflows move` moves such a run to another version."""

    @classmethod
    def from_proto(cls, task: tasks_pb2.Task) -> TaskInfo:
        def when(field: str) -> datetime | None:
            return datetime_from_proto(getattr(task, field)) if task.HasField(field) else None

        return cls(
            id=task.id,
            root_id=task.root_promise_id,
            group=task.group,
            kind=TaskKind(_enum_name(tasks_pb2.TaskKind.Name(task.kind))),
            state=TaskState(_enum_name(tasks_pb2.TaskState.Name(task.state))),
            counter=task.counter,
            worker_id=task.worker_id or None,
            lease_expire_time=when("lease_expire_time"),
            workflow=task.workflow or None,
            workflow_version=task.workflow_version or None,
            create_time=when("create_time"),
            waiting_for=task.waiting_for or None,
            worker_principal=task.worker_principal or None,
            failed_attempts=task.failed_attempts,
            last_error=task.last_error or None,
            last_traceback=task.last_traceback or None,
            next_attempt_time=when("next_attempt_time"),
            version_absent_since=when("version_absent_since"),
        )


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A worker connected to the server answering (`Client.list_workers`)."""

    worker_id: str
    group: str
    principal: str | None
    """The principal its Poll stream authenticated as (None with authentication off)."""
    workflows: tuple[tuple[str, str], ...]
    """The (workflow, version) pairs it runs; empty: any task of its group."""
    capacity: int
    """Tasks it may hold at once (summed over its streams)."""
    task_ids: tuple[str, ...]
    """The tasks it holds now."""
    connect_time: datetime | None
    last_heartbeat_time: datetime | None
    """Its last heartbeat (or other task call) to that server; its connect time before."""
    streams: int
    """Poll streams it has open (a second one adds capacity)."""
    stalled: bool
    """A lease of it ran out (it stopped heartbeating): no task goes to it until it
    heartbeats again."""


class OperatorCalls:
    """`Client`'s calls for operators (a base class of `Client`)."""

    _connection: Connection

    def search_tasks(self, group: str, *, limit: int = 100) -> list[TaskInfo]:
        """The group's tasks that are not completed, oldest first (PENDING and CLAIMED).

        Args:
            group: The worker group.
            limit: At most this many (1 to 1000).

        Raises:
            InvalidArgumentError: An empty group, or a limit out of range.
            PermissionDeniedError: With authentication on, the caller is not an
                operator or admin.
        """
        if not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"limit must be between 1 and {MAX_PAGE}, not {limit!r}")
        request = tasks_pb2.SearchTasksRequest(group=group, page_size=limit)
        stub = self._connection.transport.tasks
        response = self._connection.call(stub.SearchTasks, request)
        return [TaskInfo.from_proto(task) for task in response.tasks]

    def list_workers(self, group: str | None = None) -> list[WorkerInfo]:
        """The workers connected to the server this client talks to, by group then
        worker id, every page followed.

        Each server knows the Poll streams open to it: with several replicas, this
        lists those of the one answering (a client of each replica lists all).

        Args:
            group: Only this group's workers; None: every group.

        Raises:
            InvalidArgumentError: A group name that is not a valid name.
            PermissionDeniedError: With authentication on, the caller is not an
                operator or admin.
        """
        stub = self._connection.transport.tasks
        found: list[WorkerInfo] = []
        token = ""
        while True:
            request = tasks_pb2.SearchWorkersRequest(
                group=group or "", page_size=MAX_PAGE, page_token=token
            )
            response = self._connection.call(stub.SearchWorkers, request)
            found += [_worker_from_proto(w) for w in response.workers]
            token = response.next_page_token
            if not token:
                return found


def _worker_from_proto(worker: tasks_pb2.Worker) -> WorkerInfo:
    def when(field: str) -> datetime | None:
        return datetime_from_proto(getattr(worker, field)) if worker.HasField(field) else None

    return WorkerInfo(
        worker_id=worker.worker_id,
        group=worker.group,
        principal=worker.principal or None,
        workflows=tuple((w.name, w.version) for w in worker.workflows),
        capacity=worker.capacity,
        task_ids=tuple(worker.task_ids),
        connect_time=when("connect_time"),
        last_heartbeat_time=when("last_heartbeat_time"),
        streams=worker.streams,
        stalled=worker.stalled,
    )
