"""Task and callback statements, and the task half of a write transaction.

What every write batch runs (its tasks by id, the active tasks of its roots, the
callbacks of its promises, the task rows it writes) is compiled once per dialect
(`CompiledTaskStatements`) and run straight on the driver, as `_sql._Compiled` does
for promises: SQLAlchemy's per-execution work was most of their cost. The rest are
Core statements executed as they are: claims, lease sweeps, and the reads of
`SearchTasks`.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Connection,
    and_,
    bindparam,
    case,
    false,
    func,
    literal,
    or_,
    select,
    union_all,
)
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from troth_server.domain.routing import ANY, Route, workflow_name
from troth_server.domain.task import UNKNOWN_LEASE_MS, Callback, Task, TaskState
from troth_server.store._bind import ByIds, chunks, compile_for, sqlite_indexed
from troth_server.store._rows import load_json, to_task
from troth_server.store._tables import (
    callbacks,
    promises,
    route_key,
    route_none,
    state_in,
    tasks,
)

if TYPE_CHECKING:
    from collections.abc import Collection, Sequence

    from sqlalchemy.engine import Dialect

__all__ = [
    "MAX_ROUTE_KEYS",
    "CompiledTaskStatements",
    "TaskStatements",
    "TaskTx",
    "route_condition",
    "route_keys",
]


_FOREVER = 2**62
"""A `now` past every retry backoff."""


def _due_order(c: Any) -> tuple[Any, ...]:
    """The claim's order of tasks past a backoff, on the columns `c`: preferred for
    this worker, for nobody, for another; oldest first."""
    preference = case(
        (c.preferred_worker_id == bindparam("worker"), 0),
        (c.preferred_worker_id.is_(None), 1),
        else_=2,
    )
    return (preference, c.create_time)


class TaskStatements:
    """Task and callback statements: Core, executed as they are (not on the promise hot path)."""

    # Candidates for a claim or a sweep are taken with SKIP LOCKED: replicas share
    # the work instead of queueing for the same rows.
    claimable = select(tasks).where(
        tasks.c.group == bindparam("group"), state_in(tasks.c.state, TaskState.PENDING.value)
    )
    # The claim's probes, each in the order of a partial index of its rows (revision
    # 0013), so that a claim reads its batch however long the group's backlog is:
    # ready tasks (no retry backoff) preferred for this worker (its resumes), for
    # nobody, and for another worker, oldest first; and tasks whose backoff is over.
    # `TaskTx.pending_tasks` merges them.
    ready = claimable.where(tasks.c.next_attempt_time.is_(None))
    ready_mine = ready.where(
        tasks.c.preferred_worker_id.is_not(None),
        tasks.c.preferred_worker_id == bindparam("worker"),
    ).order_by(tasks.c.create_time)
    ready_anyone = ready.where(tasks.c.preferred_worker_id.is_(None)).order_by(tasks.c.create_time)
    ready_promised = ready.where(
        tasks.c.preferred_worker_id.is_not(None),
        tasks.c.preferred_worker_id != bindparam("worker"),
    ).order_by(tasks.c.create_time)
    # Those whose backoff is over, in the claim's order: a range of ix_tasks_backoff
    # (its due rows, never those still waiting) and a sort of that range only, which
    # holds the failed tasks no worker has taken back yet.
    due = claimable.where(
        tasks.c.next_attempt_time.is_not(None), tasks.c.next_attempt_time <= bindparam("now")
    ).order_by(*_due_order(tasks.c))
    claimed_peek = select(tasks).where(
        tasks.c.worker_id == bindparam("worker"), state_in(tasks.c.state, TaskState.CLAIMED.value)
    )
    claimed = claimed_peek.order_by(tasks.c.id).with_for_update()
    # A broken stream's: the worker's tasks of its group.
    claimed_in_group_peek = claimed_peek.where(tasks.c.group == bindparam("group"))
    claimed_in_group = claimed_in_group_peek.order_by(tasks.c.id).with_for_update()
    lease_expired = (
        select(tasks)
        .where(
            state_in(tasks.c.state, TaskState.CLAIMED.value),
            tasks.c.lease_expire_time <= bindparam("now"),
            # One lease length since the server came back (domain: task.lease_expired).
            func.coalesce(tasks.c.lease_ms, UNKNOWN_LEASE_MS) <= bindparam("since_back"),
        )
        .order_by(tasks.c.lease_expire_time)
        .limit(bindparam("limit"))
        .with_for_update(skip_locked=True)
    )
    update = (
        tasks.update()
        .where(tasks.c.id == bindparam("b_id"))
        .values(
            state=bindparam("b_state"),
            counter=bindparam("b_counter"),
            worker_id=bindparam("b_worker_id"),
            lease_expire_time=bindparam("b_lease_expire_time"),
            lease_ms=bindparam("b_lease_ms"),
            preferred_worker_id=bindparam("b_preferred_worker_id"),
            resume_pending=bindparam("b_resume_pending"),
            workflow_version=bindparam("b_workflow_version"),
            complete_time=bindparam("b_complete_time"),
            worker_principal=bindparam("b_worker_principal"),
            failed_attempts=bindparam("b_failed_attempts"),
            last_error=bindparam("b_last_error"),
            last_traceback=bindparam("b_last_traceback"),
            next_attempt_time=bindparam("b_next_attempt_time"),
        )
    )
    # The sweeper's cleanup: completed tasks past the window for a repeated CompleteTask.
    completed_ids = (
        select(tasks.c.id)
        .where(
            state_in(tasks.c.state, TaskState.COMPLETED.value),
            tasks.c.complete_time <= bindparam("before"),
        )
        .order_by(tasks.c.complete_time)
        .limit(bindparam("limit"))
    )
    # SearchTasks: PENDING by the group's partial index, CLAIMED by theirs (few).
    search_pending = (
        select(tasks)
        .where(
            tasks.c.group == bindparam("group"), state_in(tasks.c.state, TaskState.PENDING.value)
        )
        .order_by(tasks.c.create_time, tasks.c.id)
        .limit(bindparam("limit"))
    )
    search_claimed = (
        select(tasks)
        .where(
            state_in(tasks.c.state, TaskState.CLAIMED.value), tasks.c.group == bindparam("group")
        )
        .order_by(tasks.c.create_time, tasks.c.id)
        .limit(bindparam("limit"))
    )
    # `troth workflows show`: a root's active task, by the one-active-task index.
    search_root = select(tasks).where(
        tasks.c.root_promise_id == bindparam("root"),
        state_in(tasks.c.state, TaskState.PENDING.value, TaskState.CLAIMED.value),
    )
    # The metrics' counts of live tasks, each by the partial index of its state.
    # PENDING ones by workflow version too: those waiting for a version (the metrics').
    count_pending = (
        select(tasks.c.group, tasks.c.workflow, tasks.c.workflow_version, func.count())
        .where(state_in(tasks.c.state, TaskState.PENDING.value))
        .group_by(tasks.c.group, tasks.c.workflow, tasks.c.workflow_version)
    )
    count_claimed = (
        select(tasks.c.group, func.count())
        .where(state_in(tasks.c.state, TaskState.CLAIMED.value))
        .group_by(tasks.c.group)
    )


_TASK_COLUMNS = tuple(c.name for c in tasks.c)


class CompiledTaskStatements:
    """The task statements every write batch runs, compiled once for the dialect.

    Rows a write transaction reads it also locks (FOR UPDATE on PostgreSQL), in id
    order, so that a second replica's transaction waits and then sees the first
    one's outcome; `peek` reads tasks unlocked, to learn their roots first.
    """

    def __init__(self, dialect: Dialect) -> None:
        c = tasks.c
        self.peek = ByIds(dialect, lambda ids: select(tasks).where(c.id.in_(ids)))
        self.get = ByIds(
            dialect, lambda ids: select(tasks).where(c.id.in_(ids)).order_by(c.id).with_for_update()
        )
        self.active = ByIds(
            dialect,
            lambda ids: (
                select(tasks)
                .where(
                    c.root_promise_id.in_(ids),
                    state_in(c.state, TaskState.PENDING.value, TaskState.CLAIMED.value),
                )
                .order_by(c.id)
                .with_for_update()
            ),
        )
        self.callbacks = ByIds(
            dialect,
            lambda ids: select(
                callbacks.c.promise_id,
                callbacks.c.root_promise_id,
                callbacks.c.group,
                callbacks.c.worker_id,
            ).where(callbacks.c.promise_id.in_(ids)),
        )
        self.insert = compile_for(
            tasks.insert().values({name: bindparam(name) for name in _TASK_COLUMNS}), dialect
        )
        # A root's workflow and version, for the RESUME tasks its callbacks create.
        # Unlocked: both are written once (the version when the root's first task
        # was claimed, which happened before any callback of it was registered).
        self.root_workflows = ByIds(
            dialect,
            lambda ids: select(promises.c.id, promises.c.tags, promises.c.workflow_version).where(
                promises.c.id.in_(ids)
            ),
        )
        upsert = sqlite_insert if dialect.name == "sqlite" else postgresql_insert
        self.insert_callbacks = compile_for(
            upsert(callbacks)
            .values({c.name: bindparam(c.name) for c in callbacks.c})
            .on_conflict_do_nothing(),
            dialect,
        )
        self.delete_callbacks = ByIds(
            dialect, lambda ids: callbacks.delete().where(callbacks.c.promise_id.in_(ids))
        )
        self.delete_root_callbacks = ByIds(
            dialect, lambda ids: callbacks.delete().where(callbacks.c.root_promise_id.in_(ids))
        )
        self.update = compile_for(TaskStatements.update, dialect)


class TaskTx:
    """The task half of a write transaction (mixed into `_WriteTx`)."""

    _conn: Connection
    _task_statements: CompiledTaskStatements

    def _write(self, sql: str, params: Sequence[Any]) -> None:
        """Run a write statement once per row of `params` (`_WriteTx`: at once, or
        queued for the transaction's final writes)."""
        raise NotImplementedError

    def _select(self, sql: str, params: Any) -> Sequence[Sequence[Any]]:
        """The rows of a read statement, in its columns' order."""
        raise NotImplementedError

    def get_callbacks(self, promise_ids: Collection[str]) -> list[Callback]:
        if not promise_ids:
            return []
        by_promise = self._task_statements.callbacks
        return [
            Callback(*row)
            for part in chunks(sorted(promise_ids))
            for row in self._select(*by_promise.bound(part))
        ]

    def insert_callbacks(self, items: Sequence[Callback], now: int) -> None:
        if not items:
            return
        stmt = self._task_statements.insert_callbacks
        rows = [
            {
                "promise_id": c.promise_id,
                "root_promise_id": c.root_promise_id,
                "group": c.group,
                "worker_id": c.worker_id,
                "create_time": now,
            }
            for c in items
        ]
        self._write(stmt.sql, [stmt.params(row) for row in rows])

    def delete_callbacks(self, promise_ids: Collection[str], root_ids: Collection[str]) -> None:
        compiled = self._task_statements
        for ids, by in (
            (promise_ids, compiled.delete_callbacks),
            (root_ids, compiled.delete_root_callbacks),
        ):
            for part in chunks(sorted(ids)):
                sql, params = by.bound(part)
                self._write(sql, [params])

    def get_tasks(self, task_ids: Collection[str], *, lock: bool = True) -> dict[str, Task]:
        if not task_ids:
            return {}
        compiled = self._task_statements
        by_id = compiled.get if lock else compiled.peek
        return {
            task.id: task
            for part in chunks(sorted(task_ids))
            for task in map(_task_of, self._select(*by_id.bound(part)))
        }

    def get_active_tasks(self, root_ids: Collection[str]) -> dict[str, Task]:
        if not root_ids:
            return {}
        by_root = self._task_statements.active
        return {
            task.root_promise_id: task
            for part in chunks(sorted(root_ids))
            for task in map(_task_of, self._select(*by_root.bound(part)))
        }

    def pending_tasks(
        self, group: str, prefer_worker: str, limit: int, route: Route = ANY, now: int | None = None
    ) -> list[Task]:
        """Up to `limit` claimable tasks of `group` at `now` (past any retry backoff):
        those preferred for `prefer_worker`, then for nobody, then for another worker,
        oldest first within each (`Store.pending_tasks`)."""
        # Without `now` (a store test), no backoff holds a task back.
        at = _FOREVER if now is None else now
        params = {"group": group, "worker": prefer_worker, "limit": limit, "now": at}
        probes = _probes_for(route)

        def run(probe: _Probe, wanted: int) -> list[Task]:
            # Each probe locks only what can still make the batch: rows it locks but
            # the claim leaves are held from other replicas until this one commits.
            if wanted <= 0:
                return []
            sql, bound = probe.bound(self._conn.dialect, {**params, "limit": wanted})
            # On the write transaction's own path (on PostgreSQL prepared once per
            # connection, on libpq straight): a probe parsed and planned at every claim
            # (a UNION ALL of its route's keys) cost PostgreSQL more than it ran.
            return [_task_of(row) for row in self._select(sql, bound)]

        mine = run(probes.mine, limit)
        # The due ones come in the claim's order too: at most `limit` of them can count.
        found = mine + run(probes.anyone, limit - len(mine)) + run(probes.due, limit)
        ahead = sum(_preference(t, prefer_worker) < _ELSEWHERE for t in found)
        # Tasks another worker is preferred for, only as many as the others leave room
        # for: none of them can come before.
        found += run(probes.promised, limit - ahead)
        # One task may come from two probes only if a worker's id were '' (the route
        # indexes key "preferred for nobody" as ''): taken once.
        unique = {t.id: t for t in found}.values()
        return sorted(unique, key=lambda t: (_preference(t, prefer_worker), t.create_time or 0))[
            :limit
        ]

    def root_workflows(self, root_ids: Collection[str]) -> dict[str, tuple[str | None, str | None]]:
        if not root_ids:
            return {}
        by_id = self._task_statements.root_workflows
        return {
            row[0]: (workflow_name(load_json(row[1])), row[2] or None)
            for part in chunks(sorted(root_ids))
            for row in self._select(*by_id.bound(part))
        }

    def claimed_tasks(
        self, worker_id: str, group: str | None = None, *, lock: bool = True
    ) -> list[Task]:
        if group is None:
            stmt = TaskStatements.claimed if lock else TaskStatements.claimed_peek
        else:
            stmt = TaskStatements.claimed_in_group if lock else TaskStatements.claimed_in_group_peek
        rows = self._conn.execute(stmt, {"worker": worker_id, "group": group}).mappings()
        return [to_task(r) for r in rows]

    def lease_expired_tasks(
        self, now: int, limit: int, back_since: int | None = None
    ) -> list[Task]:
        since_back = now if back_since is None else now - back_since
        params = {"now": now, "limit": limit, "since_back": since_back}
        rows = self._conn.execute(TaskStatements.lease_expired, params).mappings()
        return [to_task(r) for r in rows]

    def insert_tasks(self, items: Sequence[Task], now: int) -> None:
        if items:
            stmt = self._task_statements.insert
            rows = [stmt.params(_task_row(t, now)) for t in items]
            self._write(stmt.sql, rows)

    def delete_completed_tasks(self, completed_before: int, limit: int) -> int:
        params = {"before": completed_before, "limit": limit}
        select_ids = TaskStatements.completed_ids
        if self._conn.dialect.name == "postgresql":
            select_ids = select_ids.with_for_update(skip_locked=True)
        ids = list(self._conn.execute(select_ids, params).scalars())
        if ids:
            self._conn.execute(tasks.delete().where(tasks.c.id.in_(ids)))
        return len(ids)

    def update_tasks(self, items: Sequence[Task], now: int) -> None:
        if items:
            stmt = self._task_statements.update
            # The update binds the columns it sets as `b_<column>` (a name of its own,
            # as SQLAlchemy wants in an UPDATE); it takes only those from the row.
            rows = [
                stmt.params({f"b_{name}": value for name, value in _task_row(t, now).items()})
                for t in items
            ]
            self._write(stmt.sql, rows)


def _task_of(row: Sequence[Any]) -> Task:
    """A task from a row of every column, in the table's order."""
    return to_task(dict(zip(_TASK_COLUMNS, row, strict=True)))


def _task_row(t: Task, now: int) -> dict[str, Any]:
    """Every column of a task's row, as the insert and the update bind them."""
    return {
        "id": t.id,
        "root_promise_id": t.root_promise_id,
        "group": t.group,
        "kind": t.kind.value,
        "state": t.state.value,
        "counter": t.counter,
        "worker_id": t.worker_id,
        "lease_expire_time": t.lease_expire_time,
        "lease_ms": t.lease_ms,
        "preferred_worker_id": t.preferred_worker_id,
        "resume_pending": t.resume_pending,
        "create_time": now,
        "workflow": t.workflow,
        "workflow_version": t.workflow_version,
        "complete_time": _complete_time(t, now),
        "worker_principal": t.worker_principal,
        "failed_attempts": t.failed_attempts,
        "last_error": t.last_error,
        "last_traceback": t.last_traceback,
        "next_attempt_time": t.next_attempt_time,
    }


def _complete_time(task: Task, now: int) -> int | None:
    """When a task completed: kept from its first completion (a repeat changes nothing)."""
    if task.state is not TaskState.COMPLETED:
        return None
    return task.complete_time if task.complete_time is not None else now


_MINE, _ANYONE, _ELSEWHERE = 0, 1, 2


def _preference(task: Task, worker: str) -> int:
    """Where a claim by `worker` takes `task`: its own resumes, then anyone's, then
    those another worker is preferred for."""
    if task.preferred_worker_id is None:
        return _ANYONE
    return _MINE if task.preferred_worker_id == worker else _ELSEWHERE


@dataclass(frozen=True, eq=False)
class _Probe:
    """One probe of the claim, and the index that serves it (each of its branches)."""

    stmt: Any
    index: str
    sqlite_stmt: Any = None
    """On SQLite, when not `stmt`."""

    @functools.cached_property
    def _compiled(self) -> dict[str, Any]:
        return {}

    def bound(self, dialect: Dialect, values: dict[str, Any]) -> tuple[str, Any]:
        """Its SQL for `dialect` and the parameters for `values`, compiled once per
        dialect. SQLite weighs a partial index by its rows per group, not by its
        predicate: the group's index of every PENDING task looked as good to it as the
        one of the rows a probe wants, and it walked the group's backlog to filter
        them; there the probe names its index (`INDEXED BY`; PostgreSQL's planner
        knows its partial indexes)."""
        compiled = self._compiled.get(dialect.name)
        if compiled is None:
            stmt = self.stmt
            if dialect.name == "sqlite" and self.sqlite_stmt is not None:
                stmt = self.sqlite_stmt
            compiled = stmt.compile(dialect=dialect)
            sql = str(compiled)
            if dialect.name == "sqlite":
                sql = sqlite_indexed(sql, "tasks", self.index, every=True)
            self._compiled[dialect.name] = compiled = (compiled, sql)
        statement, sql = compiled
        params = statement.construct_params(values)
        if statement.positional:
            return sql, tuple(params[name] for name in statement.positiontup)
        return sql, params


@dataclass(frozen=True)
class _Probes:
    mine: _Probe
    anyone: _Probe
    promised: _Probe
    due: _Probe


MAX_ROUTE_KEYS = 24
"""The most keys (`route_keys`) a claim reads by index, each a branch of every probe:
a route with more (a stream that lists a dozen workflows in two versions each, in a
group whose streams list a dozen more) is filtered on 0013's indexes instead, as one
condition. A branch costs an index descent when it finds nothing (measured in
bench/README.md, issue 29 "the route in the index")."""


@functools.lru_cache(maxsize=256)
def _probes_for(route: Route) -> _Probes:
    """The claim's probes for `route`, built once per route (a stream's route changes
    only when its group's streams do); SQLAlchemy caches their compiled form.

    A stream that takes any task reads 0013's indexes in age order. One that lists its
    workflows reads each of its keys (`route_keys`) on 0014's indexes, a branch of one
    UNION ALL per probe, each branch in the probe's order up to the limit: it never
    reads a task it cannot take. Past `MAX_ROUTE_KEYS` keys, the route is a filter on
    0013's probes."""
    s = TaskStatements
    keys = None if route.any_task else route_keys(route)
    if keys is None or len(keys) > MAX_ROUTE_KEYS:
        condition = route_condition(route)

        def probe(stmt: Any) -> Any:
            if condition is not None:
                stmt = stmt.where(condition)
            return stmt.limit(bindparam("limit")).with_for_update(skip_locked=True)

        return _Probes(
            _Probe(probe(s.ready_mine), "ix_tasks_ready_preferred"),
            _Probe(probe(s.ready_anyone), "ix_tasks_ready_anyone"),
            _Probe(probe(s.ready_promised), "ix_tasks_ready_promised"),
            _Probe(probe(s.due), "ix_tasks_backoff"),
        )

    def by_keys(stmt: Any, index: str, due: bool = False) -> _Probe:
        # Each key in the probe's order up to the limit, and of those the first up to
        # the limit in the same order: PostgreSQL merges them (and may stop locking
        # early), Python gets a batch. SQLite, which locks no rows, sends every key's
        # and Python merges: to merge them itself it sorted each key's rows in a
        # temporary b-tree of its own, which cost more than the claim (measured).
        branches = [
            select(
                stmt.where(key)
                .limit(bindparam("limit"))
                .with_for_update(skip_locked=True)
                .subquery(f"k{n}")
            )
            for n, key in enumerate(keys)
        ]
        every = union_all(*branches)
        if due:
            # SQLite: each key's due tasks as they are (those of the keys it runs, which
            # a claim takes), without a sort per key.
            every = union_all(*(stmt.where(key).order_by(None) for key in keys))
        merged = every.subquery("route")
        order = _due_order(merged.c) if due else (merged.c.create_time,)
        return _Probe(
            select(merged).order_by(*order).limit(bindparam("limit")), index, sqlite_stmt=every
        )

    c = tasks.c
    mine = route_key(c.preferred_worker_id) == bindparam("worker")
    anyone = route_none(c.preferred_worker_id)
    return _Probes(
        by_keys(s.ready.where(mine).order_by(c.create_time), "ix_tasks_route_ready"),
        by_keys(s.ready_anyone.where(anyone), "ix_tasks_route_ready"),
        by_keys(s.ready_promised, "ix_tasks_route_promised"),
        by_keys(s.due, "ix_tasks_route_backoff", due=True),
    )


def route_keys(route: Route) -> list[Any]:
    """SQL for `route.accepts(tasks.workflow, tasks.workflow_version)` (a route that
    lists its workflows) as disjoint keys of the route indexes (`route_key`), each a
    prefix of (version, workflow) or a range of workflows without a version: each
    (workflow, version) it runs, the unversioned tasks of each workflow whose newest
    version it runs and of none, and those of a workflow no stream lists (rule 4),
    the ranges between the names some stream does. (An empty version or workflow
    name is none, to routing as to these keys.)"""
    c = tasks.c
    version, workflow = route_key(c.workflow_version), route_key(c.workflow)
    keys = [
        and_(version == _text(v), workflow == _text(name))
        for name, v in sorted(route.accepted)
        if v
    ]
    unversioned = route_none(c.workflow_version)
    keys += [and_(unversioned, workflow == _text(name)) for name in sorted(route.unversioned)]
    keys.append(and_(unversioned, route_none(c.workflow)))
    bounds: list[str | None] = ["", *sorted(route.known - {""}), None]
    for low, high in itertools.pairwise(bounds):
        between = [unversioned, workflow > _text(low or "")]
        if high is not None:
            between.append(workflow < _text(high))
        keys.append(and_(*between))
    return keys


def _text(value: str) -> Any:
    """A name or version as a plain parameter of the statement compiled once."""
    return literal(value, tasks.c.workflow.type)


def route_condition(route: Route) -> Any:
    """SQL for `route.accepts(tasks.workflow, tasks.workflow_version)`, or None for any task."""
    if route.any_task:
        return None
    c = tasks.c
    by_name: dict[str, list[str]] = {}
    for name, version in sorted(route.accepted):
        by_name.setdefault(name, []).append(version)
    versioned = [
        and_(c.workflow == name, _among(c.workflow_version, versions))
        for name, versions in by_name.items()
    ]
    unversioned = and_(
        c.workflow_version.is_(None),
        or_(
            c.workflow.is_(None),
            _among(c.workflow, sorted(route.unversioned)),
            ~_among(c.workflow, sorted(route.known)),
        ),
    )
    return or_(*versioned, unversioned)


def _among(column: Any, values: Sequence[str]) -> Any:
    """`column IN (...)` with one plain parameter per value (not SQLAlchemy's expanding
    list, which a statement compiled once cannot carry); an empty list is false."""
    if not values:
        return false()
    return column.in_([literal(v, column.type) for v in values])
