"""The SQLAlchemy Core implementation of `Store`, with the SQLite dialect's settings.

Writes run on one dedicated connection (the group committer is the only
writer), reads on a small pool: in WAL mode readers never block the writer.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
import structlog
from sqlalchemy import (
    Connection,
    Engine,
    and_,
    bindparam,
    case,
    create_engine,
    event,
    false,
    func,
    or_,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, Dialect, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.pool import QueuePool, StaticPool

from troth_server.domain.promise import Payload, Promise, PromiseState
from troth_server.domain.routing import ANY, Route, workflow_name
from troth_server.domain.task import UNKNOWN_LEASE_MS, Callback, Task, TaskKind, TaskState
from troth_server.store import (
    CommitOutcomeUnknown,
    PromiseOrder,
    PromiseQuery,
    SearchRow,
    StoreError,
    StoreEvent,
    StoreUnavailable,
)
from troth_server.store._bind import MAX_BOUND_IDS, check_sqlite_variables, chunks
from troth_server.store._listen import Announcer
from troth_server.store._migrate import check_at_head, upgrade_to_head
from troth_server.store._tables import callbacks, promises, tasks

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping, Sequence

T = TypeVar("T")
log = structlog.get_logger("troth.store")

_SYNCHRONOUS = {"OFF", "NORMAL", "FULL", "EXTRA"}
_WRITE_ATTEMPTS = 5
_RECONNECT_DELAY = 0.05
_READ_ATTEMPTS = 2
# PostgreSQL SQLSTATEs after which the whole transaction can simply run again.
_SERIALIZATION_FAILURE = "40001"
_DEADLOCK_DETECTED = "40P01"
_select_by_id = select(promises).where(promises.c.id == bindparam("id"))
_select_expired = (
    select(promises.c.id)
    .where(promises.c.state == PromiseState.PENDING.value)
    .where(promises.c.expire_time <= bindparam("now"))
    .order_by(promises.c.expire_time)
    .limit(bindparam("limit"))
)
_select_expired_locked = _select_expired.with_for_update(skip_locked=True)
# The steps a settling workflow root ends (ix_promises_pending_parent).
_select_pending_steps = select(promises.c.id).where(
    promises.c.parent_id.in_(bindparam("parents", expanding=True)),
    promises.c.state == PromiseState.PENDING.value,
)
# A workflow's history (ix_promises_parent_seq).
_select_steps = (
    select(promises).where(promises.c.parent_id == bindparam("parent")).order_by(promises.c.seq)
)
# The database's clock in ms (PostgreSQL): the time a write transaction decides at.
_DATABASE_TIME = "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
_COLUMNS = [c.name for c in promises.c]
_INSERTED = [name for name in _COLUMNS if name != "seq"]
# Every column a promise may change after its insert: its settlement, and the
# rare rewrites (a settled-early promise adopted by its creator, a root's
# workflow version recorded). One statement for all: on both engines an UPDATE
# rewrites the row anyway, and large unchanged values are kept by reference.
_UPDATED = [name for name in _INSERTED if name not in ("id", "create_time", "expire_time")]


class _Compiled:
    """The write path's statements, compiled once for the dialect.

    Group commit runs them once per batch with every row of the batch, so per
    row only a tuple is built: no statement compilation or parameter processing.
    """

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect
        self.insert = self._compile(
            promises.insert().values({name: bindparam(name) for name in _INSERTED})
        )
        self.update = self._compile(
            promises.update()
            .where(promises.c.id == bindparam("b_id"))
            .values({name: bindparam(f"b_{name}") for name in _UPDATED})
        )
        self._select: dict[int, _Statement] = {}

    def select_by_ids(self, count: int) -> tuple[_Statement, int]:
        """The statement for `count` ids, and how many it takes (pad with repeats)."""
        # Padded to a power of two so that few variants are ever compiled.
        size = 1 << max(0, count - 1).bit_length()
        found = self._select.get(size)
        if found is None:
            # Locked in id order: replicas batching the same promises queue up
            # instead of deadlocking (SQLite, with one writer, renders no FOR UPDATE).
            stmt = (
                select(promises)
                .where(promises.c.id.in_([bindparam(f"id{i}") for i in range(size)]))
                .order_by(promises.c.id)
                .with_for_update()
            )
            found = self._select[size] = self._compile(stmt)
        return found, size

    def _compile(self, stmt: Any) -> _Statement:
        compiled = stmt.compile(dialect=self._dialect)
        order = tuple(compiled.positiontup) if compiled.positional else None
        return _Statement(str(compiled), order)


@dataclass(frozen=True, slots=True)
class _Statement:
    sql: str
    order: tuple[str, ...] | None
    """Parameter names in placeholder order, for positional paramstyles."""

    def params(self, values: dict[str, Any]) -> Any:
        return values if self.order is None else tuple(values[name] for name in self.order)


class _TaskStatements:
    """Task and callback statements: Core, executed as they are (not on the promise hot path)."""

    # Rows a write transaction reads it also locks (FOR UPDATE on PostgreSQL), so a
    # second replica's transaction waits and then sees the first one's outcome.
    # Candidates for a claim or a sweep are taken with SKIP LOCKED: replicas
    # share the work instead of queueing for the same rows.
    peek = select(tasks).where(tasks.c.id.in_(bindparam("ids", expanding=True)))
    get = peek.order_by(tasks.c.id).with_for_update()
    active = (
        select(tasks)
        .where(
            tasks.c.root_promise_id.in_(bindparam("roots", expanding=True)),
            tasks.c.state.in_([TaskState.PENDING.value, TaskState.CLAIMED.value]),
        )
        .order_by(tasks.c.id)
        .with_for_update()
    )
    pending = (
        select(tasks)
        .where(tasks.c.group == bindparam("group"), tasks.c.state == TaskState.PENDING.value)
        .order_by(
            # This worker's resumes first, then tasks nobody is preferred for, and
            # last those waiting for another worker that may still hold the generator.
            case(
                (tasks.c.preferred_worker_id == bindparam("worker"), 0),
                (tasks.c.preferred_worker_id.is_(None), 1),
                else_=2,
            ),
            tasks.c.create_time,
        )
        .limit(bindparam("limit"))
        .with_for_update(skip_locked=True)
    )
    claimed_peek = select(tasks).where(
        tasks.c.worker_id == bindparam("worker"), tasks.c.state == TaskState.CLAIMED.value
    )
    claimed = claimed_peek.order_by(tasks.c.id).with_for_update()
    lease_expired = (
        select(tasks)
        .where(
            tasks.c.state == TaskState.CLAIMED.value,
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
        )
    )
    # A root's workflow and version, for the RESUME tasks its callbacks create.
    # Unlocked: both are written once (the version when the root's first task
    # was claimed, which happened before any callback of it was registered).
    root_workflows = select(promises.c.id, promises.c.tags, promises.c.workflow_version).where(
        promises.c.id.in_(bindparam("ids", expanding=True))
    )
    # SearchTasks: PENDING by the group's partial index, CLAIMED by theirs (few).
    search_pending = (
        select(tasks)
        .where(tasks.c.group == bindparam("group"), tasks.c.state == TaskState.PENDING.value)
        .order_by(tasks.c.create_time, tasks.c.id)
        .limit(bindparam("limit"))
    )
    search_claimed = (
        select(tasks)
        .where(tasks.c.state == TaskState.CLAIMED.value, tasks.c.group == bindparam("group"))
        .order_by(tasks.c.create_time, tasks.c.id)
        .limit(bindparam("limit"))
    )
    get_callbacks = select(callbacks).where(
        callbacks.c.promise_id.in_(bindparam("ids", expanding=True))
    )
    delete_callbacks = callbacks.delete().where(
        or_(
            callbacks.c.promise_id.in_(bindparam("ids", expanding=True)),
            callbacks.c.root_promise_id.in_(bindparam("roots", expanding=True)),
        )
    )


class _TaskTx:
    """The task half of a write transaction (mixed into `_WriteTx`)."""

    _conn: Connection

    def get_callbacks(self, promise_ids: Collection[str]) -> list[Callback]:
        if not promise_ids:
            return []
        return [
            Callback(r.promise_id, r.root_promise_id, r.group, r.worker_id)
            for part in chunks(sorted(promise_ids))
            for r in self._conn.execute(_TaskStatements.get_callbacks, {"ids": list(part)})
        ]

    def insert_callbacks(self, items: Sequence[Callback], now: int) -> None:
        if not items:
            return
        insert = sqlite_insert if self._conn.dialect.name == "sqlite" else postgresql_insert
        stmt = insert(callbacks).on_conflict_do_nothing()
        self._conn.execute(
            stmt,
            [
                {
                    "promise_id": c.promise_id,
                    "root_promise_id": c.root_promise_id,
                    "group": c.group,
                    "worker_id": c.worker_id,
                    "create_time": now,
                }
                for c in items
            ],
        )

    def delete_callbacks(self, promise_ids: Collection[str], root_ids: Collection[str]) -> None:
        stmt = _TaskStatements.delete_callbacks
        if len(promise_ids) + len(root_ids) <= MAX_BOUND_IDS:
            if promise_ids or root_ids:
                self._conn.execute(stmt, {"ids": list(promise_ids), "roots": list(root_ids)})
            return
        for part in chunks(sorted(promise_ids)):
            self._conn.execute(stmt, {"ids": list(part), "roots": []})
        for part in chunks(sorted(root_ids)):
            self._conn.execute(stmt, {"ids": [], "roots": list(part)})

    def get_tasks(self, task_ids: Collection[str], *, lock: bool = True) -> dict[str, Task]:
        if not task_ids:
            return {}
        stmt = _TaskStatements.get if lock else _TaskStatements.peek
        return {
            row["id"]: _to_task(row)
            for part in chunks(sorted(task_ids))
            for row in self._conn.execute(stmt, {"ids": list(part)}).mappings()
        }

    def get_active_tasks(self, root_ids: Collection[str]) -> dict[str, Task]:
        if not root_ids:
            return {}
        return {
            row["root_promise_id"]: _to_task(row)
            for part in chunks(sorted(root_ids))
            for row in self._conn.execute(_TaskStatements.active, {"roots": list(part)}).mappings()
        }

    def pending_tasks(
        self, group: str, prefer_worker: str, limit: int, route: Route = ANY
    ) -> list[Task]:
        params = {"group": group, "worker": prefer_worker, "limit": limit}
        stmt = _TaskStatements.pending
        condition = route_condition(route)
        if condition is not None:
            stmt = stmt.where(condition)
        return [_to_task(r) for r in self._conn.execute(stmt, params).mappings()]

    def root_workflows(self, root_ids: Collection[str]) -> dict[str, tuple[str | None, str | None]]:
        if not root_ids:
            return {}
        stmt = _TaskStatements.root_workflows
        return {
            row[0]: (workflow_name(_load_json(row[1])), row[2] or None)
            for part in chunks(sorted(root_ids))
            for row in self._conn.execute(stmt, {"ids": list(part)})
        }

    def claimed_tasks(self, worker_id: str, *, lock: bool = True) -> list[Task]:
        stmt = _TaskStatements.claimed if lock else _TaskStatements.claimed_peek
        rows = self._conn.execute(stmt, {"worker": worker_id}).mappings()
        return [_to_task(r) for r in rows]

    def lease_expired_tasks(
        self, now: int, limit: int, back_since: int | None = None
    ) -> list[Task]:
        since_back = now if back_since is None else now - back_since
        params = {"now": now, "limit": limit, "since_back": since_back}
        rows = self._conn.execute(_TaskStatements.lease_expired, params).mappings()
        return [_to_task(r) for r in rows]

    def insert_tasks(self, items: Sequence[Task], now: int) -> None:
        if items:
            self._conn.execute(
                tasks.insert(),
                [
                    {
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
                    }
                    for t in items
                ],
            )

    def update_tasks(self, items: Sequence[Task]) -> None:
        if items:
            self._conn.execute(
                _TaskStatements.update,
                [
                    {
                        "b_id": t.id,
                        "b_state": t.state.value,
                        "b_counter": t.counter,
                        "b_worker_id": t.worker_id,
                        "b_lease_expire_time": t.lease_expire_time,
                        "b_lease_ms": t.lease_ms,
                        "b_preferred_worker_id": t.preferred_worker_id,
                        "b_resume_pending": t.resume_pending,
                        "b_workflow_version": t.workflow_version,
                    }
                    for t in items
                ],
            )


def _to_task(row: Any) -> Task:
    return Task(
        id=row["id"],
        root_promise_id=row["root_promise_id"],
        group=row["group"],
        kind=TaskKind(row["kind"]),
        state=TaskState(row["state"]),
        counter=row["counter"],
        worker_id=row["worker_id"],
        lease_expire_time=row["lease_expire_time"],
        lease_ms=row["lease_ms"],
        preferred_worker_id=row["preferred_worker_id"],
        resume_pending=bool(row["resume_pending"]),
        workflow=row["workflow"],
        workflow_version=row["workflow_version"],
        create_time=row["create_time"],
    )


def route_condition(route: Route) -> Any:
    """SQL for `route.accepts(tasks.workflow, tasks.workflow_version)`, or None for any task."""
    if route.any_task:
        return None
    c = tasks.c
    by_name: dict[str, list[str]] = {}
    for name, version in sorted(route.accepted):
        by_name.setdefault(name, []).append(version)
    versioned = [
        and_(c.workflow == name, c.workflow_version.in_(versions))
        for name, versions in by_name.items()
    ]
    unversioned = and_(
        c.workflow_version.is_(None),
        or_(
            c.workflow.is_(None),
            c.workflow.in_(sorted(route.unversioned)),
            c.workflow.not_in(sorted(route.known)),
        ),
    )
    return or_(*versioned, unversioned)


class _WriteTx(_TaskTx):
    def __init__(self, conn: Connection, compiled: _Compiled, announcer: Announcer | None) -> None:
        self._conn = conn
        self._compiled = compiled
        self._announcer = announcer
        # SQLite has one writer at a time and renders no FOR UPDATE.
        self.row_locks = conn.dialect.name == "postgresql"

    def announce(
        self,
        groups: Collection[str],
        settled_ids: Collection[str],
        created_ids: Collection[str] = (),
    ) -> None:
        if self._announcer is not None and (groups or settled_ids or created_ids):
            self._announcer.announce(self._conn, groups, settled_ids, created_ids)

    def database_time(self) -> int | None:
        if not self.row_locks:
            return None  # SQLite keeps no clock of its own: the server's decides
        return int(self._conn.exec_driver_sql(_DATABASE_TIME).scalar_one())

    def expired_promise_ids(self, now: int, limit: int) -> list[str]:
        params = {"now": now, "limit": limit}
        return list(self._conn.execute(_select_expired_locked, params).scalars())

    def pending_step_ids(self, parent_ids: Collection[str]) -> list[str]:
        if not parent_ids:
            return []
        return [
            step_id
            for part in chunks(sorted(parent_ids))
            for step_id in self._conn.execute(
                _select_pending_steps, {"parents": list(part)}
            ).scalars()
        ]

    def get_promises(self, ids: Collection[str]) -> dict[str, Promise]:
        if not ids:
            return {}
        found: dict[str, Promise] = {}
        for wanted in chunks(sorted(ids) if len(ids) > MAX_BOUND_IDS else list(ids)):
            stmt, size = self._compiled.select_by_ids(len(wanted))
            padded = [*wanted, *[wanted[-1]] * (size - len(wanted))]
            values = {f"id{i}": promise_id for i, promise_id in enumerate(padded)}
            rows = self._conn.exec_driver_sql(stmt.sql, stmt.params(values)).fetchall()
            found.update((row[1], _to_promise(row)) for row in rows)
        return found

    def insert_promises(self, items: Sequence[Promise]) -> None:
        if items:
            stmt = self._compiled.insert
            self._conn.exec_driver_sql(stmt.sql, [stmt.params(_to_row(p)) for p in items])

    def update_promises(self, items: Sequence[Promise]) -> None:
        if items:
            stmt = self._compiled.update
            rows = [{f"b_{name}": value for name, value in _to_row(p).items()} for p in items]
            self._conn.exec_driver_sql(stmt.sql, [stmt.params(row) for row in rows])


class SqlStore:
    def __init__(
        self, write_engine: Engine, read_engine: Engine, announcer: Announcer | None = None
    ) -> None:
        self._write_engine = write_engine
        self._read_engine = read_engine
        self._announcer = announcer
        self._write_lock = threading.Lock()
        self._compiled = _Compiled(write_engine.dialect)

    @property
    def shared(self) -> bool:
        return self._announcer is not None

    def listen(self, on_event: Callable[[StoreEvent], None]) -> None:
        if self._announcer is not None:
            self._announcer.listen(on_event)

    def write(self, work: Callable[[_WriteTx], T]) -> T:
        attempt = 0
        while True:
            attempt += 1
            committing = False
            try:
                with self._write_lock, self._write_engine.connect() as conn:
                    with conn.begin() as tx:
                        result = work(_WriteTx(conn, self._compiled, self._announcer))
                        committing = True
                        tx.commit()
                    return result
            except DBAPIError as exc:
                retry = _retryable(exc, committing)
                if retry is None or attempt >= _WRITE_ATTEMPTS:
                    if isinstance(exc, IntegrityError):
                        raise StoreError(f"write conflict persisted: {exc.orig}") from exc
                    if committing and exc.connection_invalidated:
                        raise CommitOutcomeUnknown(
                            f"the connection was lost while committing: {exc.orig}"
                        ) from exc
                    raise StoreUnavailable(f"database write failed: {exc.orig}") from exc
                log.info("store.write_retry", reason=retry, attempt=attempt)
                if retry == "disconnected":
                    time.sleep(_RECONNECT_DELAY * attempt)
            except SQLAlchemyError as exc:
                raise StoreUnavailable(f"database write failed: {exc}") from exc

    def database_time(self) -> int | None:
        if self._read_engine.dialect.name != "postgresql":
            return None
        return int(self._read(lambda conn: conn.exec_driver_sql(_DATABASE_TIME).scalar_one()))

    def newest_time(self) -> int:
        def read(conn: Connection) -> list[Any]:
            return [
                conn.execute(select(func.max(promises.c.create_time))).scalar(),
                conn.execute(select(func.max(promises.c.settle_time))).scalar(),
                conn.execute(select(func.max(tasks.c.create_time))).scalar(),
                conn.execute(select(func.max(callbacks.c.create_time))).scalar(),
                conn.execute(
                    select(func.max(tasks.c.lease_expire_time - tasks.c.lease_ms)).where(
                        tasks.c.state == TaskState.CLAIMED.value
                    )
                ).scalar(),
            ]

        return max((t for t in self._read(read) if t is not None), default=0)

    def get_promise(self, promise_id: str) -> Promise | None:
        row = self._read(lambda conn: conn.execute(_select_by_id, {"id": promise_id}).first())
        return None if row is None else _to_promise(row)

    def search_promises(self, query: PromiseQuery, now: int) -> list[SearchRow]:
        if query.order is PromiseOrder.EXPIRE_TIME_ASC:
            return self._search_by_expire_time(query, now)
        cursor = [_after_cursor(query)] if query.after_seq else []
        return self._search(query, now, cursor, query.limit)

    def _search_by_expire_time(self, query: PromiseQuery, now: int) -> list[SearchRow]:
        # Two range scans instead of one OR: the rows that expire (from the
        # cursor's expire_time on, which the index on expire_time can start at,
        # however deep the page), then the never-expiring ones (NULLS LAST).
        c = promises.c
        found: list[SearchRow] = []
        after_null = query.after_seq and query.after_expire_time is None
        if not after_null:
            if query.after_seq:
                e = query.after_expire_time
                cursor = [c.expire_time >= e, or_(c.expire_time > e, c.seq > query.after_seq)]
            else:
                cursor = [c.expire_time.is_not(None)]
            found = self._search(query, now, cursor, query.limit)
        if len(found) < query.limit:
            cursor = [c.expire_time.is_(None)]
            if after_null:
                cursor.append(c.seq > query.after_seq)
            found += self._search(query, now, cursor, query.limit - len(found))
        return found

    def _search(
        self, query: PromiseQuery, now: int, cursor: list[Any], limit: int
    ) -> list[SearchRow]:
        conditions: list[Any] = list(cursor)
        if query.id_glob not in ("", "*"):
            conditions.append(promises.c.id.like(_glob_to_like(query.id_glob), escape="\\"))
        if query.states:
            conditions.append(or_(*(_state_condition(s, now) for s in query.states)))
        if query.tags:
            conditions.append(self._has_tags(query.tags))
        if query.created_before is not None:
            conditions.append(promises.c.create_time < query.created_before)
        stmt = select(promises).where(*conditions).order_by(*_ORDER[query.order])
        stmt = stmt.limit(limit)
        rows = self._read(lambda conn: conn.execute(stmt).all())
        return [SearchRow(seq=row[0], promise=_to_promise(row)) for row in rows]

    def expired_promise_ids(self, now: int, limit: int) -> list[str]:
        params = {"now": now, "limit": limit}
        return self._read(lambda conn: list(conn.execute(_select_expired, params).scalars()))

    def promise_tree(self, root_id: str) -> tuple[Promise | None, list[Promise]]:
        # By record (parent_id), never by id prefix: `<root>.x` may be anyone's.
        def read(conn: Connection) -> tuple[Any, list[Any]]:
            root = conn.execute(_select_by_id, {"id": root_id}).first()
            return root, list(conn.execute(_select_steps, {"parent": root_id}))

        root, rows = self._read(read)
        return (None if root is None else _to_promise(root)), [_to_promise(r) for r in rows]

    def get_promises(self, ids: Collection[str]) -> list[Promise]:
        if not ids:
            return []
        stmt = select(promises).where(promises.c.id.in_(bindparam("ids", expanding=True)))
        wanted = sorted(ids)

        def read(conn: Connection) -> list[Any]:
            return [row for part in chunks(wanted) for row in conn.execute(stmt, {"ids": part})]

        return [_to_promise(row) for row in self._read(read)]

    def search_tasks(self, group: str, limit: int) -> list[Task]:
        params = {"group": group, "limit": limit}

        def read(conn: Connection) -> list[Any]:
            pending = conn.execute(_TaskStatements.search_pending, params).mappings().all()
            claimed = conn.execute(_TaskStatements.search_claimed, params).mappings().all()
            return [*pending, *claimed]

        found = [_to_task(row) for row in self._read(read)]
        found.sort(key=lambda t: (t.create_time or 0, t.id))
        return found[:limit]

    def claimed_task_ids(self, worker_ids: Collection[str]) -> set[tuple[str, str]]:
        if not worker_ids:
            return set()
        stmt = select(tasks.c.worker_id, tasks.c.id).where(
            tasks.c.state == TaskState.CLAIMED.value,
            tasks.c.worker_id.in_(bindparam("workers", expanding=True)),
        )
        wanted = sorted(worker_ids)

        def read(conn: Connection) -> list[Any]:
            return [row for part in chunks(wanted) for row in conn.execute(stmt, {"workers": part})]

        return {(row[0], row[1]) for row in self._read(read)}

    def close(self) -> None:
        if self._announcer is not None:
            self._announcer.close()
        self._write_engine.dispose()
        self._read_engine.dispose()

    def _has_tags(self, tags: Mapping[str, str]) -> Any:
        if self._read_engine.dialect.name == "postgresql":
            # JSONB containment: one condition for every tag, and GIN-indexable.
            return promises.c.tags.op("@>")(bindparam("tags", dict(tags), type_=JSONB))
        # json_each rather than a JSON path: a path cannot quote every possible key.
        conditions = []
        for key, value in sorted(tags.items()):
            each = func.json_each(promises.c.tags).table_valued("key", "value")
            conditions.append(
                select(each.c.key).where(each.c.key == key, each.c.value == value).exists()
            )
        return and_(*conditions)

    def _read(self, read: Callable[[Connection], T]) -> T:
        attempt = 0
        while True:
            attempt += 1
            try:
                with self._read_engine.connect() as conn:
                    return read(conn)
            except DBAPIError as exc:
                # A connection the database dropped (a restart): the pool has
                # discarded it, and a read can always run again.
                if not exc.connection_invalidated or attempt >= _READ_ATTEMPTS:
                    raise StoreUnavailable(f"database read failed: {exc.orig}") from exc


def _retryable(exc: DBAPIError, committing: bool) -> str | None:
    """Why a failed write transaction may run again, or None when it may not.

    Nothing of it was committed in each of these cases: the fold runs again on
    what the database holds now. A connection lost during COMMIT is the
    exception: the commit may have happened, so the caller must be told.
    """
    if isinstance(exc, IntegrityError):
        # Only another writer on the same database (a second replica) can make an
        # insert conflict; the retry reads its row.
        return "conflict"
    code = getattr(exc.orig, "sqlstate", None)
    if code in (_SERIALIZATION_FAILURE, _DEADLOCK_DETECTED):
        return "serialization" if code == _SERIALIZATION_FAILURE else "deadlock"
    if exc.connection_invalidated and not committing:
        return "disconnected"
    return None


# Keyset orders: each ends in `seq`, so that a cursor names one position.
# NULLS LAST (never-expiring rows) is PostgreSQL's default for ASC, so its
# partial index on pending expire_time serves the EXPIRE_TIME_ASC inbox.
_ORDER: dict[PromiseOrder, tuple[Any, ...]] = {
    PromiseOrder.CREATED_ASC: (promises.c.seq,),
    PromiseOrder.CREATED_DESC: (promises.c.seq.desc(),),
    PromiseOrder.EXPIRE_TIME_ASC: (promises.c.expire_time.asc().nulls_last(), promises.c.seq),
}


def _after_cursor(query: PromiseQuery) -> Any:
    """SQL for "comes after the cursor row in the query's order"."""
    c = promises.c
    if query.order is PromiseOrder.CREATED_ASC:
        return c.seq > query.after_seq
    assert query.order is PromiseOrder.CREATED_DESC, "EXPIRE_TIME_ASC pages by two scans"
    return c.seq < query.after_seq


def _state_condition(state: PromiseState, now: int) -> Any:
    """SQL for "a reader at `now` sees this state" (an expired PENDING row is settled)."""
    c = promises.c
    expired = and_(
        c.state == PromiseState.PENDING.value,
        c.expire_time.is_not(None),
        c.expire_time <= now,
    )
    if state is PromiseState.PENDING:
        return and_(
            c.state == PromiseState.PENDING.value,
            or_(c.expire_time.is_(None), c.expire_time > now),
        )
    if state is PromiseState.RESOLVED:
        return or_(c.state == state.value, and_(expired, c.timer == true()))
    if state is PromiseState.REJECTED_TIMEDOUT:
        return or_(c.state == state.value, and_(expired, c.timer == false()))
    return c.state == state.value


def _glob_to_like(glob: str) -> str:
    escaped = glob.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped.replace("*", "%")


def _to_row(p: Promise) -> dict[str, Any]:
    return {
        "id": p.id,
        "state": p.state.value,
        "param_headers": _dump_json(p.param.headers),
        "param_data": p.param.data,
        "value_headers": _dump_json(p.value.headers),
        "value_data": p.value.data,
        "tags": _dump_json(p.tags),
        "timer": p.is_timer,
        "create_time": p.create_time,
        "settle_time": p.settle_time,
        "expire_time": p.expire_time,
        "idempotency_key_for_create": p.idempotency_key_for_create,
        "idempotency_key_for_settle": p.idempotency_key_for_settle,
        "settled_by": p.settled_by,
        "schema": p.schema,
        "title": p.title,
        "message": p.message,
        "requested_by": p.requested_by,
        "workflow_version": p.workflow_version,
        "root_id": p.root_id,
        "parent_id": p.parent_id,
    }


def _dump_json(value: Mapping[str, str]) -> str:
    return orjson.dumps(value).decode() if value else "{}"


def _load_json(value: Any) -> dict[str, str]:
    # TEXT on SQLite; a driver may hand JSON columns over already decoded.
    if isinstance(value, str | bytes):
        return orjson.loads(value) if value != "{}" else {}
    return dict(value)


# Rows in `promises.c` order, whether from a Core select or from the compiled
# statements: seq, id, state, param_headers, param_data, value_headers,
# value_data, tags, timer, create_time, settle_time, expire_time,
# idempotency_key_for_create, idempotency_key_for_settle, settled_by, schema,
# title, message, requested_by, workflow_version, root_id, parent_id.
def _to_promise(row: Sequence[Any]) -> Promise:
    return Promise(
        id=row[1],
        state=PromiseState(row[2]),
        param=Payload(_load_json(row[3]), bytes(row[4])),
        value=Payload(_load_json(row[5]), bytes(row[6])),
        tags=_load_json(row[7]),
        create_time=row[9],
        settle_time=row[10],
        expire_time=row[11],
        idempotency_key_for_create=row[12],
        idempotency_key_for_settle=row[13],
        settled_by=row[14],
        schema=row[15],
        title=row[16],
        message=row[17],
        requested_by=row[18],
        workflow_version=row[19],
        root_id=row[20],
        parent_id=row[21],
    )


def open_sql_store(
    url: str,
    *,
    sqlite_synchronous: str,
    read_pool_size: int,
    migrate: bool,
    application_name: str,
) -> SqlStore:
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        write_engine, read_engine = _sqlite_engines(parsed, sqlite_synchronous, read_pool_size)
        # The embedded default migrates itself: there is no one else to run it.
        migrate = True
    elif backend == "postgresql":
        write_engine, read_engine = _postgresql_engines(parsed, read_pool_size, application_name)
    else:
        raise StoreError(
            f"unsupported database URL {parsed.render_as_string(hide_password=True)!r}: "
            "use sqlite:///PATH or postgresql+psycopg://USER@HOST:PORT/DATABASE"
        )
    announcer: Announcer | None = None
    try:
        with write_engine.begin() as conn:
            if migrate:
                upgrade_to_head(conn)
            else:
                check_at_head(conn, url)
            if backend == "postgresql":
                announcer = _announcer(conn, parsed)
    except BaseException as exc:
        write_engine.dispose()
        read_engine.dispose()
        if isinstance(exc, DBAPIError):
            where = parsed.render_as_string(hide_password=True)
            raise StoreUnavailable(f"cannot open {where}: {exc.orig}") from exc
        raise
    return SqlStore(write_engine, read_engine, announcer)


def _sqlite_engines(parsed: URL, sqlite_synchronous: str, pool_size: int) -> tuple[Engine, Engine]:
    if not parsed.database or parsed.database == ":memory:":
        raise StoreError(
            "an in-memory SQLite database would lose every promise on restart; "
            "give a file path: sqlite:///troth.db"
        )
    synchronous = sqlite_synchronous.upper()
    if synchronous not in _SYNCHRONOUS:
        raise StoreError(
            f"sqlite synchronous must be one of {sorted(_SYNCHRONOUS)}, not {sqlite_synchronous!r}"
        )
    Path(parsed.database).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
    plain = parsed.set(drivername="sqlite+pysqlite")
    write_engine = create_engine(
        plain,
        poolclass=StaticPool,
        connect_args={"check_same_thread": False},
    )
    read_engine = create_engine(
        plain,
        poolclass=QueuePool,
        pool_size=pool_size,
        max_overflow=pool_size,
        connect_args={"check_same_thread": False},
    )
    _configure_sqlite(write_engine, synchronous, begin="BEGIN IMMEDIATE")
    _configure_sqlite(read_engine, synchronous, begin="BEGIN")
    return write_engine, read_engine


def _postgresql_engines(
    parsed: URL, pool_size: int, application_name: str
) -> tuple[Engine, Engine]:
    if parsed.drivername not in ("postgresql", "postgresql+psycopg"):
        raise StoreError(
            f"PostgreSQL is reached through psycopg 3: write postgresql+psycopg://..., "
            f"not {parsed.drivername}://..."
        )
    plain = parsed.set(drivername="postgresql+psycopg")
    connect_args = {"connect_timeout": 5, "application_name": application_name}
    # One connection writes (the group committer is this replica's only writer);
    # a pool reads. Pre-ping: after a database restart, a stale pooled
    # connection is replaced at checkout instead of failing a request.
    write_engine = create_engine(
        plain, pool_size=1, max_overflow=0, pool_pre_ping=True, connect_args=connect_args
    )
    read_engine = create_engine(
        plain,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        connect_args=connect_args,
    )

    @event.listens_for(write_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Every write statement is an index lookup by design. Without this, a young
        # table that grew faster than autovacuum analyzes it is planned as if it
        # were tiny, and each batch's id lookup became a sequential scan (measured:
        # 30 ms instead of 0.3 ms at 60k rows, which halved throughput).
        dbapi_conn.execute("SET enable_seqscan = off")
        dbapi_conn.commit()

    return write_engine, read_engine


def _announcer(conn: Connection, parsed: URL) -> Announcer:
    # Channels are per database, not per schema: two deployments sharing a
    # database in different schemas must not wake each other.
    schema = conn.exec_driver_sql("SELECT current_schema()").scalar_one()
    channel = "troth" if schema == "public" else f"troth_{schema}"[:63]
    conninfo = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
    return Announcer(conninfo, channel)


def _configure_sqlite(engine: Engine, synchronous: str, *, begin: str) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Autocommit at the driver level, so that BEGIN below is ours: writers
        # take the write lock up front (IMMEDIATE) instead of failing to upgrade.
        dbapi_conn.isolation_level = None
        check_sqlite_variables(dbapi_conn)
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.execute("PRAGMA busy_timeout=5000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA case_sensitive_like=ON")  # ids are case-sensitive, as on PG
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql(begin)
