"""The SQLAlchemy Core implementation of `Store`, with the SQLite dialect's settings.

Writes run on one dedicated connection (the group committer is the only
writer), reads on a small pool: in WAL mode readers never block the writer.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
import structlog
from sqlalchemy import (
    Connection,
    Engine,
    RowMapping,
    and_,
    bindparam,
    create_engine,
    event,
    false,
    func,
    or_,
    select,
    true,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.pool import QueuePool, StaticPool

from troth_server.domain.promise import Payload, Promise, PromiseState
from troth_server.store import PromiseQuery, SearchRow, StoreError, StoreUnavailable
from troth_server.store._migrate import upgrade_to_head
from troth_server.store._tables import promises

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterator, Sequence

T = TypeVar("T")
log = structlog.get_logger("troth.store")

# Headers and tags are JSON columns, converted on every row written or read.
_JSON_CODEC: dict[str, Any] = {
    "json_serializer": lambda value: orjson.dumps(value).decode(),
    "json_deserializer": orjson.loads,
}
_SYNCHRONOUS = {"OFF", "NORMAL", "FULL", "EXTRA"}
_WRITE_ATTEMPTS = 3

_select_by_ids = select(promises).where(promises.c.id.in_(bindparam("ids", expanding=True)))
_select_by_id = select(promises).where(promises.c.id == bindparam("id"))
_select_expired = (
    select(promises.c.id)
    .where(promises.c.state == PromiseState.PENDING.value)
    .where(promises.c.expire_time <= bindparam("now"))
    .order_by(promises.c.expire_time)
    .limit(bindparam("limit"))
)
_insert = promises.insert()
_update_settled = (
    promises.update()
    .where(promises.c.id == bindparam("b_id"))
    .values(
        state=bindparam("b_state"),
        value_headers=bindparam("b_value_headers"),
        value_data=bindparam("b_value_data"),
        settle_time=bindparam("b_settle_time"),
        idempotency_key_for_settle=bindparam("b_key"),
        settled_by=bindparam("b_settled_by"),
    )
)


class _WriteTx:
    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def get_promises(self, ids: Collection[str]) -> dict[str, Promise]:
        if not ids:
            return {}
        rows = self._conn.execute(_select_by_ids, {"ids": list(ids)}).mappings()
        return {row["id"]: _to_promise(row) for row in rows}

    def insert_promises(self, items: Sequence[Promise]) -> None:
        if items:
            self._conn.execute(_insert, [_to_row(p) for p in items])

    def update_promises(self, items: Sequence[Promise]) -> None:
        if items:
            self._conn.execute(
                _update_settled,
                [
                    {
                        "b_id": p.id,
                        "b_state": p.state.value,
                        "b_value_headers": dict(p.value.headers),
                        "b_value_data": p.value.data,
                        "b_settle_time": p.settle_time,
                        "b_key": p.idempotency_key_for_settle,
                        "b_settled_by": p.settled_by,
                    }
                    for p in items
                ],
            )


class SqlStore:
    def __init__(self, write_engine: Engine, read_engine: Engine) -> None:
        self._write_engine = write_engine
        self._read_engine = read_engine
        self._write_lock = threading.Lock()

    def write(self, work: Callable[[_WriteTx], T]) -> T:
        attempt = 0
        while True:
            attempt += 1
            try:
                with self._write_lock, self._write_engine.begin() as conn:
                    return work(_WriteTx(conn))
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
            row = conn.execute(_select_by_id, {"id": promise_id}).mappings().first()
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
            rows = conn.execute(stmt).mappings().all()
        return [SearchRow(seq=row["seq"], promise=_to_promise(row)) for row in rows]

    def expired_promise_ids(self, now: int, limit: int) -> list[str]:
        with self._read() as conn:
            return list(conn.execute(_select_expired, {"now": now, "limit": limit}).scalars())

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
        "param_headers": dict(p.param.headers),
        "param_data": p.param.data,
        "value_headers": dict(p.value.headers),
        "value_data": p.value.data,
        "tags": dict(p.tags),
        "timer": p.is_timer,
        "create_time": p.create_time,
        "settle_time": p.settle_time,
        "expire_time": p.expire_time,
        "idempotency_key_for_create": p.idempotency_key_for_create,
        "idempotency_key_for_settle": p.idempotency_key_for_settle,
        "settled_by": p.settled_by,
    }


def _to_promise(row: RowMapping) -> Promise:
    return Promise(
        id=row["id"],
        state=PromiseState(row["state"]),
        param=Payload(row["param_headers"], bytes(row["param_data"])),
        value=Payload(row["value_headers"], bytes(row["value_data"])),
        tags=row["tags"],
        create_time=row["create_time"],
        settle_time=row["settle_time"],
        expire_time=row["expire_time"],
        idempotency_key_for_create=row["idempotency_key_for_create"],
        idempotency_key_for_settle=row["idempotency_key_for_settle"],
        settled_by=row["settled_by"],
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
        **_JSON_CODEC,
    )
    read_engine = create_engine(
        plain,
        poolclass=QueuePool,
        pool_size=read_pool_size,
        max_overflow=read_pool_size,
        connect_args={"check_same_thread": False},
        **_JSON_CODEC,
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
