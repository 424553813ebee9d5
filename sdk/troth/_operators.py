"""What operators read and do about the workers' side: a group's tasks
(`Client.search_tasks`), the connected workers (`Client.list_workers`), the workflows
(`Client.search_workflows`) and a paused one retried now (`Client.retry_workflow_now`),
as typed results.

`OperatorCalls` is a base of `Client` (its methods are `Client`'s); the CLI
(`troth tasks list`, `troth workers list`, `troth workflows ...`) and the console
call them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from troth import _arguments as check
from troth._convert import (
    datetime_from_proto,
    datetime_to_proto,
    parse_state,
    promise_from_proto,
    state_to_proto,
)
from troth.v1 import promises_pb2, tasks_pb2

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from datetime import datetime

    from troth._calls import Connection
    from troth._promise import Promise, PromiseState

__all__ = ["OperatorCalls", "TaskInfo", "TaskKind", "TaskState", "WorkerInfo", "WorkflowInfo"]

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


@dataclass(frozen=True, slots=True)
class WorkflowInfo:
    """A workflow as `Client.search_workflows` lists it: its root promise (whose id is
    the workflow's), its task if one is not completed, and the human decisions it
    waits on."""

    root: Promise
    group: str
    """The worker group that runs it (its `troth:invoke` tag)."""
    workflow: str
    """The workflow's name (its `troth:func` tag)."""
    version: str | None
    """The version of its code recorded when a worker first took it (None before)."""
    task: TaskInfo | None
    """Its task, when one is not completed: waiting for a worker (PENDING, `waiting_for`
    says why), held by one (CLAIMED), or paused (`failed_attempts`, `last_error`,
    `last_traceback`, `next_attempt_time`)."""
    waiting_on: list[Promise]
    """Its PENDING steps that no worker settles (human decisions), in creation order."""

    @property
    def id(self) -> str:
        return self.root.id

    @property
    def state(self) -> PromiseState:
        """Its root's state: PENDING while it runs or waits."""
        return self.root.state

    @property
    def paused(self) -> bool:
        """Whether a bug pauses it: its code failed on its task, which waits out a retry
        backoff (or is being retried). `Client.retry_workflow_now` retries it at once."""
        return self.task is not None and self.task.failed_attempts > 0

    @classmethod
    def from_proto(cls, summary: tasks_pb2.WorkflowSummary) -> WorkflowInfo:
        return cls(
            root=promise_from_proto(summary.root),
            group=summary.group,
            workflow=summary.workflow,
            version=summary.workflow_version or None,
            task=TaskInfo.from_proto(summary.task) if summary.HasField("task") else None,
            waiting_on=[promise_from_proto(p) for p in summary.waiting_on],
        )


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

    def search_workflows(
        self,
        *,
        id: str | None = None,
        states: Iterable[PromiseState | str] | None = None,
        group: str | None = None,
        workflow: str | None = None,
        version: str | None = None,
        paused: bool = False,
        waiting_for_human: bool = False,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        limit: int | None = 100,
        newest_first: bool = True,
    ) -> list[WorkflowInfo]:
        """The workflows matching every filter given, newest first by default: each
        with its task (paused or waiting, and why) and the human decisions it waits on.
        Only those the caller may see (its id prefixes; a worker's groups).

        Args:
            id: Glob over workflow ids; `*` matches any run of characters.
            states: Any of these states of the root (an expired one counts as timed out).
            group: Only this worker group's workflows.
            workflow: Only workflows of this name.
            version: Only those recorded at this version of their code.
            paused: Only those a bug pauses (their code failed; `WorkflowInfo.paused`).
            waiting_for_human: Only PENDING ones waiting on a decision no worker makes.
            created_after: Only those started at or after this aware datetime.
            created_before: Only those started before this aware datetime.
            limit: At most this many (pages are followed); None: all of them
                (`iter_workflows` reads them a page at a time).
            newest_first: False lists the oldest first.

        Raises:
            InvalidArgumentError: A bad glob, group or name, or created_after not
                before created_before.
            PermissionDeniedError: A worker naming a group its grant does not.
            ValueError: An unknown state, a naive datetime, a limit below 1.
        """
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise TypeError(f"Client.search_workflows: limit must be an int or None, not {limit!r}")
        if limit is not None and limit < 1:
            raise ValueError(f"Client.search_workflows: limit must be 1 or more, not {limit!r}")
        found: list[WorkflowInfo] = []
        pages = self._workflow_pages(
            id=id, states=states, group=group, workflow=workflow, version=version,
            paused=paused, waiting_for_human=waiting_for_human, created_after=created_after,
            created_before=created_before, newest_first=newest_first,
            page_size=MAX_PAGE if limit is None else min(limit, MAX_PAGE),
        )  # fmt: skip
        for page in pages:
            found += page
            if limit is not None and len(found) >= limit:
                return found[:limit]
        return found

    def iter_workflows(
        self,
        *,
        id: str | None = None,
        states: Iterable[PromiseState | str] | None = None,
        group: str | None = None,
        workflow: str | None = None,
        version: str | None = None,
        paused: bool = False,
        waiting_for_human: bool = False,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        newest_first: bool = True,
        page_size: int = MAX_PAGE,
    ) -> Iterator[WorkflowInfo]:
        """Every workflow `search_workflows` would list with these filters, read a page
        (of `page_size`, 1 to 1000) at a time as the iteration goes."""
        pages = self._workflow_pages(
            id=id, states=states, group=group, workflow=workflow, version=version,
            paused=paused, waiting_for_human=waiting_for_human, created_after=created_after,
            created_before=created_before, newest_first=newest_first, page_size=page_size,
        )  # fmt: skip
        for page in pages:
            yield from page

    def _workflow_pages(
        self,
        *,
        id: str | None,
        states: Iterable[PromiseState | str] | None,
        group: str | None,
        workflow: str | None,
        version: str | None,
        paused: bool,
        waiting_for_human: bool,
        created_after: datetime | None,
        created_before: datetime | None,
        newest_first: bool,
        page_size: int,
    ) -> Iterator[list[WorkflowInfo]]:
        call = "Client.search_workflows"
        check.texts(call, optional=True, id=id, group=group, workflow=workflow, version=version)
        check.flags(call, paused=paused, waiting_for_human=waiting_for_human,
                    newest_first=newest_first)  # fmt: skip
        after = check.moment(call, created_after, "created_after")
        before = check.moment(call, created_before, "created_before")
        if not 1 <= page_size <= MAX_PAGE:
            raise ValueError(
                f"{call}: page_size must be between 1 and {MAX_PAGE}, not {page_size!r}"
            )
        request = tasks_pb2.SearchWorkflowsRequest(
            id=id or "",
            states=[state_to_proto(parse_state(s)) for s in states or ()],
            group=group or "",
            workflow=workflow or "",
            workflow_version=version or "",
            paused=paused,
            waiting_for_human=waiting_for_human,
            page_size=page_size,
            order=promises_pb2.PROMISE_ORDER_CREATED_DESC
            if newest_first
            else promises_pb2.PROMISE_ORDER_CREATED_ASC,
        )
        if after is not None:
            request.created_after.CopyFrom(datetime_to_proto(after))
        if before is not None:
            request.created_before.CopyFrom(datetime_to_proto(before))
        stub = self._connection.transport.tasks
        while True:
            response = self._connection.call(stub.SearchWorkflows, request)
            yield [WorkflowInfo.from_proto(w) for w in response.workflows]
            if not response.next_page_token:
                return
            request.page_token = response.next_page_token

    def retry_workflow_now(self, workflow_id: str) -> TaskInfo:
        """Retry a paused workflow now (an operator's `troth workflows retry-now`): its
        task, waiting out its retry backoff after its code failed, is delivered at once,
        to code you fixed and deployed. Its failure count and last error stay until an
        attempt succeeds.

        Returns:
            Its task, PENDING, its next attempt now.

        Raises:
            NotFoundError: No promise has this id.
            FailedPreconditionError: It is not paused (reason `WORKFLOW_NOT_PAUSED`: it
                waits on its steps, runs now, or is over), or the promise is no
                workflow (`NOT_A_WORKFLOW`).
            PermissionDeniedError: With authentication on, the caller is not an
                operator or admin, or the id is outside its prefixes.
        """
        request = tasks_pb2.RetryWorkflowNowRequest(
            id=check.promise_id("Client.retry_workflow_now", workflow_id, "workflow_id")
        )
        stub = self._connection.transport.tasks
        return TaskInfo.from_proto(self._connection.call(stub.RetryWorkflowNow, request).task)


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
