"""After the fuzzer: does the store still hold only rows that read back?

I/O: reads the server's database directly (SQLite file or PostgreSQL schema)
and through the server. SQLite must pass `PRAGMA integrity_check` and
`foreign_key_check`; on both stores every promise row must be found by a
search over everything and read back with `GetPromise`, every row's JSON
columns must decode, every task must name a known kind, state and existing
root, and every task not completed must be listed by `SearchTasks` of its group.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from typing import TYPE_CHECKING, Any

import grpc
import psycopg

from troth.v1 import promises_pb2, promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc, types_pb2

if TYPE_CHECKING:
    from _support import ServerProcess

_STATES = {"PENDING", "RESOLVED", "REJECTED", "REJECTED_CANCELED", "REJECTED_TIMEDOUT"}
_TASK_KINDS = {"INVOKE", "RESUME"}
_TASK_STATES = {"PENDING", "CLAIMED", "COMPLETED"}
_PROMISE_COLUMNS = "id, state, param_headers, value_headers, tags"
_TASK_COLUMNS = 'id, root_promise_id, "group", kind, state, counter'


def _rows(server: ServerProcess, sql: str) -> list[tuple[Any, ...]]:
    url = server.db_url
    if url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///")
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
            return conn.execute(sql).fetchall()
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://", 1)) as conn:
        return list(conn.execute(sql).fetchall())


def sqlite_checks(server: ServerProcess) -> list[str]:
    if not server.db_url.startswith("sqlite:///"):
        return []
    found = []
    integrity = _rows(server, "PRAGMA integrity_check")
    if integrity != [("ok",)]:
        found.append(f"PRAGMA integrity_check: {integrity[:10]}")
    foreign = _rows(server, "PRAGMA foreign_key_check")
    if foreign:
        found.append(f"PRAGMA foreign_key_check: {foreign[:10]}")
    return found


def _decodes(value: Any) -> bool:
    if isinstance(value, dict):
        return True  # JSONB, decoded by the driver
    try:
        return isinstance(json.loads(value), dict)
    except (TypeError, ValueError):
        return False


def promise_checks(server: ServerProcess, channel: grpc.Channel) -> list[str]:
    stub = promises_pb2_grpc.PromiseServiceStub(channel)
    found: list[str] = []
    rows = _rows(server, f"SELECT {_PROMISE_COLUMNS} FROM promises")
    for promise_id, state, *json_columns in rows:
        if state not in _STATES:
            found.append(f"promise {promise_id!r}: state {state!r}")
        if not all(_decodes(v) for v in json_columns):
            found.append(f"promise {promise_id!r}: a JSON column does not decode")
    stored = {row[0] for row in rows}
    listed: set[str] = set()
    token = ""
    while True:
        page = stub.SearchPromises(
            promises_pb2.SearchPromisesRequest(page_size=1000, page_token=token), timeout=30
        )
        listed.update(p.id for p in page.promises)
        token = page.next_page_token
        if not token:
            break
    if stored != listed:
        found.append(
            f"search over everything lists {len(listed)} promises, the store holds "
            f"{len(stored)}; missing {sorted(stored - listed)[:10]}, extra "
            f"{sorted(listed - stored)[:10]}"
        )
    for promise_id in sorted(stored):
        try:
            got = stub.GetPromise(promises_pb2.GetPromiseRequest(id=promise_id), timeout=30)
        except grpc.RpcError as error:
            found.append(f"GetPromise({promise_id!r}): {error.code().name} {error.details()}")
            continue
        if got.promise.id != promise_id or got.promise.state == types_pb2.PROMISE_STATE_UNSPECIFIED:
            found.append(f"GetPromise({promise_id!r}) read back {got.promise}")
    return found


def task_checks(server: ServerProcess, channel: grpc.Channel) -> list[str]:
    stub = tasks_pb2_grpc.TaskServiceStub(channel)
    found: list[str] = []
    roots = {row[0] for row in _rows(server, "SELECT id FROM promises")}
    rows = _rows(server, f"SELECT {_TASK_COLUMNS} FROM tasks")
    open_by_group: dict[str, set[str]] = {}
    for task_id, root, group, kind, state, counter in rows:
        if kind not in _TASK_KINDS or state not in _TASK_STATES or counter < 0:
            found.append(f"task {task_id!r}: kind {kind!r}, state {state!r}, counter {counter}")
        if root not in roots:
            found.append(f"task {task_id!r}: its root {root!r} is not in the store")
        if state != "COMPLETED":
            open_by_group.setdefault(group, set()).add(task_id)
    for group, task_ids in sorted(open_by_group.items()):
        try:
            listed = stub.SearchTasks(
                tasks_pb2.SearchTasksRequest(group=group, page_size=1000), timeout=30
            )
        except grpc.RpcError as error:
            found.append(f"SearchTasks({group!r}): {error.code().name} {error.details()}")
            continue
        missing = task_ids - {t.id for t in listed.tasks}
        if missing and len(listed.tasks) < 1000:
            found.append(f"SearchTasks({group!r}) does not list {sorted(missing)[:10]}")
    for promise_id, root in _rows(server, "SELECT promise_id, root_promise_id FROM callbacks"):
        if root not in roots:
            found.append(f"callback {promise_id!r} -> {root!r}: the root is not in the store")
    return found


def check_store(server: ServerProcess) -> list[str]:
    """Every integrity problem found (empty: the store is sound)."""
    with grpc.insecure_channel(server.address) as channel:
        return [
            *sqlite_checks(server),
            *promise_checks(server, channel),
            *task_checks(server, channel),
        ]
