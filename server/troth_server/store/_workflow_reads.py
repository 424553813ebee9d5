"""Workflow reads: the roots tagged `troth:invoke`, listed by their own indexes.

`WorkflowReads` is mixed into `SqlStore` (which supplies `_read` and the engines),
beside `PromiseReads`. A workflow's root carries its group and name in columns of
their own (`workflow_group`, `workflow_name`, revision 0012), NULL for every other
promise, so that `ix_promises_workflows` (every group's) and
`ix_promises_workflows_group` (one group's) hold the roots only: a page of
workflows walks roots, never the history of steps and standalone promises. The
`paused` filter is driven by `ix_tasks_paused` (tasks whose code failed, not
completed) and `waiting_for_human` by `ix_promises_pending_parent` (PENDING steps):
both live rows only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import bindparam, func, literal_column, or_, select

from troth_server.domain.promise import Promise, PromiseState
from troth_server.domain.steps import CHECKPOINT_KINDS, KIND_TAG
from troth_server.domain.task import Task, TaskState
from troth_server.store import SearchRow, WorkflowQuery
from troth_server.store._bind import chunks
from troth_server.store._reads import glob_to_like, prefix_to_like, state_condition
from troth_server.store._rows import to_promise, to_task
from troth_server.store._tables import promises, state_in, tasks

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

    from sqlalchemy import Connection

    from troth_server.store._engines import Engines

T = TypeVar("T")

__all__ = ["WorkflowReads"]

_steps = promises.alias("steps")

# The roots with a task whose code failed and that is not completed (ix_tasks_paused).
_PAUSED_ROOTS = select(tasks.c.root_promise_id).where(
    tasks.c.failed_attempts > 0,
    state_in(tasks.c.state, TaskState.PENDING.value, TaskState.CLAIMED.value),
)
_ACTIVE_TASKS = select(tasks).where(
    tasks.c.root_promise_id.in_(bindparam("roots", expanding=True)),
    state_in(tasks.c.state, TaskState.PENDING.value, TaskState.CLAIMED.value),
)
_PENDING_STEPS = (
    select(promises)
    .where(
        promises.c.parent_id.in_(bindparam("parents", expanding=True)),
        state_in(promises.c.state, PromiseState.PENDING.value),
    )
    .order_by(promises.c.seq)
)


class WorkflowReads:
    """The workflow half of `SqlStore`'s reads."""

    _engines: Engines

    def _read(self, read: Callable[[Connection], T]) -> T:
        raise NotImplementedError

    def search_workflows(self, query: WorkflowQuery, now: int) -> list[SearchRow]:
        c = promises.c
        # The partial indexes' own condition: the planner may use them only with it.
        conditions: list[Any] = [c.workflow_group.is_not(None)]
        if query.after_seq:
            conditions.append(
                c.seq < query.after_seq if query.newest_first else c.seq > query.after_seq
            )
        if query.groups is not None:
            conditions.append(
                c.workflow_group == query.groups[0]
                if len(query.groups) == 1
                else c.workflow_group.in_(query.groups)
            )
        if query.id_glob not in ("", "*"):
            conditions.append(c.id.like(glob_to_like(query.id_glob), escape="\\"))
        if query.id_prefixes:
            conditions.append(
                or_(*(c.id.like(prefix_to_like(p), escape="\\") for p in query.id_prefixes))
            )
        if query.states:
            conditions.append(or_(*(state_condition(s, now) for s in query.states)))
        if query.workflow is not None:
            conditions.append(c.workflow_name == query.workflow)
        if query.version is not None:
            conditions.append(c.workflow_version == query.version)
        if query.created_after is not None:
            conditions.append(c.create_time >= query.created_after)
        if query.created_before is not None:
            conditions.append(c.create_time < query.created_before)
        if query.paused:
            conditions.append(c.id.in_(_PAUSED_ROOTS))
        if query.waiting_for_human:
            conditions.append(state_condition(PromiseState.PENDING, now))
            conditions.append(c.id.in_(self._human_parents()))
        order = c.seq.desc() if query.newest_first else c.seq
        stmt = select(promises).where(*conditions).order_by(order).limit(query.limit)
        rows = self._read(lambda conn: conn.execute(stmt).all())
        return [SearchRow(seq=row[0], promise=to_promise(row)) for row in rows]

    def _human_parents(self) -> Any:
        """The workflows with a PENDING step that no worker settles (not a `run`, `sleep`,
        child start, ... checkpoint): a walk of the PENDING steps (ix_promises_pending_parent)."""
        if self._engines.read.dialect.name == "postgresql":
            kind = func.jsonb_extract_path_text(_steps.c.tags, KIND_TAG)
        else:
            kind = func.json_extract(_steps.c.tags, f'$."{KIND_TAG}"')
        checkpoints: list[Any] = [literal_column(f"'{k}'") for k in sorted(CHECKPOINT_KINDS)]
        return select(_steps.c.parent_id).where(
            state_in(_steps.c.state, PromiseState.PENDING.value),
            _steps.c.parent_id.is_not(None),
            func.coalesce(kind, "").not_in(checkpoints),
        )

    def active_tasks(self, root_ids: Collection[str]) -> dict[str, Task]:
        if not root_ids:
            return {}
        wanted = sorted(root_ids)

        def read(conn: Connection) -> list[Any]:
            return [
                row
                for part in chunks(wanted)
                for row in conn.execute(_ACTIVE_TASKS, {"roots": part}).mappings()
            ]

        return {t.root_promise_id: t for t in map(to_task, self._read(read))}

    def pending_steps(self, parent_ids: Collection[str]) -> list[Promise]:
        if not parent_ids:
            return []
        wanted = sorted(parent_ids)

        def read(conn: Connection) -> list[Any]:
            return [
                row
                for part in chunks(wanted)
                for row in conn.execute(_PENDING_STEPS, {"parents": part})
            ]

        rows = sorted(self._read(read), key=lambda row: row[0])
        return [to_promise(row) for row in rows]
