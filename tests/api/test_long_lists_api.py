"""A workflow may legitimately wait on many promises at once: with `--max-callback-ids`
raised, CompleteTask(suspend_on) and RegisterCallbacks take lists longer than a
statement can bind (the store splits them), on SQLite and PostgreSQL.

Before, 70,000 ids were UNAVAILABLE ("store unavailable, retry later") on
PostgreSQL, and the flag did not exist.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import grpc
import pytest
from _pg import fresh_schema
from _support import PollStream, ServerProcess, error_info, start_server

from troth.v1 import promises_pb2 as pb
from troth.v1 import promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc
from troth.v1 import types_pb2 as types
from troth_server.domain.promise import EMPTY, Promise, PromiseState
from troth_server.store import open_store

MANY = 70_000
STORED = 5_000  # more than one statement's worth of ids (4096), few enough to be quick


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def big_server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServerProcess]:
    with ExitStack() as stack:
        db_url = stack.enter_context(fresh_schema()) if request.param == "postgres" else None
        proc = start_server(
            tmp_path_factory.mktemp("long"), "--max-callback-ids", str(MANY), db_url=db_url
        )
        yield proc
        assert proc.stop() == 0, proc.log()[-3000:]


@pytest.fixture(scope="module")
def stubs(big_server: ServerProcess) -> Iterator[tuple[Any, Any]]:
    with big_server.channel() as channel:
        yield promises_pb2_grpc.PromiseServiceStub(channel), tasks_pb2_grpc.TaskServiceStub(channel)


def hold_a_task(stubs: tuple[Any, Any]) -> tuple[str, dict[str, Any], PollStream]:
    promises, tasks = stubs
    group, root = f"g-{uuid.uuid4().hex[:8]}", f"wf-{uuid.uuid4().hex[:8]}"
    poll = PollStream(tasks, tasks_pb2.PollRequest(group=group, worker_id="w1"), 15)
    promises.CreatePromise(
        pb.CreatePromiseRequest(
            id=root, tags={"troth:invoke": group, "troth:func": "fan_out"}, never_expires=True
        )
    )
    task = poll.next_response().task
    return root, {"task_id": task.id, "counter": task.counter, "worker_id": "w1"}, poll


def store_pending(server: ServerProcess, ids: list[str]) -> None:
    """Rows straight into the server's database: 5,000 creates through the API would be slow."""
    store = open_store(server.db_url)
    try:
        rows = [
            Promise(pid, PromiseState.PENDING, EMPTY, EMPTY, {}, create_time=1, expire_time=None)
            for pid in ids
        ]
        store.write(lambda tx: tx.insert_promises(rows))
    finally:
        store.close()


def test_suspending_on_more_ids_than_a_statement_binds_is_answered(
    stubs: tuple[Any, Any],
) -> None:
    _, tasks = stubs
    _, held, poll = hold_a_task(stubs)
    try:
        ids = [f"nowhere-{i}" for i in range(MANY)]
        for call, request in [
            (tasks.CompleteTask, tasks_pb2.CompleteTaskRequest(**held, suspend_on=ids)),
            (tasks.RegisterCallbacks, tasks_pb2.RegisterCallbacksRequest(**held, promise_ids=ids)),
        ]:
            with pytest.raises(grpc.RpcError) as caught:
                call(request, timeout=60)
            # The client's mistake (the promises do not exist), not the store's.
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND, caught.value.details()
            assert error_info(caught.value).reason == "NOT_FOUND"
        over = tasks_pb2.CompleteTaskRequest(**held, suspend_on=[*ids, "one-more"])
        with pytest.raises(grpc.RpcError) as caught:
            tasks.CompleteTask(over, timeout=60)
        assert error_info(caught.value).metadata["field"] == "suspend_on"
        assert f"the limit is {MANY}" in (caught.value.details() or "")
    finally:
        poll.cancel()


def test_a_workflow_suspends_on_thousands_and_resumes_on_one(
    big_server: ServerProcess, stubs: tuple[Any, Any]
) -> None:
    promises, tasks = stubs
    root, held, poll = hold_a_task(stubs)
    try:
        ids = [f"{root}-wait-{i:05}" for i in range(STORED)]
        store_pending(big_server, ids)
        registered = tasks.RegisterCallbacks(
            tasks_pb2.RegisterCallbacksRequest(**held, promise_ids=ids), timeout=60
        )
        assert list(registered.settled) == []
        done = tasks.CompleteTask(tasks_pb2.CompleteTaskRequest(**held, suspend_on=ids), timeout=60)
        assert done.task.state == tasks_pb2.TASK_STATE_COMPLETED and list(done.settled) == []
        promises.ResolvePromise(
            pb.ResolvePromiseRequest(id=ids[-1], value=types.Payload(data=b"1")), timeout=60
        )
        resume = poll.next_response()
        assert (resume.task.kind, resume.root.id) == (tasks_pb2.TASK_KIND_RESUME, root)
    finally:
        poll.cancel()
