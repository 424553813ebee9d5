"""`SearchWorkflows`' request and answer: every field validated, the caller's reach
applied (its id prefixes; a worker's groups), and each workflow on the wire as the
caller may see it (`domain.visibility`)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeAlias

from troth.v1 import promises_pb2, tasks_pb2
from troth_server.api import _audit as audit
from troth_server.api import _convert as convert
from troth_server.api._auth import group_refusal
from troth_server.domain import steps, visibility
from troth_server.domain.access import ANY_GROUP
from troth_server.domain.errors import InvalidArgument
from troth_server.domain.routing import FUNC_TAG, MAX_WORKFLOW_NAME, MAX_WORKFLOW_VERSION
from troth_server.store import WorkflowQuery

if TYPE_CHECKING:
    from collections.abc import Callable

    import grpc.aio
    from google.protobuf.timestamp_pb2 import Timestamp

    from troth_server.config import Limits
    from troth_server.domain.access import Principal
    from troth_server.domain.task import Task
    from troth_server.workflows import Workflow

    AioContext: TypeAlias = grpc.aio.ServicerContext[Any, Any]

__all__ = ["summaries", "workflow_query"]

_LAST_SECOND = 253_402_300_799
"""9999-12-31T23:59:59Z: the last timestamp a search takes (proto Timestamp's range)."""


def workflow_query(
    request: tasks_pb2.SearchWorkflowsRequest,
    limits: Limits,
    reader: Principal,
    context: AioContext,
) -> WorkflowQuery | None:
    """The store's query for `request` by `reader`; None when nothing the reader may
    see can match (every id the glob matches is outside its prefixes)."""
    id_glob = convert.search_id_glob(request.id, limits)
    group = convert.optional_group(request.group, limits)
    created_after = _moment(request, "created_after")
    created_before = _moment(request, "created_before")
    if created_after is not None and created_before is not None and created_after >= created_before:
        raise InvalidArgument(
            "created_after",
            "is not before created_before: no workflow can have started in between; "
            "give an earlier created_after or a later created_before",
        )
    query = WorkflowQuery(
        limit=convert.page_size(request.page_size, limits),
        newest_first=_newest_first(request.order),
        id_glob=id_glob,
        states=convert.search_states(list(request.states)),
        groups=_groups(group, reader, context),
        workflow=_bounded(request.workflow, MAX_WORKFLOW_NAME, "workflow"),
        version=_bounded(request.workflow_version, MAX_WORKFLOW_VERSION, "workflow_version"),
        paused=request.paused,
        waiting_for_human=request.waiting_for_human,
        created_after=created_after,
        created_before=created_before,
    )
    prefixes = reader.scope(id_glob)
    if prefixes is None or query.groups == ():
        return None
    return replace(query, id_prefixes=prefixes)


def _groups(group: str, reader: Principal, context: AioContext) -> tuple[str, ...] | None:
    """The groups the search is narrowed to: the one asked for, and for a worker and
    nothing more (`steps.is_confined`) the groups its grant names (DESIGN §7); None:
    every group."""
    if not steps.is_confined(reader) or ANY_GROUP in reader.groups:
        return (group,) if group else None
    if group:
        refusal = group_refusal(reader, group, "SearchWorkflows")
        if refusal is not None:
            audit.auth_refused("SearchWorkflows", refusal, reader.name, context)
            raise refusal
        return (group,)
    return tuple(sorted(reader.groups))


def _newest_first(order: int) -> bool:
    if order == promises_pb2.PROMISE_ORDER_UNSPECIFIED:
        return True
    if order == promises_pb2.PROMISE_ORDER_CREATED_DESC:
        return True
    if order == promises_pb2.PROMISE_ORDER_CREATED_ASC:
        return False
    if order == promises_pb2.PROMISE_ORDER_EXPIRE_TIME_ASC:
        raise InvalidArgument(
            "order",
            "EXPIRE_TIME_ASC does not list workflows; use CREATED_DESC (newest first, the "
            "default) or CREATED_ASC (oldest first)",
        )
    raise InvalidArgument(
        "order", f"{order} is not an order; use CREATED_DESC (the default) or CREATED_ASC"
    )


def _moment(request: tasks_pb2.SearchWorkflowsRequest, field: str) -> int | None:
    if not request.HasField(field):
        return None
    value: Timestamp = getattr(request, field)
    if value.seconds > _LAST_SECOND:
        raise InvalidArgument(field, "is after the year 9999: give a real time")
    return convert.timestamp_ms(value, field)


def _bounded(value: str, limit: int, field: str) -> str | None:
    if len(value) > limit:
        raise InvalidArgument(
            field, f"is {len(value)} characters long; no {field} is longer than {limit}"
        )
    return value or None


_TASK_DETAILS = ("last_error", "last_traceback", "worker_id", "worker_principal", "counter")
"""What a reader who may not read tasks does not see of a workflow's task
(`visibility.sees_task_details`)."""


def summaries(
    found: list[Workflow],
    reader: Principal,
    described: Callable[[list[Task]], list[tasks_pb2.Task]],
) -> list[tasks_pb2.WorkflowSummary]:
    """The workflows on the wire as `reader` may see them; `described` puts their tasks
    on the wire (with why each PENDING one waits)."""
    details = visibility.sees_task_details(reader)
    active = [w.task for w in found if w.task is not None]
    on_wire = dict(zip((t.id for t in active), described(active), strict=True))
    answer = []
    for workflow in found:
        root = workflow.root
        summary = tasks_pb2.WorkflowSummary(
            root=convert.to_pb(visibility.view(root, reader)),
            group=workflow.group,
            workflow=root.tags.get(FUNC_TAG, ""),
            workflow_version=root.workflow_version or "",
            waiting_on=[
                convert.to_pb(visibility.view(step, reader, workflow.group))
                for step in workflow.waiting_on
            ],
        )
        if workflow.task is not None:
            summary.task.CopyFrom(on_wire[workflow.task.id])
            if not details:
                for withheld in _TASK_DETAILS:
                    summary.task.ClearField(withheld)
        answer.append(summary)
    return answer
