"""The SQLAlchemy Core implementation of `Store`, with the SQLite dialect's settings.

Writes run on one dedicated connection (the group committer is the only
writer), reads on a small pool: in WAL mode readers never block the writer.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
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
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Dialect, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.pool import QueuePool, StaticPool

from troth_server.domain.promise import Payload, Promise, PromiseState
from troth_server.domain.task import Callback, Task, TaskKind, TaskState
from troth_server.store import PromiseQuery, SearchRow, StoreError, StoreUnavailable
from troth_server.store._migrate import upgrade_to_head
from troth_server.store._tables import callbacks, promises, tasks

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterator, Mapping, Sequence

T = TypeVar("T")
log = structlog.get_logger("troth.store")

_SYNCHRONOUS = {"OFF", "NORMAL", "FULL", "EXTRA"}
_WRITE_ATTEMPTS = 3

_select_by_id = select(promises).where(promises.c.id == bindparam("id"))
_select_expired = (
    select(promises.c.id)
    .where(promises.c.state == PromiseState.PENDING.value)
    .where(promises.c.expire_time <= bindparam("now"))
    .order_by(promises.c.expire_time)
    .limit(bindparam("limit"))
)
_COLUMNS = [c.name for c in promises.c]
_INSERTED = [name for name in _COLUMNS if name != "seq"]
_SETTLE_FIELDS = [
    "state",
    "value_headers",
    "value_data",
    "settle_time",
    "idempotency_key_for_settle",
    "settled_by",
]


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
            .values({name: bindparam(f"b_{name}") for name in _SETTLE_FIELDS})
        )
        self._select: dict[int, _Statement] = {}

    def select_by_ids(self, count: int) -> tuple[_Statement, int]:
        """The statement for `count` ids, and how many it takes (pad with repeats)."""
        # Padded to a power of two so that few variants are ever compiled.
        size = 1 << max(0, count - 1).bit_length()
        found = self._select.get(size)
        if found is None:
            stmt = select(promises).where(
                promises.c.id.in_([bindparam(f"id{i}") for i in range(size)])
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

    get = select(tasks).where(tasks.c.id.in_(bindparam("ids", expanding=True)))
    active = select(tasks).where(
        tasks.c.root_promise_id.in_(bindparam("roots", expanding=True)),
        tasks.c.state.in_([TaskState.PENDING.value, TaskState.CLAIMED.value]),
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
    )
    claimed = select(tasks).where(
        tasks.c.worker_id == bindparam("worker"), tasks.c.state == TaskState.CLAIMED.value
    )
    lease_expired = (
        select(tasks)
        .where(
            tasks.c.state == TaskState.CLAIMED.value,
            tasks.c.lease_expire_time <= bindparam("now"),
        )
        .order_by(tasks.c.lease_expire_time)
        .limit(bindparam("limit"))
    )
    update = (
        tasks.update()
        .where(tasks.c.id == bindparam("b_id"))
        .values(
            state=bindparam("b_state"),
            counter=bindparam("b_counter"),
            worker_id=bindparam("b_worker_id"),
            lease_expire_time=bindparam("b_lease_expire_time"),
            preferred_worker_id=bindparam("b_preferred_worker_id"),
            resume_pending=bindparam("b_resume_pending"),
        )
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
        rows = self._conn.execute(_TaskStatements.get_callbacks, {"ids": list(promise_ids)})
        return [Callback(r.promise_id, r.root_promise_id, r.group, r.worker_id) for r in rows]

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
        if promise_ids or root_ids:
            self._conn.execute(
                _TaskStatements.delete_callbacks,
                {"ids": list(promise_ids), "roots": list(root_ids)},
            )

    def get_tasks(self, task_ids: Collection[str]) -> dict[str, Task]:
        if not task_ids:
            return {}
        rows = self._conn.execute(_TaskStatements.get, {"ids": list(task_ids)}).mappings()
        return {row["id"]: _to_task(row) for row in rows}

    def get_active_tasks(self, root_ids: Collection[str]) -> dict[str, Task]:
        if not root_ids:
            return {}
        rows = self._conn.execute(_TaskStatements.active, {"roots": list(root_ids)}).mappings()
        return {row["root_promise_id"]: _to_task(row) for row in rows}

    def pending_tasks(self, group: str, prefer_worker: str, limit: int) -> list[Task]:
        params = {"group": group, "worker": prefer_worker, "limit": limit}
        return [_to_task(r) for r in self._conn.execute(_TaskStatements.pending, params).mappings()]

    def claimed_tasks(self, worker_id: str) -> list[Task]:
        rows = self._conn.execute(_TaskStatements.claimed, {"worker": worker_id}).mappings()
        return [_to_task(r) for r in rows]

    def lease_expired_tasks(self, now: int, limit: int) -> list[Task]:
        params = {"now": now, "limit": limit}
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
                        "preferred_worker_id": t.preferred_worker_id,
                        "resume_pending": t.resume_pending,
                        "create_time": now,
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
                        "b_preferred_worker_id": t.preferred_worker_id,
                        "b_resume_pending": t.resume_pending,
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
        preferred_worker_id=row["preferred_worker_id"],
        resume_pending=bool(row["resume_pending"]),
    )


class _WriteTx(_TaskTx):
    def __init__(self, conn: Connection, compiled: _Compiled) -> None:
        self._conn = conn
        self._compiled = compiled

    def pending_descendant_ids(self, root_id: str) -> list[str]:
        stmt = select(promises.c.id).where(
            promises.c.id >= root_id + ".",
            promises.c.id < root_id + "/",
            promises.c.state == PromiseState.PENDING.value,
        )
        return list(self._conn.execute(stmt).scalars())

    def get_promises(self, ids: Collection[str]) -> dict[str, Promise]:
        if not ids:
            return {}
        wanted = list(ids)
        stmt, size = self._compiled.select_by_ids(len(wanted))
        padded = wanted + [wanted[-1]] * (size - len(wanted))
        values = {f"id{i}": promise_id for i, promise_id in enumerate(padded)}
        rows = self._conn.exec_driver_sql(stmt.sql, stmt.params(values)).fetchall()
        return {row[1]: _to_promise(row) for row in rows}

    def insert_promises(self, items: Sequence[Promise]) -> None:
        if items:
            stmt = self._compiled.insert
            self._conn.exec_driver_sql(stmt.sql, [stmt.params(_to_row(p)) for p in items])

    def update_promises(self, items: Sequence[Promise]) -> None:
        if items:
            stmt = self._compiled.update
            rows = [
                {
                    "b_id": p.id,
                    "b_state": p.state.value,
                    "b_value_headers": _dump_json(p.value.headers),
                    "b_value_data": p.value.data,
                    "b_settle_time": p.settle_time,
                    "b_idempotency_key_for_settle": p.idempotency_key_for_settle,
                    "b_settled_by": p.settled_by,
                }
                for p in items
            ]
            self._conn.exec_driver_sql(stmt.sql, [stmt.params(row) for row in rows])


class SqlStore:
    def __init__(self, write_engine: Engine, read_engine: Engine) -> None:
        self._write_engine = write_engine
        self._read_engine = read_engine
        self._write_lock = threading.Lock()
        self._compiled = _Compiled(write_engine.dialect)

    def write(self, work: Callable[[_WriteTx], T]) -> T:
        attempt = 0
        while True:
            attempt += 1
            try:
                with self._write_lock, self._write_engine.begin() as conn:
                    return work(_WriteTx(conn, self._compiled))
            except IntegrityError as exc:
                # Only another writer on the same database (a second replica)
                # can make an insert conflict; the retry reads its row.
                if attempt >= _WRITE_ATTEMPTS:
                    raise StoreError(f"write conflict persisted: {exc.orig}") from exc
            except DBAPIError as exc:
                raise StoreUnavailable(f"database write failed: {exc.orig}") from exc
            except SQLAlchemyError as exc:
                raise StoreUnavailable(f"database write failed: {exc}") from exc

    def get_promise(self, promise_id: str) -> Promise | None:
        with self._read() as conn:
            row = conn.execute(_select_by_id, {"id": promise_id}).first()
        return None if row is None else _to_promise(row)

    def search_promises(self, query: PromiseQuery, now: int) -> list[SearchRow]:
        conditions: list[Any] = [promises.c.seq > query.after_seq]
        if query.id_glob not in ("", "*"):
            conditions.append(promises.c.id.like(_glob_to_like(query.id_glob), escape="\\"))
        if query.states:
            conditions.append(or_(*(_state_condition(s, now) for s in query.states)))
        for key, value in sorted(query.tags.items()):
            conditions.append(_has_tag(key, value))
        stmt = select(promises).where(and_(*conditions)).order_by(promises.c.seq)
        stmt = stmt.limit(query.limit)
        with self._read() as conn:
            rows = conn.execute(stmt).all()
        return [SearchRow(seq=row[0], promise=_to_promise(row)) for row in rows]

    def expired_promise_ids(self, now: int, limit: int) -> list[str]:
        with self._read() as conn:
            return list(conn.execute(_select_expired, {"now": now, "limit": limit}).scalars())

    def promise_tree(self, root_id: str) -> tuple[Promise | None, list[Promise]]:
        # A range rather than LIKE 'root.%': exact prefix semantics, and an index
        # range scan on every dialect ('/' is the character after '.').
        stmt = (
            select(promises)
            .where(promises.c.id >= root_id + ".", promises.c.id < root_id + "/")
            .order_by(promises.c.seq)
        )
        with self._read() as conn:
            root = conn.execute(_select_by_id, {"id": root_id}).first()
            rows = conn.execute(stmt).all()
        return (None if root is None else _to_promise(root)), [_to_promise(r) for r in rows]

    def close(self) -> None:
        self._write_engine.dispose()
        self._read_engine.dispose()

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        try:
            with self._read_engine.connect() as conn:
                yield conn
        except DBAPIError as exc:
            raise StoreUnavailable(f"database read failed: {exc.orig}") from exc


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


def _has_tag(key: str, value: str) -> Any:
    # json_each rather than a JSON path: a path cannot quote every possible key.
    each = func.json_each(promises.c.tags).table_valued("key", "value")
    return select(each.c.key).where(each.c.key == key, each.c.value == value).exists()


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
# idempotency_key_for_create, idempotency_key_for_settle, settled_by.
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
    )


def open_sql_store(url: str, *, sqlite_synchronous: str, read_pool_size: int) -> SqlStore:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        raise StoreError(
            f"unsupported database URL {parsed.render_as_string(hide_password=True)!r}: "
            "this server supports sqlite:///PATH (PostgreSQL support is planned)"
        )
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
        pool_size=read_pool_size,
        max_overflow=read_pool_size,
        connect_args={"check_same_thread": False},
    )
    _configure_sqlite(write_engine, synchronous, begin="BEGIN IMMEDIATE")
    _configure_sqlite(read_engine, synchronous, begin="BEGIN")
    store = SqlStore(write_engine, read_engine)
    try:
        with write_engine.begin() as conn:
            upgrade_to_head(conn)
    except BaseException as exc:
        store.close()
        if isinstance(exc, DBAPIError):
            raise StoreUnavailable(f"cannot open {parsed.database}: {exc.orig}") from exc
        raise
    return store


def _configure_sqlite(engine: Engine, synchronous: str, *, begin: str) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Autocommit at the driver level, so that BEGIN below is ours: writers
        # take the write lock up front (IMMEDIATE) instead of failing to upgrade.
        dbapi_conn.isolation_level = None
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
