"""SQLAlchemy Core tables: the schema that Alembic migrations must match."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

metadata = MetaData()

# JSON text, written and read by the store itself (orjson); JSONB on PostgreSQL so
# that tag filters can use containment and a GIN index.
_json = Text().with_variant(JSONB(), "postgresql")
# Promise ids compare bytewise on every dialect: the `<root>.` prefix ranges of
# a workflow's steps rely on it, whatever the PostgreSQL database's collation.
_promise_id = String(1024).with_variant(String(1024, collation="C"), "postgresql")

promises = Table(
    "promises",
    metadata,
    # Insertion order: search pages follow it, so new rows only ever appear on
    # later pages and a page token stays valid under concurrent inserts.
    Column(
        "seq",
        BigInteger().with_variant(Integer(), "sqlite"),
        primary_key=True,
        autoincrement=True,
    ),
    Column("id", _promise_id, nullable=False, unique=True),
    Column("state", String(20), nullable=False),
    Column("param_headers", _json, nullable=False),
    Column("param_data", LargeBinary(), nullable=False),
    Column("value_headers", _json, nullable=False),
    Column("value_data", LargeBinary(), nullable=False),
    Column("tags", _json, nullable=False),
    # Copied out of tags so that expiry and state searches need no JSON functions.
    Column("timer", Boolean(), nullable=False),
    Column("create_time", BigInteger(), nullable=False),
    Column("settle_time", BigInteger(), nullable=True),
    Column("expire_time", BigInteger(), nullable=True),
    Column("idempotency_key_for_create", String(1024), nullable=True),
    Column("idempotency_key_for_settle", String(1024), nullable=True),
    Column("settled_by", String(1024), nullable=True),
    # JSON Schema text that resolve values must satisfy (revision 0004).
    Column("schema", Text(), nullable=True),
    Column("title", String(1024), nullable=True),
    Column("message", Text(), nullable=True),
    Column("requested_by", String(1024), nullable=True),
    # A root's workflow code version, recorded when a worker first takes it.
    Column("workflow_version", String(128), nullable=True),
    # A workflow's step: its top-level root, and the workflow whose task created it
    # (revision 0005). NULL for roots and standalone promises.
    Column("root_id", _promise_id, nullable=True),
    Column("parent_id", _promise_id, nullable=True),
)

# The sweeper's loop: pending promises by expiry. Partial, so settled rows cost nothing.
Index(
    "ix_promises_pending_expire_time",
    promises.c.expire_time,
    sqlite_where=text("state = 'PENDING'"),
    postgresql_where=text("state = 'PENDING'"),
)

# A workflow's history, in creation order (what a Poll delivery carries).
Index("ix_promises_parent_seq", promises.c.parent_id, promises.c.seq)
# The steps a settling root ends: its PENDING ones (few, however long the history).
Index(
    "ix_promises_pending_parent",
    promises.c.parent_id,
    sqlite_where=text("state = 'PENDING'"),
    postgresql_where=text("state = 'PENDING'"),
)


tasks = Table(
    "tasks",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("root_promise_id", String(1024), nullable=False),
    Column("group", String(256), nullable=False),
    Column("kind", String(10), nullable=False),
    Column("state", String(12), nullable=False),
    Column("counter", BigInteger(), nullable=False),
    Column("worker_id", String(256), nullable=True),
    Column("lease_expire_time", BigInteger(), nullable=True),
    # The lease its holder asked for: after an outage a lease is kept this long (0006).
    Column("lease_ms", BigInteger(), nullable=True),
    Column("preferred_worker_id", String(256), nullable=True),
    Column("resume_pending", Boolean(), nullable=False),
    Column("create_time", BigInteger(), nullable=False),
    # The root's workflow name and version, so routing needs no read of the root.
    Column("workflow", String(256), nullable=True),
    Column("workflow_version", String(128), nullable=True),
)

# The dispatcher's loop: the oldest PENDING tasks of a group.
Index(
    "ix_tasks_pending_group",
    tasks.c.group,
    tasks.c.create_time,
    sqlite_where=text("state = 'PENDING'"),
    postgresql_where=text("state = 'PENDING'"),
)
# The lease sweeper's loop, and a worker's heartbeat / broken stream.
Index(
    "ix_tasks_claimed_lease",
    tasks.c.lease_expire_time,
    sqlite_where=text("state = 'CLAIMED'"),
    postgresql_where=text("state = 'CLAIMED'"),
)
Index(
    "ix_tasks_claimed_worker",
    tasks.c.worker_id,
    sqlite_where=text("state = 'CLAIMED'"),
    postgresql_where=text("state = 'CLAIMED'"),
)
# One active task per root (DESIGN §4.9), enforced by the database too.
Index(
    "ux_tasks_active_root",
    tasks.c.root_promise_id,
    unique=True,
    sqlite_where=text("state IN ('PENDING', 'CLAIMED')"),
    postgresql_where=text("state IN ('PENDING', 'CLAIMED')"),
)

callbacks = Table(
    "callbacks",
    metadata,
    Column("promise_id", String(1024), primary_key=True),
    Column("root_promise_id", String(1024), primary_key=True),
    Column("group", String(256), nullable=False),
    Column("worker_id", String(256), nullable=True),
    Column("create_time", BigInteger(), nullable=False),
)
Index("ix_callbacks_root", callbacks.c.root_promise_id)
