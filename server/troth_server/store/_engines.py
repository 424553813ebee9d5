"""Engines for each dialect: the one writing connection, the reading pool, their settings.

SQLite: WAL, `BEGIN IMMEDIATE` for the writer, `busy_timeout`, foreign keys
and case-sensitive LIKE on every connection. PostgreSQL: psycopg 3, a
one-connection writer, a pre-pinged reading pool, and a pool of autocommit
connections for the point reads (one statement, one round trip).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.pool import QueuePool, StaticPool

from troth_server.store import StoreError
from troth_server.store._bind import check_sqlite_variables

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from troth_server.store._listen import Announcer

__all__ = [
    "Engines",
    "open_announcer",
    "postgresql_engines",
    "require_postgres_driver",
    "sqlite_engines",
]

POSTGRES_MISSING = (
    "PostgreSQL support is not installed (the psycopg 3 driver): install troth-server[postgres] "
    "(from a troth checkout: pip install './server[postgres]'), "
    "or use the embedded default, sqlite:///troth.db"
)

_SYNCHRONOUS = {"OFF", "NORMAL", "FULL", "EXTRA"}


@dataclass(frozen=True)
class Engines:
    """A store's engines: `write` (the group committer's one connection), `read`
    (reads through SQLAlchemy, of one or several statements) and `point` (the hot
    reads of one compiled statement each, on the DB-API: `store._reads`)."""

    write: Engine
    read: Engine
    point: Engine

    def dispose(self) -> None:
        for engine in {self.write, self.read, self.point}:
            engine.dispose()


def sqlite_engines(parsed: URL, sqlite_synchronous: str, pool_size: int) -> Engines:
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
    # A statement outside BEGIN is its own read transaction already (the driver
    # is in autocommit): the point reads share the reading pool.
    return Engines(write_engine, read_engine, read_engine)


def require_postgres_driver() -> None:
    """Refuse a postgresql:// URL, saying what to install, when psycopg is not there:
    PostgreSQL is the `postgres` extra, so a SQLite-only install does without it."""
    try:
        import psycopg  # noqa: F401 (the extra's driver: is it installed?)
    except ImportError as exc:
        raise StoreError(POSTGRES_MISSING) from exc


def postgresql_engines(
    parsed: URL, pool_size: int, application_name: str, *, transaction_pooling: bool = False
) -> Engines:
    """`transaction_pooling`: `parsed` goes through a transaction-mode pooler (PgBouncer
    `pool_mode = transaction`), which gives each transaction whichever server
    connection is free: no statement is prepared (psycopg's `prepare_threshold=None`,
    the pipeline's statements unnamed) and no setting is left on a session."""
    require_postgres_driver()
    if parsed.drivername not in ("postgresql", "postgresql+psycopg"):
        raise StoreError(
            f"PostgreSQL is reached through psycopg 3: write postgresql+psycopg://..., "
            f"not {parsed.drivername}://..."
        )
    plain = parsed.set(drivername="postgresql+psycopg")
    connect_args = {"connect_timeout": 5, "application_name": application_name}
    # JSONB columns (headers, tags, policies) decoded by orjson rather than the
    # standard library's json, on every read of a promise.
    json = {"json_deserializer": orjson.loads}
    # One connection writes (the group committer is this replica's only writer).
    # No pre-ping, which would cost every batch a round trip: a connection that
    # died since the last batch fails its first statement, SQLAlchemy discards it,
    # and the store runs the transaction again on a new one (`_retryable`).
    # The writer's and the point reads' statements are prepared by troth's pipeline
    # (`_pg_pipeline`) alone: psycopg, had it prepared some of its own there, would
    # DEALLOCATE ALL at a rollback, the pipeline's statements with them.
    unprepared = {**connect_args, "prepare_threshold": None}
    write_engine = create_engine(
        plain, pool_size=1, max_overflow=0, connect_args=unprepared, **json
    )
    if transaction_pooling:
        connect_args = unprepared
    # Reads in REPEATABLE READ: a read of several statements (a workflow's tree,
    # SearchTasks' PENDING then CLAIMED) sees one snapshot, as on SQLite. Under READ
    # COMMITTED, a task whose lease expired between two of them was in neither.
    read_engine = create_engine(
        plain,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        connect_args=connect_args,
        isolation_level="REPEATABLE READ",
        **json,
    )
    # The point reads (a promise, a workflow's tree: one statement each, run for
    # every delivery, watch and settle, some on the event loop) in autocommit and
    # without a pre-ping: one round trip each instead of four (ping, BEGIN, SELECT,
    # ROLLBACK). A connection found dead drops the whole pool, and the read runs
    # again on a new one (`PromiseReads._read_rows`).
    point_engine = create_engine(
        plain,
        pool_size=pool_size,
        max_overflow=pool_size,
        connect_args=unprepared,
        isolation_level="AUTOCOMMIT",
        **json,
    )

    # Every write statement is an index lookup by design. Without this, a young
    # table that grew faster than autovacuum analyzes it is planned as if it
    # were tiny, and each batch's id lookup became a sequential scan (measured:
    # 30 ms instead of 0.3 ms at 60k rows, which halved throughput).
    no_seqscan = "SET enable_seqscan = off"
    if transaction_pooling:
        from troth_server.store._pg_pipeline import Prepared  # psycopg's: installed here

        # Per transaction, with its BEGIN (one round trip still): a session's
        # setting would stay on a server connection other clients get next.
        local = (no_seqscan.replace("SET", "SET LOCAL", 1).encode(),)

        @event.listens_for(write_engine, "connect")
        def _unnamed_writes(_dbapi_conn: Any, record: Any) -> None:
            record.info["troth_prepared"] = Prepared(named=False, after_begin=local)

        @event.listens_for(point_engine, "connect")
        def _unnamed_reads(_dbapi_conn: Any, record: Any) -> None:
            record.info["troth_prepared"] = Prepared(named=False)

    else:

        @event.listens_for(write_engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.execute(no_seqscan)
            dbapi_conn.commit()

    return Engines(write_engine, read_engine, point_engine)


def open_announcer(conn: Connection, listen_url: URL) -> Announcer:
    """The announcer of the schema `conn` is in, listening on a connection of its own
    to `listen_url` (a session: PostgreSQL directly or a session-mode pool)."""
    # Channels are per database, not per schema: two deployments sharing a
    # database in different schemas must not wake each other.
    schema, database = conn.exec_driver_sql("SELECT current_schema(), current_database()").one()
    channel = "troth" if schema == "public" else f"troth_{schema}"[:63]
    # The pools' own reading of the URL (psycopg's dialect), so that the listener reaches
    # the server the URL names: a multi-host URL (`?host=h1:p1&host=h2:p2&target_session_
    # attrs=read-write`, for a failover without a proxy) becomes libpq's `host=h1,h2
    # port=p1,p2`, which the URL rendered back as text is not.
    from psycopg.conninfo import make_conninfo  # here: a SQLite-only install has no psycopg

    _, params = conn.dialect.create_connect_args(listen_url.set(drivername="postgresql+psycopg"))
    conninfo = make_conninfo("", **{k: v for k, v in params.items() if isinstance(v, str | int)})
    # Imported here: it imports psycopg, which a SQLite-only install does not have.
    from troth_server.store._listen import Announcer

    return Announcer(conninfo, channel, database)


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
