"""SQLAlchemy Core tables: the schema that Alembic migrations must match."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
    func,
    literal_column,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

if TYPE_CHECKING:
    from collections.abc import Callable

metadata = MetaData()

TAG_KEY_INDEXED = 256
TAG_VALUE_INDEXED = 384
"""The longest tag key and value (characters) kept in `promise_tags`: a B-tree entry
of PostgreSQL holds at most ~2.7 kB (four bytes a character at worst). A longer tag
(possible where an operator raised --max-tag-key-length or --max-tag-value-length)
is not kept there, and a search by it filters the promises' tags instead."""

# JSON text, written and read by the store itself (orjson); JSONB on PostgreSQL so
# that tag filters can use containment and a GIN index.
_json = Text().with_variant(JSONB(), "postgresql")
# Promise ids compare bytewise on every dialect: the `<root>.` prefix ranges of
# a workflow's steps rely on it, whatever the PostgreSQL database's collation.
_promise_id = String(1024).with_variant(String(1024, collation="C"), "postgresql")


def _tag_text(length: int) -> Any:
    return String(length).with_variant(String(length, collation="C"), "postgresql")


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
    # Who may settle it (JSON, `domain.approvers`), its authenticated starter, and the
    # settle token it was settled with, which makes a token single-use (revision 0008).
    Column("approvers", _json, nullable=True),
    Column("started_by", String(1024), nullable=True),
    Column("settle_token_id", String(64), nullable=True),
    # Random, drawn at create: a promise pruned and created again under the same id is
    # another instance, and its settle tokens are void (revision 0011; 0 before it).
    Column("instance", BigInteger(), nullable=False, server_default=text("0")),
    # A workflow's root: its `troth:invoke` and `troth:func` tags, copied out so that
    # workflows are listed by a partial index of their roots (revision 0012). NULL
    # for every other promise (and the name for one longer than a name may be).
    Column("workflow_group", String(256), nullable=True),
    Column("workflow_name", String(256), nullable=True),
)

# The sweeper's loop: pending promises by expiry. Partial, so settled rows cost nothing.
Index(
    "ix_promises_pending_expire_time",
    promises.c.expire_time,
    sqlite_where=text("state = 'PENDING'"),
    postgresql_where=text("state = 'PENDING'"),
)

# A workflow's history, in creation order (what a Poll delivery carries).
# Both parent indexes hold steps only (revision 0015): roots and standalone promises
# (parent_id NULL) are most rows of a store with a backlog of PENDING roots, and in
# an index they were one key of that many rows, which SQLite's statistics average in
# (`sqlite_stat1`: 200,000 rows per parent with 200,000 PENDING roots), so that it
# scanned the table rather than read a parent's steps. A comparison on parent_id
# (`=`, `IN`) implies `IS NOT NULL`, to SQLite's and PostgreSQL's planners alike.
_STEPS = "parent_id IS NOT NULL"
Index(
    "ix_promises_parent_seq",
    promises.c.parent_id,
    promises.c.seq,
    sqlite_where=text(_STEPS),
    postgresql_where=text(_STEPS),
)
# The steps a settling root ends: its PENDING ones (few, however long the history).
Index(
    "ix_promises_pending_parent",
    promises.c.parent_id,
    sqlite_where=text(f"state = 'PENDING' AND {_STEPS}"),
    postgresql_where=text(f"state = 'PENDING' AND {_STEPS}"),
)
# Searches of PENDING promises in creation order (the inbox, `--state PENDING`):
# a walk of the live promises, however long the settled history (revision 0007).
Index(
    "ix_promises_pending_seq",
    promises.c.seq,
    sqlite_where=text("state = 'PENDING'"),
    postgresql_where=text("state = 'PENDING'"),
)
# Searches by deadline (EXPIRE_TIME_ASC) that are not limited to PENDING promises.
Index("ix_promises_expire_seq", promises.c.expire_time, promises.c.seq)
# A workflow's whole tree (every nested step), pruned with its root. Steps only: a
# top-level promise (root_id NULL) is never looked up by it.
Index(
    "ix_promises_root",
    promises.c.root_id,
    sqlite_where=text("root_id IS NOT NULL"),
    postgresql_where=text("root_id IS NOT NULL"),
)
# Retention: settled top-level promises (workflow roots, standalone ones) by settle time.
Index(
    "ix_promises_settled_top",
    promises.c.settle_time,
    promises.c.seq,
    sqlite_where=text("root_id IS NULL AND state <> 'PENDING'"),
    postgresql_where=text("root_id IS NULL AND state <> 'PENDING'"),
)
# Workflows newest first (SearchWorkflows), every group's or one group's: the roots
# only, however long the history of steps and standalone promises (revision 0012).
Index(
    "ix_promises_workflows",
    promises.c.seq,
    sqlite_where=text("workflow_group IS NOT NULL"),
    postgresql_where=text("workflow_group IS NOT NULL"),
)
Index(
    "ix_promises_workflows_group",
    promises.c.workflow_group,
    promises.c.seq,
    sqlite_where=text("workflow_group IS NOT NULL"),
    postgresql_where=text("workflow_group IS NOT NULL"),
)
# Searches of a rejected state in seq order (revision 0013): each state's own rows,
# few next to the RESOLVED history, which a walk of seq finds densely anyway.
for _state, _index in (
    ("REJECTED", "ix_promises_rejected_seq"),
    ("REJECTED_CANCELED", "ix_promises_canceled_seq"),
    ("REJECTED_TIMEDOUT", "ix_promises_timedout_seq"),
):
    _only = text(f"state = '{_state}'")
    Index(_index, promises.c.seq, sqlite_where=_only, postgresql_where=_only)

# Searches by tag in seq order (revision 0015): a row per tag of each promise, written
# with the promise (and again when an early settle is adopted and its tags replaced),
# deleted with it. `ix_promise_tags_walk` serves both the filter and the order: a
# search by a tag walks that tag's promises in seq order and stops at its page, however
# common the tag (the GIN index of `tags` it replaces served the filter but not the
# order, so PostgreSQL read every promise with the tag, then sorted them).
promise_tags = Table(
    "promise_tags",
    metadata,
    Column("seq", BigInteger(), primary_key=True),
    Column("key", _tag_text(TAG_KEY_INDEXED), primary_key=True),
    Column("value", _tag_text(TAG_VALUE_INDEXED), nullable=False),
)
Index("ix_promise_tags_walk", promise_tags.c.key, promise_tags.c.value, promise_tags.c.seq)


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
    # When it completed: completed tasks are deleted a while later (revision 0007).
    Column("complete_time", BigInteger(), nullable=True),
    # The root's workflow name and version, so routing needs no read of the root.
    Column("workflow", String(256), nullable=True),
    Column("workflow_version", String(128), nullable=True),
    # The authenticated principal the task is leased to: only it may call about the
    # task (revision 0009). None with authentication off.
    Column("worker_principal", String(1024), nullable=True),
    # A task whose workflow code raised goes back to PENDING after a backoff, with
    # the failure recorded for operators (revision 0010).
    Column("failed_attempts", Integer(), nullable=False, server_default=text("0")),
    Column("last_error", Text(), nullable=True),
    Column("last_traceback", Text(), nullable=True),
    Column("next_attempt_time", BigInteger(), nullable=True),
)

# The dispatcher's loop: the oldest PENDING tasks of a group.
Index(
    "ix_tasks_pending_group",
    tasks.c.group,
    tasks.c.create_time,
    sqlite_where=text("state = 'PENDING'"),
    postgresql_where=text("state = 'PENDING'"),
)
# The claim's probes (revision 0013), each `ORDER BY create_time LIMIT n` on the rows it
# wants: ready tasks (PENDING, no retry backoff) preferred for one worker (its resumes),
# for nobody, for some worker; and tasks in a backoff by the time they may run again.
_READY = "state = 'PENDING' AND next_attempt_time IS NULL"
for _name, _columns, _where in (
    (
        "ix_tasks_ready_preferred",
        (tasks.c.group, tasks.c.preferred_worker_id, tasks.c.create_time),
        f"{_READY} AND preferred_worker_id IS NOT NULL",
    ),
    (
        "ix_tasks_ready_anyone",
        (tasks.c.group, tasks.c.create_time),
        f"{_READY} AND preferred_worker_id IS NULL",
    ),
    (
        "ix_tasks_ready_promised",
        (tasks.c.group, tasks.c.create_time),
        f"{_READY} AND preferred_worker_id IS NOT NULL",
    ),
    (
        "ix_tasks_backoff",
        (tasks.c.group, tasks.c.next_attempt_time),
        "state = 'PENDING' AND next_attempt_time IS NOT NULL",
    ),
):
    Index(_name, *_columns, sqlite_where=text(_where), postgresql_where=text(_where))
# The claim's probes for a stream that lists its workflows (revision 0014): the route
# in the index, so that a claim never reads a task its route refuses. Version first:
# a stream's versioned keys and the unversioned tasks of a workflow are each one
# prefix, and the unversioned tasks of workflows no stream lists are ranges of one
# prefix. A key may be "none" (no version, no workflow, preferred for nobody): SQLite
# takes `IS NULL` as an equality that keeps the index's order; PostgreSQL does not
# (it sorted the whole key), so there each nullable column is keyed as
# `coalesce(column, '')` (`route_key`, `route_none`).


class route_key(FunctionElement[str]):
    """A nullable column as the route indexes key it: `coalesce(column, '')` on
    PostgreSQL, the column itself on SQLite. (Routing reads an empty version or
    workflow name as none too.)"""

    type = String()
    name = "route_key"
    inherit_cache = True


class route_none(FunctionElement[bool]):
    """The route key of a column is none: `coalesce(column, '') = ''` on PostgreSQL,
    `column IS NULL` on SQLite."""

    type = Boolean()
    name = "route_none"
    inherit_cache = True
    _is_implicitly_boolean = True  # a condition as it is (no `= 1` on SQLite)


def _only_column(element: Any, compiler: Any, **kw: Any) -> str:
    return str(compiler.process(next(iter(element.clauses)), **kw))


@compiles(route_key)
def _coalesced(element: Any, compiler: Any, **kw: Any) -> str:
    return f"coalesce({_only_column(element, compiler, **kw)}, '')"


@compiles(route_key, "sqlite")
def _plain(element: Any, compiler: Any, **kw: Any) -> str:
    return _only_column(element, compiler, **kw)


@compiles(route_none)
def _coalesced_none(element: Any, compiler: Any, **kw: Any) -> str:
    return f"coalesce({_only_column(element, compiler, **kw)}, '') = ''"


@compiles(route_none, "sqlite")
def _is_null(element: Any, compiler: Any, **kw: Any) -> str:
    return f"{_only_column(element, compiler, **kw)} IS NULL"


_ROUTE_INDEXES = (
    (
        "ix_tasks_route_ready",
        ("workflow_version", "workflow", "preferred_worker_id"),
        ("create_time",),
        _READY,
    ),
    (
        "ix_tasks_route_promised",
        ("workflow_version", "workflow"),
        ("create_time",),
        f"{_READY} AND preferred_worker_id IS NOT NULL",
    ),
    (
        "ix_tasks_route_backoff",
        ("workflow_version", "workflow"),
        ("next_attempt_time",),
        "state = 'PENDING' AND next_attempt_time IS NOT NULL",
    ),
)
_ONLY_ON: dict[int, str] = {}
"""The dialect each route index object is for, by its id (`include_object_for`)."""
for _name, _keyed, _rest, _where in _ROUTE_INDEXES:
    _coalesced_keys = [func.coalesce(tasks.c[k], literal_column("''")) for k in _keyed]
    for _dialect, _keys in (
        ("postgresql", _coalesced_keys),
        ("sqlite", [tasks.c[k] for k in _keyed]),
    ):
        _route_index = Index(
            _name,
            tasks.c.group,
            *_keys,
            *(tasks.c[r] for r in _rest),
            sqlite_where=text(_where),
            postgresql_where=text(_where),
        ).ddl_if(dialect=_dialect)
        _ONLY_ON[id(_route_index)] = _dialect
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
# Completed tasks, deleted by the sweeper once a repeated CompleteTask can no longer come.
Index(
    "ix_tasks_completed",
    tasks.c.complete_time,
    sqlite_where=text("state = 'COMPLETED'"),
    postgresql_where=text("state = 'COMPLETED'"),
)
# One active task per root (DESIGN §4.9), enforced by the database too.
Index(
    "ux_tasks_active_root",
    tasks.c.root_promise_id,
    unique=True,
    sqlite_where=text("state IN ('PENDING', 'CLAIMED')"),
    postgresql_where=text("state IN ('PENDING', 'CLAIMED')"),
)

# Paused workflows (SearchWorkflows `paused`): tasks whose code failed, not completed.
Index(
    "ix_tasks_paused",
    tasks.c.root_promise_id,
    sqlite_where=text("failed_attempts > 0 AND state IN ('PENDING', 'CLAIMED')"),
    postgresql_where=text("failed_attempts > 0 AND state IN ('PENDING', 'CLAIMED')"),
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

# A workflow's named state slots (revision 0016): read and written by primary key.
workflow_states = Table(
    "workflow_states",
    metadata,
    Column("root_id", _promise_id, primary_key=True),
    Column("name", String(128), primary_key=True),
    Column("version", BigInteger(), nullable=False),
    Column("value_headers", _json, nullable=False),
    Column("value_data", LargeBinary(), nullable=False),
    Column("update_time", BigInteger(), nullable=False),
    Column("updated_by", String(1024), nullable=True),
)
# Schedules (revision 0017): a workflow started on a cron schedule, one run per tick
# (`domain/schedules.py`). `next_fire_time` is NULL while paused, so the scheduler's
# read of what is due walks a partial index of the active schedules in fire order.
schedules = Table(
    "schedules",
    metadata,
    Column("name", String(256), primary_key=True),
    Column("cron", String(256), nullable=False),
    Column("timezone", String(256), nullable=False),
    Column("workflow", String(1024), nullable=False),
    Column("group", String(256), nullable=False),
    Column("args_headers", _json, nullable=False),
    Column("args_data", LargeBinary(), nullable=False),
    Column("catch_up", String(16), nullable=False),
    Column("jitter_ms", BigInteger(), nullable=False),
    Column("ttl_ms", BigInteger(), nullable=True),
    Column("paused", Boolean(), nullable=False),
    Column("next_tick", BigInteger(), nullable=True),
    Column("next_fire_time", BigInteger(), nullable=True),
    Column("last_tick", BigInteger(), nullable=True),
    Column("last_run_id", String(1024), nullable=True),
    Column("skipped", BigInteger(), nullable=False),
    Column("created_by", String(1024), nullable=True),
    Column("create_time", BigInteger(), nullable=False),
    Column("update_time", BigInteger(), nullable=False),
)
Index(
    "ix_schedules_due",
    schedules.c.next_fire_time,
    sqlite_where=text("next_fire_time IS NOT NULL"),
    postgresql_where=text("next_fire_time IS NOT NULL"),
)


def state_in(column: Any, *states: str) -> Any:
    """`column = 'X'`, or `column IN ('X', 'Y')`, with the states written into the SQL.

    Never bound as parameters: SQLite uses a partial index (`WHERE state IN
    ('PENDING', 'CLAIMED')`) only for a query whose WHERE clause holds that very
    term, and a bound `IN (?, ?)` is not one, so the statement scanned the table.
    States are this package's enum values, never a caller's text.
    """
    literals: list[Any] = [literal_column(f"'{state}'") for state in states]
    return column == literals[0] if len(literals) == 1 else column.in_(literals)


# The newest time stored, which a SQLite server's clock never starts behind
# (`SqlStore.newest_time`, once per start), read from the end of an index of each
# time (revision 0015): SQLite only, PostgreSQL's clock being the database's own.
NEWEST_TIME_INDEXES = {
    "ix_promises_create_time": promises.c.create_time,
    "ix_promises_settle_time": promises.c.settle_time,
    "ix_tasks_create_time": tasks.c.create_time,
    "ix_callbacks_create_time": callbacks.c.create_time,
}
for _name, _time in NEWEST_TIME_INDEXES.items():
    Index(_name, _time).ddl_if(dialect="sqlite")

DIALECT_ONLY_INDEXES: dict[str, str] = dict.fromkeys(NEWEST_TIME_INDEXES, "sqlite")
"""Indexes created on one dialect only (`ddl_if`), by name: Alembic's comparison must
skip them on the others."""


def include_object_for(dialect: str) -> Callable[[Any, str | None, str, bool, Any], bool]:
    """Alembic's `include_object` for `dialect`: every table and index of `metadata`,
    but an index of one dialect only nowhere else."""

    def include(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
        if type_ != "index":
            return True
        if not reflected and _ONLY_ON.get(id(obj), dialect) != dialect:
            return False  # a route index's twin for the other dialect (same name)
        only = DIALECT_ONLY_INDEXES.get(name or "")
        return only is None or only == dialect

    return include
