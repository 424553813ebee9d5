"""The SQLAlchemy Core implementation of `Store`, with the SQLite dialect's settings.

Writes run on one dedicated connection (the group committer is the only
writer), reads on a small pool: in WAL mode readers never block the writer.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from typing import TYPE_CHECKING, Any, TypeVar

import structlog
from sqlalchemy import Connection, bindparam, func, select
from sqlalchemy.engine import Dialect, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

from troth_server.domain.promise import Promise, PromiseState
from troth_server.domain.task import Task, TaskState
from troth_server.store import (
    CommitOutcomeUnknown,
    LiveCounts,
    StoreError,
    StoreEvent,
    StoreUnavailable,
)
from troth_server.store._bind import (
    MAX_BOUND_IDS,
    ByIds,
    Statement,
    chunks,
    compile_for,
)
from troth_server.store._engines import (
    Engines,
    open_announcer,
    postgresql_engines,
    sqlite_engines,
)
from troth_server.store._migrate import check_at_head, upgrade_to_head
from troth_server.store._processes import LocalAnnouncer, ServingLock, WriteLock
from troth_server.store._prune import PruneTx
from troth_server.store._reads import READ_ATTEMPTS, PromiseReads, select_expired
from troth_server.store._rows import to_promise, to_row, to_task
from troth_server.store._schedules import ScheduleReads, ScheduleTx
from troth_server.store._sqlstate import (
    DEADLOCK_DETECTED,
    SERIALIZATION_FAILURE,
    STATEMENTS_LOST,
)
from troth_server.store._states import StateReads, StateStatements, StateTx
from troth_server.store._tables import callbacks, promises, state_in, tasks
from troth_server.store._tags import TagStatements
from troth_server.store._task_sql import CompiledTaskStatements, TaskStatements, TaskTx
from troth_server.store._workflow_reads import WorkflowReads

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterator, Sequence

    from troth_server.store._pg_pipeline import Pipeline
    from troth_server.store._wake import Announcements

T = TypeVar("T")
log = structlog.get_logger("troth.store")

_WRITE_ATTEMPTS = 5
_RECONNECT_DELAY = 0.05

_SELECT_EXPIRED_LOCKED = select_expired.with_for_update(skip_locked=True)
_SORT_OFF = "SET LOCAL enable_sort = off"
_SORT_ON = "SET LOCAL enable_sort = on"
# The steps a settling workflow root ends (ix_promises_pending_parent).


def _pending_steps(parents: list[Any]) -> Any:
    return select(promises.c.id).where(
        promises.c.parent_id.in_(parents), state_in(promises.c.state, PromiseState.PENDING.value)
    )


# The database's clock in ms (PostgreSQL): the time a write transaction decides at.
# The metrics' count of PENDING promises: a walk of a partial index of pending rows.
_count_pending_promises = (
    select(func.count())
    .select_from(promises)
    .where(state_in(promises.c.state, PromiseState.PENDING.value))
)
_NEWEST = (promises.c.create_time, promises.c.settle_time, tasks.c.create_time,
           callbacks.c.create_time)  # fmt: skip
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
        # Locked in id order: replicas batching the same promises queue up instead
        # of deadlocking (SQLite, with one writer, renders no FOR UPDATE).
        self.by_ids = ByIds(
            dialect,
            lambda ids: (
                select(promises)
                .where(promises.c.id.in_(ids))
                .order_by(promises.c.id)
                .with_for_update()
            ),
        )
        self.pending_steps = ByIds(
            dialect, _pending_steps, sqlite_index=("promises", "ix_promises_pending_parent")
        )
        self.tasks = CompiledTaskStatements(dialect)
        self.tags = TagStatements(dialect)
        self.states = StateStatements(dialect)

    def _compile(self, stmt: Any) -> Statement:
        return compile_for(stmt, self._dialect)


class _WriteTx(TaskTx, PruneTx, StateTx, ScheduleTx):
    def __init__(
        self, conn: Connection, compiled: _Compiled, announcer: Announcements | None
    ) -> None:
        self._conn = conn
        self._compiled = compiled
        self._task_statements = compiled.tasks
        self._state_statements = compiled.states
        self._announcer = announcer
        # SQLite has one writer at a time and renders no FOR UPDATE.
        self.row_locks = conn.dialect.name == "postgresql"
        self._sqlite: Any = None if self.row_locks else conn.connection.driver_connection
        """SQLite: the driver's connection, which the hot statements run on straight
        (SQLAlchemy's execution costs 5-10 times sqlite3's own on these small ones)."""
        self._pipeline: Pipeline | None = None
        self._tags_read: dict[str, Any] = {}
        """The tags the tag index holds for each promise this transaction read
        (`get_promises`) or wrote: an update that keeps them leaves the index alone."""
        self.after_commit: list[dict[str, str]] = []
        """Announcements to send once the transaction committed (SQLite's processes)."""
        self.commit_sent = False
        """The COMMIT went (PostgreSQL: with the last statements): if the connection
        is lost now, whether the transaction committed is unknown."""

    def _write(self, sql: str, params: Sequence[Any]) -> None:
        if self._pipeline is not None:
            self._pipeline.execute(sql, params)
        elif self._sqlite is not None:
            self._on_sqlite(sql, params, many=True)
        else:
            self._conn.exec_driver_sql(sql, list(params))

    def _select(self, sql: str, params: Any) -> Sequence[Sequence[Any]]:
        if self._sqlite is not None:
            return self._on_sqlite(sql, params, many=False)
        # PostgreSQL: libpq straight, without a cursor's and SQLAlchemy's layers.
        pipeline = self._new_pipeline()
        pipeline.begin()
        pipeline.execute(sql, [params])
        (rows,) = self._run(pipeline)
        return rows

    def _on_sqlite(self, sql: str, params: Any, *, many: bool) -> list[Any]:
        """Run a statement on the SQLite driver's connection, inside the transaction
        SQLAlchemy began on it; its errors are raised as SQLAlchemy's would be, so
        that `SqlStore.write` decides as ever (retry, conflict, unavailable)."""
        driver = self._sqlite
        try:
            if many:
                driver.executemany(sql, params)
                return []
            return driver.execute(sql, params).fetchall()  # type: ignore[no-any-return]
        except sqlite3.Error as exc:
            raise DBAPIError.instance(
                sql, params, exc, sqlite3.Error, dialect=self._conn.dialect
            ) from exc

    @contextlib.contextmanager
    def final_writes(self) -> Iterator[None]:
        if not self.row_locks:  # SQLite: no round trips to save; the store commits
            yield
            return
        self._pipeline = self._new_pipeline()
        self._pipeline.begin()
        try:
            yield
            self._pipeline.query(b"COMMIT")
            self.commit_sent = True
            self._run(self._pipeline)
        finally:
            self._pipeline = None

    def _new_pipeline(self) -> Pipeline:
        # Imported here: it imports psycopg, which a SQLite-only install does not have.
        from troth_server.store._pg_pipeline import pipeline_on

        return pipeline_on(self._conn.connection)

    def _run(self, pipeline: Pipeline) -> list[list[tuple[Any, ...]]]:
        dialect = self._conn.dialect
        driver = self._conn.connection.driver_connection
        errors = dialect.loaded_dbapi.Error
        try:
            return pipeline.run()
        except errors as exc:
            # Raised outside SQLAlchemy's execution: made the DBAPIError it would
            # have raised, so that `SqlStore.write` decides as ever.
            lost = dialect.is_disconnect(exc, driver, None)
            if lost:
                self._conn.invalidate(exc)
            raise DBAPIError.instance(
                None, None, exc, errors, connection_invalidated=lost, dialect=dialect
            ) from exc

    def announce(
        self,
        groups: Collection[str],
        settled_ids: Collection[str],
        created_ids: Collection[str] = (),
    ) -> None:
        if self._announcer is not None and (groups or settled_ids or created_ids):
            notifications = self._announcer.notifications(groups, settled_ids, created_ids)
            if self._announcer.notify_sql is None:
                self.after_commit.extend(notifications)  # sent by the store once committed
            else:
                self._write(self._announcer.notify_sql, notifications)

    def database_time(self) -> int | None:
        if not self.row_locks:
            return None  # SQLite keeps no clock of its own: the server's decides
        # The transaction's first statement, with its BEGIN: one round trip.
        pipeline = self._new_pipeline()
        pipeline.begin()
        pipeline.query(_DATABASE_TIME.encode())
        (rows,) = self._run(pipeline)
        value = rows[0][0]
        assert value is not None
        return int(value)

    def expired_promise_ids(self, now: int, limit: int) -> list[str]:
        params = {"now": now, "limit": limit}
        if not self.row_locks:
            return list(self._conn.execute(_SELECT_EXPIRED_LOCKED, params).scalars())
        # PostgreSQL may walk every PENDING promise in seq order (the heap's order,
        # cheap to its costs when random reads are dear) and sort the overdue ones,
        # rather than read the deadline index, which serves both the range and the
        # order: sorting is off for this statement, so the index is its plan whatever
        # the costs (tests/store/test_scale_plans.py, at random_page_cost 1.1 to 40).
        self._conn.exec_driver_sql(_SORT_OFF)
        try:
            return list(self._conn.execute(_SELECT_EXPIRED_LOCKED, params).scalars())
        finally:
            self._conn.exec_driver_sql(_SORT_ON)

    def pending_step_ids(self, parent_ids: Collection[str]) -> list[str]:
        if not parent_ids:
            return []
        by_parent = self._compiled.pending_steps
        return [
            row[0]
            for part in chunks(sorted(parent_ids))
            for row in self._select(*by_parent.bound(part))
        ]

    def get_promises(self, ids: Collection[str]) -> dict[str, Promise]:
        if not ids:
            return {}
        found: dict[str, Promise] = {}
        for wanted in chunks(sorted(ids) if len(ids) > MAX_BOUND_IDS else list(ids)):
            rows = self._select(*self._compiled.by_ids.bound(wanted))
            found.update((row[1], to_promise(row)) for row in rows)
        self._tags_read.update((promise_id, p.tags) for promise_id, p in found.items())
        return found

    def insert_promises(self, items: Sequence[Promise]) -> None:
        if items:
            stmt = self._compiled.insert
            self._write(stmt.sql, [stmt.params(to_row(p)) for p in items])
            self._write_tags([p for p in items if p.tags], stale=False)
            self._tags_read.update((p.id, p.tags) for p in items)

    def update_promises(self, items: Sequence[Promise]) -> None:
        if items:
            stmt = self._compiled.update
            rows = [{f"b_{name}": value for name, value in to_row(p).items()} for p in items]
            self._write(stmt.sql, [stmt.params(row) for row in rows])
            # Tags change only when an early settle is adopted: the promises whose tags
            # differ from what this transaction read of them (or that it did not read).
            unread = object()
            retagged = [p for p in items if self._tags_read.get(p.id, unread) != p.tags]
            self._write_tags(retagged, stale=True)
            self._tags_read.update((p.id, p.tags) for p in items)

    def _write_tags(self, items: Sequence[Promise], *, stale: bool) -> None:
        """The tag index's rows of these promises, just written (`_tags`): one statement
        per batch (two after updates: the rows their tags no longer hold go first)."""
        ids = [p.id for p in items]
        tags = self._compiled.tags
        for part in chunks(ids):
            if stale:
                sql, params = tags.stale.bound(part)
                self._write(sql, [params])
            sql, params = tags.insert.bound(part)
            self._write(sql, [params])


class SqlStore(PromiseReads, WorkflowReads, StateReads, ScheduleReads):
    def __init__(
        self,
        engines: Engines,
        announcer: Announcements | None = None,
        process_lock: WriteLock | ServingLock | None = None,
    ) -> None:
        self._engines = engines
        self._announcer = announcer
        self._write_lock = threading.Lock()
        self._process_lock = process_lock
        """SQLite with several server processes: one write transaction at a time among them."""
        self._compiled = _Compiled(engines.write.dialect)

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
            written: _WriteTx | None = None
            try:
                with self._write_lock:
                    with (
                        self._across_processes(),
                        self._engines.write.connect() as conn,
                        conn.begin() as tx,
                    ):
                        written = _WriteTx(conn, self._compiled, self._announcer)
                        result = work(written)
                        committing = True
                        tx.commit()  # a no-op at the driver if the final writes committed
                    # Sent once committed, the other processes' write lock released.
                    if written.after_commit and self._announcer is not None:
                        self._announcer.send(written.after_commit)
                    return result
            except DBAPIError as exc:
                committing = committing or (written is not None and written.commit_sent)
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

    def _across_processes(self) -> contextlib.AbstractContextManager[None]:
        if not isinstance(self._process_lock, WriteLock):
            return contextlib.nullcontext()
        return self._process_lock.held()

    def database_time(self) -> int | None:
        if self._engines.read.dialect.name != "postgresql":
            return None
        return int(self._read(lambda conn: conn.exec_driver_sql(_DATABASE_TIME).scalar_one()))

    def newest_time(self) -> int:
        # Each max from the end of its index (SQLite's NEWEST_TIME_INDEXES).
        def read(conn: Connection) -> list[Any]:
            return [
                *(conn.execute(select(func.max(column))).scalar() for column in _NEWEST),
                conn.execute(
                    select(func.max(tasks.c.lease_expire_time - tasks.c.lease_ms)).where(
                        state_in(tasks.c.state, TaskState.CLAIMED.value)
                    )
                ).scalar(),
            ]

        return max((t for t in self._read(read) if t is not None), default=0)

    def search_tasks(self, group: str, limit: int, root_id: str | None = None) -> list[Task]:
        params = {"group": group, "limit": limit, "root": root_id}

        def read(conn: Connection) -> list[Any]:
            if root_id is not None:
                rows = conn.execute(TaskStatements.search_root, params).mappings().all()
                return [row for row in rows if row["group"] == group]
            pending = conn.execute(TaskStatements.search_pending, params).mappings().all()
            claimed = conn.execute(TaskStatements.search_claimed, params).mappings().all()
            return [*pending, *claimed]

        found = [to_task(row) for row in self._read(read)]
        found.sort(key=lambda t: (t.create_time or 0, t.id))
        return found[:limit]

    def live_counts(self) -> LiveCounts:
        def read(conn: Connection) -> tuple[int, list[Any], list[Any]]:
            return (
                conn.execute(_count_pending_promises).scalar_one(),
                list(conn.execute(TaskStatements.count_pending)),
                list(conn.execute(TaskStatements.count_claimed)),
            )

        pending, pending_tasks, claimed_tasks = self._read(read)
        counts: dict[tuple[str, str], int] = {}
        versions: dict[tuple[str, str, str], int] = {}
        for group, workflow, version, n in pending_tasks:
            key = (TaskState.PENDING.value, group)
            counts[key] = counts.get(key, 0) + n
            if version is not None:
                versions[(group, workflow or "", version)] = n
        counts.update({(TaskState.CLAIMED.value, group): n for group, n in claimed_tasks})
        return LiveCounts(pending_promises=pending, tasks=counts, versioned=versions)

    def claimed_task_ids(self, worker_ids: Collection[str]) -> set[tuple[str, str]]:
        if not worker_ids:
            return set()
        stmt = select(tasks.c.worker_id, tasks.c.id).where(
            state_in(tasks.c.state, TaskState.CLAIMED.value),
            tasks.c.worker_id.in_(bindparam("workers", expanding=True)),
        )
        wanted = sorted(worker_ids)

        def read(conn: Connection) -> list[Any]:
            return [row for part in chunks(wanted) for row in conn.execute(stmt, {"workers": part})]

        return {(row[0], row[1]) for row in self._read(read)}

    def close(self) -> None:
        if self._announcer is not None:
            self._announcer.close()
        if self._process_lock is not None:
            self._process_lock.close()
        self._engines.dispose()

    def _read(self, read: Callable[[Connection], T]) -> T:
        attempt = 0
        while True:
            attempt += 1
            try:
                with self._engines.read.connect() as conn:
                    return read(conn)
            except DBAPIError as exc:
                # A connection the database dropped (a restart): the pool has
                # discarded it, and a read can always run again.
                if not exc.connection_invalidated or attempt >= READ_ATTEMPTS:
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
    if code in (SERIALIZATION_FAILURE, DEADLOCK_DETECTED):
        return "serialization" if code == SERIALIZATION_FAILURE else "deadlock"
    if code == STATEMENTS_LOST:  # the pipeline's cache was cleared: prepared again
        return "statements lost"
    if exc.connection_invalidated and not committing:
        return "disconnected"
    return None


def open_sql_store(
    url: str,
    *,
    sqlite_synchronous: str,
    read_pool_size: int,
    migrate: bool,
    application_name: str,
    listen_url: str | None = None,
    transaction_pooling: bool = False,
    processes: int = 1,
) -> SqlStore:
    """`processes`: how many server processes share this database; on SQLite, more than
    one takes the write lock they share around each write transaction and announces
    commits to the others (`_processes`)."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        engines = sqlite_engines(parsed, sqlite_synchronous, read_pool_size)
        # The embedded default migrates itself: there is no one else to run it.
        migrate = True
    elif backend == "postgresql":
        engines = postgresql_engines(
            parsed, read_pool_size, application_name, transaction_pooling=transaction_pooling
        )
    else:
        raise StoreError(
            f"unsupported database URL {parsed.render_as_string(hide_password=True)!r}: "
            "use sqlite:///PATH or postgresql+psycopg://USER@HOST:PORT/DATABASE"
        )
    announcer: Announcements | None = None
    process_lock: WriteLock | ServingLock | None = None
    if backend == "sqlite":
        assert parsed.database is not None
        if processes > 1:
            process_lock = WriteLock(parsed.database)
            announcer = LocalAnnouncer(parsed.database)
        else:
            try:  # one process alone: never beside a supervisor's processes
                process_lock = ServingLock(parsed.database, supervisor=False)
            except StoreError:
                engines.dispose()
                raise
    held = process_lock.held() if isinstance(process_lock, WriteLock) else contextlib.nullcontext()
    try:
        with held, engines.write.begin() as conn:
            if migrate:
                upgrade_to_head(conn)
            else:
                check_at_head(conn, url)
            if backend == "postgresql":
                announcer = open_announcer(conn, make_url(listen_url) if listen_url else parsed)
    except BaseException as exc:
        engines.dispose()
        if announcer is not None:
            announcer.close()
        if process_lock is not None:
            process_lock.close()
        if isinstance(exc, DBAPIError):
            where = parsed.render_as_string(hide_password=True)
            raise StoreUnavailable(f"cannot open {where}: {exc.orig}") from exc
        raise
    return SqlStore(engines, announcer, process_lock)
