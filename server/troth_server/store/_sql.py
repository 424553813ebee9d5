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
    create_engine,
    event,
    false,
    func,
    or_,
    select,
    true,
)
from sqlalchemy.engine import Dialect, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.pool import QueuePool, StaticPool

from troth_server.domain.promise import Payload, Promise, PromiseState
from troth_server.store import PromiseQuery, SearchRow, StoreError, StoreUnavailable
from troth_server.store._migrate import upgrade_to_head
from troth_server.store._tables import promises

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


class _WriteTx:
    def __init__(self, conn: Connection, compiled: _Compiled) -> None:
        self._conn = conn
        self._compiled = compiled

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
