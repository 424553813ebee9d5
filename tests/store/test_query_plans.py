"""Every statement the server runs uses an index, however long its history.

A real server (the composition root `Core` and its gRPC servicers, in this
process) serves a workload through the SDK: workflows run by a `Worker`, human
settles by id, child workflows, timers, cancels, expiry, idempotent repeats,
watches, searches of every shape the API offers, `SearchTasks`, a worker that
goes silent (its lease expires), one whose stream breaks, and pruning. A
`before_cursor_execute` listener on every SQLAlchemy engine records each
statement the store sends, with its parameters, so a statement added later
cannot escape this test.

Each recorded statement is then planned against tables holding a million rows'
worth of statistics, with the very parameters it ran with:

- SQLite: `sqlite_stat1` rows describing 1M promises (100k of them pending),
  1M tasks and 100k callbacks, reloaded with `ANALYZE sqlite_schema`; then
  `EXPLAIN QUERY PLAN`.
- PostgreSQL: its statistics cannot be written by hand (and the planner also
  looks at the relation's real size), so the tables are filled with generated
  rows shaped like an aged deployment (parked workflows, a long settled
  history, completed tasks, waiting callbacks) and `ANALYZE`d; then `EXPLAIN`
  under the default planner settings (not the writer's `enable_seqscan = off`:
  the index must be the planner's own choice).

A full scan of a large table (SQLite `SCAN promises|tasks|callbacks`,
PostgreSQL `Seq Scan on ...`) fails the test, unless the statement is in
`ALLOWED_SCANS`, where each entry says why it may.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio
import psycopg
import pytest
from _in_process import in_process_server
from _pg import fresh_schema
from _support import PollStream
from sqlalchemy import Engine, event

from troth import Client, Context, PromiseRejectedError, PromiseState, Worker
from troth.v1 import promises_pb2, promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc, types_pb2
from troth_server.store._reads import PromiseReads
from troth_server.store._sql import _WriteTx

if TYPE_CHECKING:
    from troth_server.store._bind import Statement

LARGE_TABLES = ("promises", "tasks", "callbacks")


@dataclass(frozen=True)
class Allowed:
    """A statement that may scan a large table, and why."""

    name: str
    matches: Callable[[str], bool]
    plan_ok: Callable[[str], bool]
    """The plan is the legitimate one (e.g. an ordered walk that stops at LIMIT)."""
    why: str


def _search_walk(sql: str) -> bool:
    return bool(
        re.search(r"\bFROM promises\b", sql)
        and "ORDER BY promises.seq" in sql
        and re.search(r"\bLIMIT\b", sql)
        and not re.search(r"\b(UPDATE|DELETE)\b", sql)
        # A workflow's steps (`troth export`): ix_promises_parent_seq serves it, no walk.
        and "promises.parent_id =" not in sql
    )


def _ordered_walk(plan: str) -> bool:
    # SQLite: the rowid (seq) order itself, no sort of the whole table.
    # PostgreSQL: the primary key's order (forward or backward), never a Seq Scan.
    if "Seq Scan on promises" in plan:
        return False
    return "USE TEMP B-TREE FOR ORDER BY" not in plan or "SCAN promises" not in plan


def _merged_search(sql: str) -> bool:
    return bool(
        re.match(r"SELECT anon_1\.seq, anon_1\.id\b.* FROM \(SELECT anon_\d+\.seq", sql)
        and "UNION ALL" in sql
        and re.search(r"ORDER BY anon_1\.(seq|expire_time)\b[^()]* LIMIT \S+( OFFSET \S+)?$", sql)
        and not re.search(r"\b(UPDATE|DELETE)\b", sql)
    )


def _walks_that_stop(plan: str) -> bool:
    # PostgreSQL: never a Seq Scan. SQLite: each part (a co-routine) that walks the
    # table in rowid order sorts nothing, so it stops at the page; a part that sorts
    # does so over an index's range (a state's own rows, the overdue PENDING ones).
    if "Seq Scan on promises" in plan:
        return False
    parts = re.findall(r"CO-ROUTINE (anon_\d+)\n(.*?)\nSCAN \1\b", plan, re.S)
    return all(
        not re.search(r"^SCAN promises$", body, re.M) or "USE TEMP B-TREE" not in body
        for _, body in parts
    )


def _search_tasks_claimed(sql: str) -> bool:
    return bool(
        re.search(r"FROM tasks WHERE tasks\.state = 'CLAIMED' AND tasks\.\"group\" = ", sql)
    )


def _claimed_index(plan: str) -> bool:
    return "Seq Scan" not in plan and bool(re.search(r"ix_tasks_claimed_\w+", plan))


def _live_count(sql: str) -> bool:
    # PENDING tasks are counted by group and workflow version (those waiting for one).
    by = r"tasks\.\"group\"(, tasks\.workflow, tasks\.workflow_version)?"
    return bool(
        re.match(rf"SELECT ({by}, )?count\(\*\) AS count_1 FROM (promises|tasks) "
                 rf"WHERE \w+\.state = '(PENDING|CLAIMED)'( GROUP BY {by})?$", sql)
    )  # fmt: skip


def _live_index(plan: str) -> bool:
    return "Seq Scan" not in plan and bool(
        re.search(r"ix_promises_pending_\w+|ix_tasks_pending_group|ix_tasks_claimed_\w+", plan)
    )


def _workflows_walk(sql: str) -> bool:
    return bool(
        re.search(r"\bFROM promises\b", sql)
        and "promises.workflow_group IS NOT NULL" in sql
        and "ORDER BY promises.seq" in sql
        and re.search(r"\bLIMIT\b", sql)
    )


def _roots_index(plan: str) -> bool:
    # The partial index of workflow roots, in seq order (or the paused tasks' and the
    # PENDING steps' indexes driving it); never the table, never a sort of it.
    if "Seq Scan on promises" in plan or re.search(r"^(?:.*\s)?SCAN promises$", plan, re.M):
        return False
    return bool(re.search(r"ix_promises_workflows\w*|ix_tasks_paused|ix_promises_pending_", plan))


ALLOWED_SCANS = [
    Allowed(
        "SearchWorkflows: a walk of the workflow roots",
        _workflows_walk,
        _roots_index,
        "A page of workflows whose filters no index narrows further (every workflow, a "
        "state, a name, a version, an age) walks the partial index of workflow roots "
        "(ix_promises_workflows, or ix_promises_workflows_group for one group) in seq "
        "order from the page's cursor and stops at the page size: roots only, never the "
        "steps and standalone promises of the history. The paused and waiting-for-a-human "
        "filters are driven by ix_tasks_paused and ix_promises_pending_parent instead.",
    ),
    Allowed(
        "The metrics' counts of live rows (a scrape, at most every 5 s)",
        _live_count,
        _live_index,
        "A count of the PENDING promises, or of the PENDING or CLAIMED tasks by group, "
        "walks a partial index whose rows are those live ones only, never the settled "
        "history or the completed tasks: its cost is what it counts, once per scrape "
        "and at most every 5 s (troth_server.metrics.LIVE_CACHE_S).",
    ),
    Allowed(
        "SearchTasks: the group's CLAIMED tasks",
        _search_tasks_claimed,
        _claimed_index,
        "It reads the partial index of CLAIMED tasks, whose rows are only the tasks "
        "workers hold right now (bounded by their Poll capacities), never the "
        "completed history; a per-group index of them would cost every claim and "
        "completion an index write to speed up an operator's listing.",
    ),
    Allowed(
        "SearchPromises by states: one walk per state, merged",
        _merged_search,
        _walks_that_stop,
        "A search by states runs one part per way a row can be in them (each state "
        "stored, and PENDING but past its deadline), each in the page's order and cut "
        "at the page, then merges the parts' pages. A rejected state walks its own "
        "partial index (ix_promises_rejected_seq and its siblings); RESOLVED, most of "
        "a history, walks seq order and finds its page densely; the overdue part reads "
        "the PENDING promises' indexes. No part walks the history to find a rare state.",
    ),
    Allowed(
        "SearchPromises without a selective indexed filter",
        _search_walk,
        _ordered_walk,
        "A page of a search whose filters no index serves (all promises, settled "
        "states, tags on SQLite, an id glob starting with `*`) walks promises in "
        "seq order from the page's cursor and stops at the page size: its cost is "
        "the rows it reads to fill one page, which is the search's own work, not "
        "the history's size. Searches that an index can serve (a PENDING filter, "
        "an id prefix, the deadline order) are planned like every other statement.",
    ),
]


@dataclass(frozen=True)
class Executed:
    sql: str
    params: Any


@contextmanager
def recording() -> Iterator[list[Executed]]:
    """Every statement any SQLAlchemy engine of this process sends, with its parameters."""
    seen: list[Executed] = []

    def record(
        conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
    ) -> None:
        params = parameters[0] if executemany and parameters else parameters
        seen.append(Executed(statement, params))

    # The point reads run compiled statements on the DB-API, past SQLAlchemy's events.
    point_read = PromiseReads._read_rows

    def record_point_read(
        store: PromiseReads, statement: Statement, values: Mapping[str, Any]
    ) -> list[Sequence[Any]]:
        seen.append(Executed(statement.sql, statement.params(values)))
        return point_read(store, statement, values)

    # A write transaction's statements on SQLite run on the driver, past the events too.
    on_sqlite = _WriteTx._on_sqlite

    def record_on_sqlite(tx: _WriteTx, sql: str, params: Any, *, many: bool) -> list[Any]:
        seen.append(Executed(sql, params[0] if many and params else params))
        return on_sqlite(tx, sql, params, many=many)

    event.listen(Engine, "before_cursor_execute", record)
    PromiseReads._read_rows = record_point_read  # type: ignore[method-assign]
    _WriteTx._on_sqlite = record_on_sqlite  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        _WriteTx._on_sqlite = on_sqlite  # type: ignore[method-assign]
        PromiseReads._read_rows = point_read  # type: ignore[method-assign]
        event.remove(Engine, "before_cursor_execute", record)


# -- the workload ---------------------------------------------------------------------


def _workflows(worker: Worker) -> None:
    def notify(what: str) -> str:
        return f"notified {what}"

    @worker.workflow
    def approve(ctx: Context, what: str) -> Any:
        approval = yield ctx.promise(timeout=timedelta(minutes=5))
        yield ctx.run(notify, what)
        decision = yield approval
        return {"what": what, "decision": decision}

    @worker.workflow
    def child(ctx: Context, n: int) -> Any:
        yield ctx.sleep(timedelta(milliseconds=150))
        return n * 2

    @worker.workflow
    def parent(ctx: Context) -> Any:
        doubled = yield ctx.rpc("child", 21)
        now = yield ctx.now()
        return {"doubled": doubled, "at": str(now)}


def _wait_for(client: Client, promise_id: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            client.get(promise_id)
            return
        except Exception:  # not created yet
            time.sleep(0.02)
    raise AssertionError(f"{promise_id} was never created")


def run_workload(address: str, metrics_port: int) -> None:
    group = "plans"
    with Client(address) as client:
        worker = Worker(client, group=group, lease=timedelta(seconds=2))
        _workflows(worker)
        worker.start()
        try:
            # Human-in-the-loop: start, wait for the latent promise, settle it by id.
            handles = [
                client.start("approve", f"post-{n}", id=f"hitl-{n}", group=group) for n in range(3)
            ]
            for n in range(3):
                _wait_for(client, f"hitl-{n}.0")
            client.resolve("hitl-0.0", {"ok": True}, idempotency_key="k0")
            client.resolve("hitl-0.0", {"ok": True}, idempotency_key="k0")  # a repeat
            client.reject("hitl-1.0", {"ok": False})
            handles[0].result(timeout=20)
            with pytest.raises(PromiseRejectedError):
                handles[1].result(timeout=20)
            client.handle("hitl-2").cancel()  # cancels its pending steps too
            # A child workflow with a timer, and now().
            client.start("parent", id="nested", group=group).result(timeout=20)
            # Standalone promises: repeats, expiry by the sweeper, a watch.
            client.create("alone-1", {"n": 1}, tags={"team": "a"})
            client.create("alone-1", {"n": 1}, tags={"team": "a"})
            client.create("short", ttl=timedelta(milliseconds=100))
            client.create("forever", never_expires=True)
            assert client.wait("short", timeout=10).state is PromiseState.REJECTED_TIMEDOUT
            client.resolve("alone-1", {"done": True})
            _searches(client)
            _raw_tasks(address, group)
            # A scrape: the metrics' counts of the live rows.
            url = f"http://127.0.0.1:{metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as scraped:
                assert b"troth_promises_pending" in scraped.read()
        finally:
            worker.stop()


def _searches(client: Client) -> None:
    for order in ("CREATED_ASC", "CREATED_DESC", "EXPIRE_TIME_ASC"):
        for kwargs in (
            {},
            {"states": ["PENDING"]},
            {"states": ["RESOLVED", "REJECTED_TIMEDOUT"]},
            {"tags": {"team": "a"}},
            {"id": "hitl-*"},
            {"id": "hitl-0.*"},
            {"parent_id": "hitl-0"},
            {"parent_id": "hitl-0", "states": ["RESOLVED"]},
            {"id": "*", "states": ["PENDING"], "tags": {"troth:kind": "promise"}},
        ):
            first = client.search(order=order, page_size=1, **kwargs)  # type: ignore[arg-type]
            if first.next_page_token:
                client.search(
                    order=order,  # type: ignore[arg-type]
                    page_size=1,
                    page_token=first.next_page_token,
                    **kwargs,  # type: ignore[arg-type]
                )
    client.search(older_than=timedelta(seconds=1))
    _workflow_searches(client)


def _workflow_searches(client: Client) -> None:
    """SearchWorkflows of every shape: each filter alone and some together, a page
    and the next, both orders (the roots' own indexes, never the history)."""
    for newest_first in (True, False):
        for kwargs in (
            {},
            {"group": "plans"},
            {"states": ["PENDING"]},
            {"states": ["RESOLVED", "REJECTED_TIMEDOUT"]},
            {"group": "plans", "states": ["PENDING"]},
            {"workflow": "approve"},
            {"group": "plans", "workflow": "approve", "version": "v1"},
            {"paused": True},
            {"group": "plans-raw", "paused": True},
            {"waiting_for_human": True},
            {"group": "plans", "waiting_for_human": True},
            {"id": "hitl-*"},
            {"created_after": datetime.now(UTC) - timedelta(hours=1)},
            {"created_before": datetime.now(UTC)},
        ):
            walked = client.iter_workflows(newest_first=newest_first, page_size=1, **kwargs)  # type: ignore[arg-type]
            for _ in zip(range(2), walked, strict=False):
                pass


def _raw_tasks(address: str, group: str) -> None:
    """What the SDK's worker does not do on its own: a lease that runs out, a broken
    stream, a release, RegisterCallbacks, SearchTasks."""
    with grpc.insecure_channel(address) as channel:
        promises = promises_pb2_grpc.PromiseServiceStub(channel)
        tasks = tasks_pb2_grpc.TaskServiceStub(channel)
        other = f"{group}-raw"
        for n in range(3):
            promises.CreatePromise(
                promises_pb2.CreatePromiseRequest(
                    id=f"raw-{n}", tags={"troth:invoke": other, "troth:func": "raw"}
                )
            )
        tasks.SearchTasks(tasks_pb2.SearchTasksRequest(group=other))
        silent = PollStream(
            tasks,
            tasks_pb2.PollRequest(group=other, worker_id="silent", capacity=1, lease=_ms(1000)),
            wait=20,
        )
        got = silent.next_response().task
        # It never heartbeats: the sweeper takes the lease back and the task returns.
        again = PollStream(
            tasks, tasks_pb2.PollRequest(group=other, worker_id="hands", capacity=3), wait=20
        )
        held = [again.next_response().task for _ in range(3)]
        assert got.id in {t.id for t in held}
        tasks.Heartbeat(tasks_pb2.HeartbeatRequest(worker_id="hands"))
        first, second, third = held
        fence = {"task_id": first.id, "counter": first.counter, "worker_id": "hands"}
        step = f"{first.root_promise_id}.0"
        promises.CreatePromise(
            promises_pb2.CreatePromiseRequest(id=step, fence=types_pb2.TaskFence(**fence))
        )
        tasks.RegisterCallbacks(tasks_pb2.RegisterCallbacksRequest(**fence, promise_ids=[step]))
        tasks.CompleteTask(tasks_pb2.CompleteTaskRequest(**fence))
        tasks.CompleteTask(tasks_pb2.CompleteTaskRequest(**fence))  # a repeat
        promises.ResolvePromise(promises_pb2.ResolvePromiseRequest(id=step))  # resumes it
        tasks.ReleaseTask(
            tasks_pb2.ReleaseTaskRequest(
                task_id=second.id, counter=second.counter, worker_id="hands"
            )
        )
        # A bug in the workflow's code: the task fails (back after a backoff, which the
        # claims then skip), an operator looks at it and fails the workflow.
        back = again.next_response().task
        while back.id != second.id:
            back = again.next_response().task
        tasks.FailTask(
            tasks_pb2.FailTaskRequest(
                task_id=back.id,
                counter=back.counter,
                worker_id="hands",
                error="NameError: name 'x' is not defined",
                traceback="Traceback (most recent call last): ...",
            )
        )
        tasks.SearchTasks(
            tasks_pb2.SearchTasksRequest(group=other, root_promise_id=back.root_promise_id)
        )
        # ...or moves it to another version first (it waits out its backoff: PENDING).
        tasks.MoveWorkflow(tasks_pb2.MoveWorkflowRequest(id=back.root_promise_id, to_version="v9"))
        # ...or lists the paused ones and retries one now (its reads and write run either
        # way: "hands" may hold it again already, and then it is refused).
        tasks.SearchWorkflows(tasks_pb2.SearchWorkflowsRequest(group=other, paused=True))
        try:
            tasks.RetryWorkflowNow(tasks_pb2.RetryWorkflowNowRequest(id=back.root_promise_id))
        except grpc.RpcError as refused:
            assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION, refused
        tasks.FailWorkflow(tasks_pb2.FailWorkflowRequest(id=back.root_promise_id, reason="no"))
        tasks.CompleteTask(
            tasks_pb2.CompleteTaskRequest(
                task_id=third.id,
                counter=third.counter,
                worker_id="hands",
                resolve_root=types_pb2.Payload(data=b"1"),
            )
        )
        tasks.SearchTasks(tasks_pb2.SearchTasksRequest(group=other))
        again.cancel()  # a broken stream: its tasks go back at once
        silent.cancel()
        time.sleep(0.3)  # a few sweeper ticks with tasks to look at
        # Retention on demand (the sweeper's own runs with the default 30 days every tick).
        for dry_run in (True, False):
            promises.PrunePromises(
                promises_pb2.PrunePromisesRequest(older_than=_ms(0), dry_run=dry_run)
            )


def _ms(ms: int) -> Any:
    from google.protobuf.duration_pb2 import Duration

    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


# -- plans ----------------------------------------------------------------------------


def _table_statements(seen: list[Executed]) -> dict[str, Executed]:
    """One example of each distinct statement that reads or writes a large table
    (plain inserts excepted: they never scan)."""
    found: dict[str, Executed] = {}
    for executed in seen:
        sql = " ".join(executed.sql.split())
        if not any(re.search(rf"\b{t}\b", sql) for t in LARGE_TABLES):
            continue
        if not re.match(r"(SELECT|UPDATE|DELETE|WITH|INSERT)\b", sql):
            continue  # DDL (migrations), PRAGMAs, transaction control
        if re.match(r"INSERT INTO \w+ \(", sql) and " SELECT " not in sql.upper():
            continue
        found.setdefault(sql, executed)
    return found


# Statistics of an aged SQLite database: 1M promises (100k parked workflows with a
# pending step each, the rest a settled history), 1M tasks, 100k callbacks.
_SQLITE_STATS = {
    "promises": 1_000_000,
    "promise_tags": 2_000_000,
    "tasks": 1_000_000,
    "callbacks": 100_000,
}
_SQLITE_INDEX_STATS = {
    "sqlite_autoindex_promises_1": "1000000 1",
    "ix_promises_pending_expire_time": "200000 2",
    "ix_promises_parent_seq": "1000000 5 1",
    "ix_promises_pending_parent": "100000 1",
    "ix_promises_pending_seq": "200000 1",
    "ix_promises_expire_seq": "1000000 2 1",
    "ix_promises_root": "800000 5",
    "ix_promises_settled_top": "200000 2 1",
    "ix_promises_workflows": "300000 1",
    "ix_promises_rejected_seq": "50000 1",
    "ix_promises_canceled_seq": "10000 1",
    "ix_promises_timedout_seq": "10000 1",
    "ix_promises_workflows_group": "300000 100000 1",
    "sqlite_autoindex_tasks_1": "1000000 1",
    "ix_tasks_pending_group": "1000 200 1",
    "ix_tasks_claimed_lease": "1000 1",
    "ix_tasks_claimed_worker": "1000 10",
    "ux_tasks_active_root": "2000 1",
    "ix_tasks_root": "1000000 3",
    "ix_tasks_completed": "1000000 1",
    "ix_tasks_paused": "100 1",
    "ix_tasks_ready_preferred": "1000 200 10 1",
    "ix_tasks_ready_anyone": "1000 200 1",
    "ix_tasks_ready_promised": "100 20 1",
    "ix_tasks_backoff": "100 20 1",
    "ix_tasks_route_ready": "1000 200 100 50 10 1",
    "ix_tasks_route_promised": "100 20 10 5 1",
    "ix_tasks_route_backoff": "100 20 10 5 1",
    "sqlite_autoindex_callbacks_1": "100000 1 1",
    "ix_callbacks_root": "100000 1",
    # Two tags a promise, a few thousand promises a tag.
    "sqlite_autoindex_promise_tags_1": "2000000 2 1",
    "ix_promise_tags_walk": "2000000 20000 5000 1",
    # The newest time stored, read at a start.
    "ix_promises_create_time": "1000000 1",
    "ix_promises_settle_time": "1000000 1",
    "ix_tasks_create_time": "1000000 1",
    "ix_callbacks_create_time": "100000 1",
}


def _sqlite_plans(path: str, statements: dict[str, Executed]) -> dict[str, str]:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA case_sensitive_like=ON")  # as the server's connections
        conn.execute("ANALYZE")
        conn.execute("DELETE FROM sqlite_stat1")
        indexes = conn.execute(
            "SELECT tbl_name, name FROM sqlite_schema WHERE type = 'index'"
        ).fetchall()
        for table, index in indexes:
            if table not in _SQLITE_STATS:
                continue
            stat = _SQLITE_INDEX_STATS.get(index)
            assert stat is not None, f"give index {index} statistics in _SQLITE_INDEX_STATS"
            conn.execute("INSERT INTO sqlite_stat1 VALUES (?, ?, ?)", (table, index, stat))
        for table, rows in _SQLITE_STATS.items():
            conn.execute("INSERT INTO sqlite_stat1 VALUES (?, NULL, ?)", (table, str(rows)))
        conn.commit()
        conn.execute("ANALYZE sqlite_schema")
        plans = {}
        for sql, executed in statements.items():
            rows = conn.execute("EXPLAIN QUERY PLAN " + executed.sql, executed.params or ())
            plans[sql] = "\n".join(str(row[-1]) for row in rows)
        return plans
    finally:
        conn.close()


_PG_FILL = [
    # 100k parked workflows: a pending root and its pending latent step.
    """INSERT INTO promises (id, state, param_headers, param_data, value_headers, value_data,
         tags, timer, create_time, expire_time, root_id, parent_id, workflow_group,
         workflow_name)
       SELECT 'park-' || g || s.suffix, 'PENDING', '{}', '', '{}', '',
         CASE WHEN s.suffix = '' THEN '{"troth:invoke": "parked", "troth:func": "approve"}'::jsonb
              ELSE '{"troth:kind": "promise"}'::jsonb END,
         false, 1000 + g, 4000000000000 + g,
         CASE WHEN s.suffix = '' THEN NULL ELSE 'park-' || g END,
         CASE WHEN s.suffix = '' THEN NULL ELSE 'park-' || g END,
         CASE WHEN s.suffix = '' THEN 'parked' END,
         CASE WHEN s.suffix = '' THEN 'approve' END
       FROM generate_series(1, 100000) g, (VALUES (''), ('.0')) s(suffix)""",
    # 200k finished workflows of 4 settled steps each: 1M rows of history.
    """INSERT INTO promises (id, state, param_headers, param_data, value_headers, value_data,
         tags, timer, create_time, settle_time, expire_time, settled_by, root_id, parent_id,
         workflow_group, workflow_name)
       SELECT 'done-' || g || s.suffix, 'RESOLVED', '{}', '', '{}', '',
         CASE WHEN s.suffix = '' THEN '{"troth:invoke": "done", "troth:func": "approve"}'::jsonb
              ELSE '{"troth:kind": "run"}'::jsonb END,
         false, 2000 + g, 3000 + g, 4000000000000 + g, 'w',
         CASE WHEN s.suffix = '' THEN NULL ELSE 'done-' || g END,
         CASE WHEN s.suffix = '' THEN NULL ELSE 'done-' || g END,
         CASE WHEN s.suffix = '' THEN 'done' END,
         CASE WHEN s.suffix = '' THEN 'approve' END
       FROM generate_series(1, 200000) g,
         (VALUES (''), ('.0'), ('.1'), ('.2'), ('.3')) s(suffix)""",
    # Their tasks, completed (as they accumulated before completed tasks were deleted).
    """INSERT INTO tasks (id, root_promise_id, "group", kind, state, counter, resume_pending,
         create_time, workflow)
       SELECT 'done-task-' || g || '-' || k, 'done-' || g, 'done', 'RESUME', 'COMPLETED', 1,
         false, 2000 + g, 'approve'
       FROM generate_series(1, 200000) g, generate_series(1, 5) k""",
    # A few paused workflows among the parked ones: their task's code failed.
    """INSERT INTO tasks (id, root_promise_id, "group", kind, state, counter, resume_pending,
         create_time, workflow, failed_attempts, last_error, next_attempt_time)
       SELECT 'park-task-' || g, 'park-' || g, 'parked', 'RESUME', 'PENDING', 1, false,
         1000 + g, 'approve', 3, 'NameError: x', 4000000000000 + g
       FROM generate_series(1, 100) g""",
    # The parked workflows' callbacks.
    """INSERT INTO callbacks (promise_id, root_promise_id, "group", worker_id, create_time)
       SELECT 'park-' || g || '.0', 'park-' || g, 'parked', 'w', 1000 + g
       FROM generate_series(1, 100000) g""",
]


def _pg_plans(url: str, statements: dict[str, Executed]) -> dict[str, str]:
    conninfo = url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        # Building each index once over the filled table is several times faster
        # than maintaining it row by row (the GIN index over tags above all).
        indexes = conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()"
            " AND indexname NOT IN (SELECT conname FROM pg_constraint)"
        ).fetchall()
        conn.execute("SET synchronous_commit = off")
        conn.execute("SET maintenance_work_mem = '128MB'")
        for name, _ in indexes:
            conn.execute(f'DROP INDEX "{name}"')
        for fill in _PG_FILL:
            conn.execute(fill)
        for _, definition in indexes:
            conn.execute(definition)
        for table in LARGE_TABLES:
            conn.execute(f"ANALYZE {table}")
        plans = {}
        for sql, executed in statements.items():
            rows = conn.execute("EXPLAIN " + executed.sql, executed.params or None).fetchall()
            plans[sql] = "\n".join(str(row[0]) for row in rows)
        return plans


def _scans(plan: str) -> list[str]:
    found = []
    for table in LARGE_TABLES:
        if re.search(rf"^(?:.*\s)?SCAN {table}\b", plan, re.MULTILINE) or re.search(
            rf"Seq Scan on {table}\b", plan
        ):
            found.append(table)
    return found


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/plans.db"
    else:
        with fresh_schema() as url:
            yield url


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_statement_of_a_workload_uses_an_index(db_url: str) -> None:
    # From the server's start on (its migrations and start-up reads run once, not per
    # request), until after it stopped (the release of held tasks on shutdown).
    with in_process_server(db_url) as (address, metrics_port), recording() as seen:
        run_workload(address, metrics_port)
    statements = _table_statements(seen)
    assert len(statements) > 20, f"the workload ran too few statements: {list(statements)}"
    if db_url.startswith("sqlite"):
        plans = _sqlite_plans(db_url.removeprefix("sqlite:///"), statements)
    else:
        plans = _pg_plans(db_url, statements)
    failures = []
    if os.environ.get("TROTH_SHOW_PLANS"):
        for sql, plan in plans.items():
            print(f"{sql[:300]}\n    " + plan.replace("\n", "\n    "))
    for sql, plan in plans.items():
        scanned = _scans(plan)
        if not scanned:
            continue
        allowed = next((a for a in ALLOWED_SCANS if a.matches(sql)), None)
        if allowed is not None and allowed.plan_ok(plan):
            continue
        failures.append(
            f"{sql}\n  scans {', '.join(scanned)}:\n    " + plan.replace("\n", "\n    ")
        )
    assert not failures, f"{len(failures)} statements scan a large table:\n\n" + "\n\n".join(
        failures
    )
