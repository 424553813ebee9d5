"""Persistence of promises: the `Store` seam, its records and errors.

The service layer only ever talks to a `Store`. `open_store(url)` picks the
dialect; SQL lives nowhere outside this package, and driver exceptions never
leave it (they become `StoreError`s).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Sequence
    from contextlib import AbstractContextManager

    from troth_server.domain.promise import Promise, PromiseState
    from troth_server.domain.routing import Route
    from troth_server.domain.schedules import Schedule
    from troth_server.domain.states import WorkflowState
    from troth_server.domain.task import Callback, Task

T = TypeVar("T")


class StoreError(Exception):
    """The store could not carry out an operation; nothing was committed."""


class StoreUnavailable(StoreError):
    """The database cannot be reached or refused the write; retrying later may work."""


class CommitOutcomeUnknown(StoreUnavailable):
    """The connection was lost during COMMIT: the write may or may not have happened."""


class SchemaBehind(StoreError):
    """The database schema is older than this server's: `troth db upgrade` first."""


class SchemaTooNew(StoreError):
    """The database was migrated by a newer troth-server than this one."""


class PromiseOrder(enum.Enum):
    """The order of search results; ties (and only ties) are broken by insertion order."""

    CREATED_ASC = "CREATED_ASC"
    CREATED_DESC = "CREATED_DESC"
    EXPIRE_TIME_ASC = "EXPIRE_TIME_ASC"
    """Soonest expire_time first; promises that never expire come last."""


@dataclass(frozen=True, slots=True)
class PromiseQuery:
    """A search: id glob (`*` wildcard), states as a reader sees them, exact tags.

    A page starts after the row its cursor names, in the query's order: the
    row `after_seq` (0: from the start) whose expire_time was
    `after_expire_time` (for EXPIRE_TIME_ASC; None there means the cursor row
    never expires, so only never-expiring rows follow it).
    """

    id_glob: str
    states: frozenset[PromiseState]
    tags: dict[str, str]
    after_seq: int
    limit: int
    order: PromiseOrder = PromiseOrder.CREATED_ASC
    after_expire_time: int | None = None
    created_before: int | None = None
    """Only promises whose create_time is earlier than this (ms), when given."""
    id_prefixes: tuple[str, ...] = ()
    """Only ids starting with one of these, when given (a scoped principal's search)."""
    parent_id: str | None = None
    """Only the steps of this workflow (`parent_id` is it), when given: by record, so a
    step with an explicit id is found too (`troth export`)."""


@dataclass(frozen=True, slots=True)
class WorkflowQuery:
    """A search of workflows (the roots tagged `troth:invoke`, by `workflow_group`):
    every filter given narrows it; a page starts after the row `after_seq` (0: from the
    start) in creation order, newest first unless `newest_first` is False."""

    limit: int
    after_seq: int = 0
    newest_first: bool = True
    id_glob: str = "*"
    states: frozenset[PromiseState] = frozenset()
    """The root's state as a reader sees it (an expired PENDING row is settled)."""
    groups: tuple[str, ...] | None = None
    """Only these groups' workflows, when given (a filter, or a worker's reach)."""
    workflow: str | None = None
    version: str | None = None
    paused: bool = False
    """Only those whose task failed (`failed_attempts` > 0) and is not completed."""
    waiting_for_human: bool = False
    """Only PENDING ones with a PENDING step no worker settles (`HUMAN_STEP_KINDS`)."""
    created_after: int | None = None
    """Only those created at or after this time (ms)."""
    created_before: int | None = None
    """Only those created before this time (ms)."""
    id_prefixes: tuple[str, ...] = ()
    """Only ids starting with one of these, when given (a scoped principal's search)."""


@dataclass(frozen=True, slots=True)
class SearchRow:
    seq: int
    promise: Promise


@dataclass(frozen=True, slots=True)
class PruneBatch:
    """What one retention batch deleted (or, in a dry run, would delete)."""

    promises: int
    """Rows: each pruned workflow's root and all its steps, and the standalone promises."""
    workflows: int
    standalone: int
    after: tuple[int, int] | None
    """(settle_time, seq) of the last candidate looked at, where the next batch starts;
    None once no candidate is left."""


@dataclass(frozen=True, slots=True)
class LiveCounts:
    """What is alive in the store now, for the metrics (`troth_server.metrics`)."""

    pending_promises: int
    """PENDING rows (some may be overdue and not yet expired by the sweeper)."""
    tasks: dict[tuple[str, str], int]
    """(state, group) -> tasks PENDING or CLAIMED (completed ones are not counted)."""
    versioned: dict[tuple[str, str, str], int] = field(default_factory=dict)
    """(group, workflow, version) -> PENDING tasks bound to that version of their code."""


class WriteTx(Protocol):
    """Statements available inside one write transaction.

    On a dialect with `row_locks`, every row read through it is locked for the
    transaction (another replica's transaction on it waits), except where a
    method says otherwise.
    """

    row_locks: bool

    def final_writes(self) -> AbstractContextManager[None]:
        """The transaction's last statements: the writes run inside go to the database
        with its COMMIT, together, their outcomes awaited once at the end (PostgreSQL:
        one round trip on libpq's pipeline instead of one per statement and one for
        the commit); an error of any of them is raised there, as the store's retry
        rules expect it. So no statement inside may need another's rows, and nothing
        may run in the transaction after it."""

    def database_time(self) -> int | None:
        """The database's clock now, in ms since the epoch, read inside this transaction;
        None where the database keeps no clock of its own (SQLite: the server's decides)."""

    def get_promises(self, ids: Collection[str]) -> dict[str, Promise]: ...

    def insert_promises(self, promises: Sequence[Promise]) -> None: ...

    def update_promises(self, promises: Sequence[Promise]) -> None:
        """Write every column but the id, create_time and expire_time: a settlement,
        or a rewrite (an early settle adopted, a root's workflow version recorded)."""

    def expired_promise_ids(self, now: int, limit: int) -> list[str]:
        """Up to `limit` PENDING promises overdue at `now`, locked for this transaction;
        rows another transaction holds are skipped (its replica is expiring them)."""

    def announce(
        self,
        groups: Collection[str],
        settled_ids: Collection[str],
        created_ids: Collection[str] = (),
    ) -> None:
        """Tell the other replicas, when this transaction commits, which groups have
        new PENDING tasks and which promises settled or were created (nothing to do
        on SQLite)."""

    def pending_step_ids(self, parent_ids: Collection[str]) -> list[str]:
        """Ids of the PENDING promises whose parent_id is one of these (a settling root
        takes them along), unlocked."""

    def get_callbacks(self, promise_ids: Collection[str]) -> list[Callback]: ...

    def insert_callbacks(self, callbacks: Sequence[Callback], now: int) -> None:
        """Register callbacks; one already registered is left as it is."""

    def delete_callbacks(self, promise_ids: Collection[str], root_ids: Collection[str]) -> None:
        """Drop the callbacks of settled promises and of finished roots."""

    def get_tasks(self, task_ids: Collection[str], *, lock: bool = True) -> dict[str, Task]:
        """The tasks by id; with `lock=False` unlocked (to learn their roots, which
        are locked first: promises before tasks, the one lock order of every write)."""

    def get_active_tasks(self, root_ids: Collection[str]) -> dict[str, Task]:
        """The PENDING or CLAIMED task of each root that has one, by root id."""

    def get_states(self, keys: Collection[tuple[str, str]]) -> dict[tuple[str, str], WorkflowState]:
        """The workflow state slots among these (root id, name) keys that exist (read
        after their roots are locked: a slot is written only under its root's lock)."""

    def put_states(self, states: Sequence[WorkflowState]) -> None:
        """Write these slots (inserted, or over the row of the same root and name)."""

    def pending_tasks(
        self, group: str, prefer_worker: str, limit: int, route: Route = ..., now: int | None = ...
    ) -> list[Task]:
        """The group's PENDING tasks that `route` accepts (default: any) and that are
        past their retry backoff at `now` (default: any), locked and skipping rows
        another transaction holds: preferring `prefer_worker`, then preferring nobody,
        then preferring another worker; oldest first within each."""

    def root_workflows(self, root_ids: Collection[str]) -> dict[str, tuple[str | None, str | None]]:
        """(workflow name, version) of each of these roots that exists, unlocked."""

    def claimed_tasks(
        self, worker_id: str, group: str | None = None, *, lock: bool = True
    ) -> list[Task]:
        """The worker's CLAIMED tasks (a heartbeat's), or those of one group (a broken
        stream's)."""

    def lease_expired_tasks(
        self, now: int, limit: int, back_since: int | None = None
    ) -> list[Task]:
        """CLAIMED tasks whose lease ran out at `now` (`task.lease_expired`: and one
        lease length has passed since `back_since`), locked, skipping rows another
        transaction holds."""

    def insert_tasks(self, tasks: Sequence[Task], now: int) -> None: ...

    def update_tasks(self, tasks: Sequence[Task], now: int) -> None:
        """Write the tasks' changes; one that became COMPLETED records `now` as when."""

    def delete_completed_tasks(self, completed_before: int, limit: int) -> int:
        """Delete up to `limit` tasks COMPLETED at or before `completed_before` (rows
        another transaction holds are skipped); returns how many."""

    def prune_settled(
        self, settled_before: int, after: tuple[int, int] | None, limit: int, *, delete: bool
    ) -> PruneBatch:
        """Retention, one batch: of the next `limit` settled top-level promises settled at
        or before `settled_before` (after the (settle_time, seq) `after`), delete the
        standalone ones and the finished workflows (no active task, every step settled
        by then) with their whole tree; with `delete` False only count them."""

    # Schedules (`store/_schedules.py`).
    def due_schedules(self, now: int, limit: int) -> list[Schedule]:
        """Up to `limit` active schedules due at `now`, soonest first, locked, skipping
        rows another transaction holds."""

    def get_schedule(self, name: str) -> Schedule | None:
        """The schedule, locked for this transaction."""

    def insert_schedule(self, schedule: Schedule) -> None: ...

    def update_schedules(self, items: Sequence[Schedule]) -> None: ...

    def delete_schedule(self, name: str) -> bool: ...


class Store(Protocol):
    def write(self, work: Callable[[WriteTx], T]) -> T:
        """Run `work` in one transaction and commit it before returning."""

    def database_time(self) -> int | None:
        """The database's clock now (ms since the epoch), or None where it keeps no
        clock of its own (SQLite)."""

    def newest_time(self) -> int:
        """The newest time stored (creates, settles, claims, heartbeats; 0 when
        empty): a server's clock never starts behind it."""

    def get_promise(self, promise_id: str) -> Promise | None: ...

    def search_promises(self, query: PromiseQuery, now: int) -> list[SearchRow]: ...

    def expired_promise_ids(self, now: int, limit: int) -> list[str]:
        """Ids of PENDING promises whose expire_time is at or before `now`, oldest first."""

    def promise_tree(self, root_id: str) -> tuple[Promise | None, list[Promise]]:
        """The root promise and its steps (parent_id = root_id), in creation order:
        a child workflow's steps are in the child's tree, not its parent's."""

    def get_promises(self, ids: Collection[str]) -> list[Promise]:
        """The promises among `ids` that exist (no lock, no transaction)."""

    def claimed_task_ids(self, worker_ids: Collection[str]) -> set[tuple[str, str]]:
        """(worker id, task id) of every task CLAIMED by one of these workers."""

    def search_workflows(self, query: WorkflowQuery, now: int) -> list[SearchRow]:
        """Up to `query.limit` workflow roots matching `query`, in its order, read by the
        partial indexes of workflow roots (never the whole history)."""

    def active_tasks(self, root_ids: Collection[str]) -> dict[str, Task]:
        """The PENDING or CLAIMED task of each of these roots that has one, by root id."""

    def pending_steps(self, parent_ids: Collection[str]) -> list[Promise]:
        """The PENDING promises whose parent_id is one of these, in creation order."""

    def workflow_state(self, root_id: str, name: str) -> WorkflowState | None:
        """Workflow `root_id`'s state slot `name`, if it was ever written."""

    def search_tasks(self, group: str, limit: int, root_id: str | None = None) -> list[Task]:
        """Up to `limit` of the group's PENDING and CLAIMED tasks, oldest first; with
        `root_id`, only that root's (at most one: its active task)."""

    def live_counts(self) -> LiveCounts:
        """Counts of the live rows by the partial indexes of live rows (never the
        settled history): PENDING promises, PENDING and CLAIMED tasks by group."""

    def read_schedule(self, name: str) -> Schedule | None: ...

    def soonest_fire_time(self) -> int | None:
        """When the next active schedule fires (ms; None: none is active)."""

    def list_schedules(self, after: str, limit: int) -> list[Schedule]:
        """Up to `limit` schedules whose name sorts after `after`, by name."""

    @property
    def shared(self) -> bool:
        """Whether other server processes may write to this database (replicas)."""

    def listen(self, on_event: Callable[[StoreEvent], None]) -> None:
        """Call `on_event` (from a thread of the store's) for every `announce` that
        another replica commits; a `StoreEvent` with `resync` set after a gap in which
        announcements may have been missed. Does nothing where `shared` is False."""

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class StoreEvent:
    """What another replica committed: see `WriteTx.announce`."""

    groups: frozenset[str] = frozenset()
    settled_ids: tuple[str, ...] = ()
    resync: bool = False
    """Announcements may have been lost (the listener reconnected): recheck everything."""
    created_ids: tuple[str, ...] = ()


def open_store(
    url: str,
    *,
    sqlite_synchronous: str = "FULL",
    read_pool_size: int = 8,
    migrate: bool = False,
    application_name: str = "troth-server",
    listen_url: str | None = None,
    transaction_pooling: bool = False,
    processes: int = 1,
) -> Store:
    """Open the store at `url`: `sqlite:///PATH` (embedded; always migrated to this
    server's schema) or `postgresql+psycopg://...` (migrated only with `migrate`;
    otherwise a schema that is behind raises `SchemaBehind`).

    PostgreSQL: replicas hear each other's commits on a connection of their own,
    to `listen_url` (default `url`), which must keep its session (LISTEN): PostgreSQL
    directly or a session-mode pool. `transaction_pooling`: `url` goes through a
    transaction-mode pooler; nothing is prepared and no setting kept per session.
    `processes`: how many server processes of this machine share `url` (`troth serve
    --processes`); a SQLite file shared by several is `shared` (`store._processes`)."""
    from troth_server.store import _sql

    return _sql.open_sql_store(
        url,
        sqlite_synchronous=sqlite_synchronous,
        read_pool_size=read_pool_size,
        migrate=migrate,
        application_name=application_name,
        listen_url=listen_url,
        transaction_pooling=transaction_pooling,
        processes=processes,
    )


def shared_clock_path(url: str) -> str | None:
    """Where the processes serving the SQLite database at `url` keep their one clock
    (`clock.ClockFile`, beside the database); None for PostgreSQL, whose clock is the
    database's own."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return None
    from troth_server.store._processes import sidecar

    return str(sidecar(parsed.database, "clock"))


class Held(Protocol):
    def fileno(self) -> int: ...

    def close(self) -> None: ...


def supervise_alone(url: str) -> Held | None:
    """The SQLite file at `url` for a supervisor of several processes alone, until
    closed (None for PostgreSQL, whose replicas may be any number of anything).

    Raises:
        StoreError: Another server serves it.
    """
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return None
    from troth_server.store._processes import ServingLock

    return ServingLock(parsed.database, supervisor=True)
