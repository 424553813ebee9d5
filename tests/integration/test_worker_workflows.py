"""Workflows run by a real Worker (threads in this process) against a real server subprocess.

The `server` fixture (tests/conftest.py) runs each test on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Generator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from _support import append, eventually, exists, lines

from troth import (
    Cancelled,
    Client,
    Context,
    PromiseRejectedError,
    PromiseState,
    PromiseTimedOutError,
    RetryPolicy,
    Worker,
)
from troth.errors import DeadlineExceededError

if TYPE_CHECKING:
    from _support import ServerProcess


def approval_flow(ctx: Context, path: str, post: str) -> Generator[Any, Any, dict[str, Any]]:
    approval = yield ctx.promise(timeout=timedelta(seconds=30))
    yield ctx.run(append, path, f"notify {post} {approval.id}")
    decision = yield approval
    return {"post": post, "decision": decision}


def timed_out(ctx: Context) -> Generator[Any, Any, str]:
    approval = yield ctx.promise(timeout=timedelta(seconds=1))
    try:
        yield approval
    except PromiseTimedOutError as exc:
        return f"timed out: {exc.promise_id}"
    return "settled"


class Flaky:
    """Fails the first `failures` calls per key."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def __call__(self, key: str, failures: int, error: str) -> str:
        self.calls[key] = self.calls.get(key, 0) + 1
        if self.calls[key] <= failures:
            kind = KeyError if error == "key" else ConnectionError
            raise kind(f"{key} attempt {self.calls[key]}")
        return f"{key} ok after {self.calls[key]}"


FLAKY = Flaky()


def compensating(ctx: Context, key: str, failures: int, error: str) -> Generator[Any, Any, Any]:
    policy = RetryPolicy(max_attempts=3, initial_backoff=0.01, non_retryable=(KeyError,))
    try:
        return (yield ctx.run(FLAKY, key, failures, error, retry=policy))
    except PromiseRejectedError as exc:
        return {"compensated": exc.value}


def failing(ctx: Context) -> Generator[Any, Any, None]:
    yield ctx.now()
    raise ValueError("the workflow gave up")


def waits_forever(ctx: Context) -> Generator[Any, Any, str]:
    approval = yield ctx.promise()
    try:
        yield approval
    except Cancelled:
        yield ctx.run(append, "/dev/null", "cleanup")
        raise
    return "settled"


def broad_except(ctx: Context, path: str) -> Generator[Any, Any, str]:
    """A broad `except Exception:` around a wait, which once swallowed a cancel."""
    approval = yield ctx.promise()
    try:
        yield approval
    except Exception:  # a rejection, say; never a cancel (a BaseException)
        yield ctx.run(append, path, "handled")
    yield ctx.run(append, path, "went on")
    return "went on"


def sleeper(ctx: Context) -> Generator[Any, Any, list[Any]]:
    yield ctx.sleep(0.3)
    moment = yield ctx.now()
    number = yield ctx.random()
    return [moment.isoformat(), number]


def parent(ctx: Context, n: int) -> Generator[Any, Any, list[Any]]:
    handles = []
    for i in range(n):
        handles.append((yield ctx.start(child, i)))
    results = yield ctx.all(handles)
    return [*results, (yield ctx.rpc("child", 100))]


def child(ctx: Context, i: int) -> Generator[Any, Any, int]:
    return (yield ctx.run(lambda x: x * 2, i))


def quorum(ctx: Context) -> Generator[Any, Any, Any]:
    """Two of three approvers must say yes."""
    approvals = []
    for _ in range(3):
        approvals.append((yield ctx.promise(timeout=timedelta(seconds=30))))
    try:
        return {"approved_by": (yield ctx.at_least(2, approvals))}
    except PromiseRejectedError as exc:
        return {"declined": exc.value}


WORKFLOWS = [
    approval_flow, timed_out, compensating, failing, waits_forever, sleeper, parent, child, quorum,
    broad_except,
]  # fmt: skip


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.address, timeout=10) as c:
        yield c


@pytest.fixture(scope="module")
def worker(client: Client) -> Iterator[Worker]:
    w = Worker(client, concurrency=8, lease=timedelta(seconds=5))
    for fn in WORKFLOWS:
        # Giving up with a ValueError is the workflow's outcome because it says so;
        # undeclared, it would be a bug: the task retried, the root left PENDING.
        w.workflow(fail_on=(ValueError,))(fn) if fn is failing else w.workflow(fn)
    w.start()
    yield w
    w.stop()


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def test_human_in_the_loop(client: Client, worker: Worker, tmp_path: Path) -> None:
    effects = tmp_path / "effects"
    handle = client.start("approval_flow", str(effects), "post-7", id=new_id("publish"))
    approval_id = f"{handle.id}.0"
    eventually(lambda: len(lines(effects)) == 1, what="the notification step")
    assert lines(effects) == [f"notify post-7 {approval_id}"]
    with pytest.raises(DeadlineExceededError):
        handle.result(timeout=0.2)  # suspended: waits for the human
    client.resolve(approval_id, {"approved": True})
    assert handle.result(timeout=10) == {"post": "post-7", "decision": {"approved": True}}
    assert lines(effects) == [f"notify post-7 {approval_id}"]  # replay ran nothing again


def test_two_of_three_approvers_are_a_quorum(client: Client, worker: Worker) -> None:
    handle = client.start("quorum", id=new_id("quorum"))
    approvals = [f"{handle.id}.{n}" for n in range(3)]
    eventually(lambda: all(exists(client, a) for a in approvals), what="the three approvals")
    client.resolve(approvals[2], "carol")
    with pytest.raises(DeadlineExceededError):
        handle.result(timeout=0.3)  # one yes is not a quorum
    client.resolve(approvals[0], "alice")
    assert handle.result(timeout=10) == {"approved_by": ["carol", "alice"]}
    # Nobody waits for bob: his approval ended with the workflow (issue 9, item 7).
    bob = client.get(approvals[1])
    assert bob.state is PromiseState.REJECTED_CANCELED
    assert client.decode(bob.value)["reason"] == "workflow ended"


def test_a_quorum_out_of_reach_raises_the_deciding_rejection(
    client: Client, worker: Worker
) -> None:
    handle = client.start("quorum", id=new_id("quorum"))
    approvals = [f"{handle.id}.{n}" for n in range(3)]
    eventually(lambda: all(exists(client, a) for a in approvals), what="the three approvals")
    client.reject(approvals[0], "alice says no")
    client.resolve(approvals[1], "bob")
    with pytest.raises(DeadlineExceededError):
        handle.result(timeout=0.3)  # 1 yes, 1 no: carol can still make it 2
    client.reject(approvals[2], "carol says no")
    assert handle.result(timeout=10) == {"declined": "carol says no"}


def test_starting_the_same_id_twice_concurrently_runs_once(
    client: Client, server: ServerProcess, worker: Worker, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    workflow_id = new_id("dedupe")
    barrier = threading.Barrier(4)
    handles: list[Any] = []

    def start() -> None:
        with Client(server.address) as own:
            barrier.wait()
            handles.append(own.start(approval_flow, str(effects), "post-1", id=workflow_id).id)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert handles == [workflow_id] * 4
    eventually(lambda: exists(client, f"{workflow_id}.1") and len(lines(effects)) >= 1)
    client.resolve(f"{workflow_id}.0", "yes")
    assert client.handle(workflow_id).result(timeout=10)["decision"] == "yes"
    # A start after it finished still answers the same execution.
    assert client.start("approval_flow", str(effects), "post-1", id=workflow_id).result(1) == {
        "post": "post-1",
        "decision": "yes",
    }
    assert len(lines(effects)) == 1


def test_latent_promise_timeout_rejects_into_the_workflow(client: Client, worker: Worker) -> None:
    handle = client.start(timed_out, id=new_id("timeout"))
    assert handle.result(timeout=10) == f"timed out: {handle.id}.0"
    assert client.get(f"{handle.id}.0").state is PromiseState.REJECTED_TIMEDOUT


def test_step_retries_then_succeeds(client: Client, worker: Worker) -> None:
    key = new_id("retry")
    assert client.start(compensating, key, 2, "conn", id=key).result(timeout=10) == (
        f"{key} ok after 3"
    )


def test_step_final_failure_is_caught_by_the_workflow(client: Client, worker: Worker) -> None:
    key = new_id("exhausted")
    result = client.start(compensating, key, 5, "conn", id=key).result(timeout=10)
    assert result == {"compensated": {"type": "ConnectionError", "message": f"{key} attempt 3"}}
    assert FLAKY.calls[key] == 3


def test_non_retryable_step_failure_is_not_retried(client: Client, worker: Worker) -> None:
    key = new_id("fatal")
    result = client.start(compensating, key, 5, "key", id=key).result(timeout=10)
    assert result["compensated"]["type"] == "KeyError"
    assert FLAKY.calls[key] == 1


def test_a_workflow_raising_a_declared_exception_rejects_its_root(
    client: Client, worker: Worker
) -> None:
    with pytest.raises(PromiseRejectedError) as caught:
        client.start(failing, id=new_id("failing")).result(timeout=10)
    assert caught.value.value == {"type": "ValueError", "message": "the workflow gave up"}


def test_unknown_workflow_rejects_the_root_and_the_worker_lives_on(
    client: Client, worker: Worker
) -> None:
    with pytest.raises(PromiseRejectedError) as caught:
        client.start("no_such_workflow", id=new_id("unknown")).result(timeout=10)
    assert "'no_such_workflow' is not registered" in caught.value.value["message"]
    assert client.start(sleeper, id=new_id("alive")).result(timeout=10)


def test_cancel_reaches_the_workflow(client: Client, worker: Worker) -> None:
    handle = client.start(waits_forever, id=new_id("cancel"))
    eventually(lambda: exists(client, f"{handle.id}.0"), what="the latent promise")
    assert handle.cancel() is True
    with pytest.raises(Cancelled):
        handle.result(timeout=10)
    assert client.get(f"{handle.id}.0").state is PromiseState.REJECTED_CANCELED
    assert handle.cancel() is False


def test_except_exception_around_a_wait_does_not_swallow_a_cancel(
    client: Client, worker: Worker, tmp_path: Path
) -> None:
    path = tmp_path / "effects"
    handle = client.start(broad_except, str(path), id=new_id("broad"))
    eventually(lambda: exists(client, f"{handle.id}.0"), what="the latent promise")
    assert handle.cancel() is True
    with pytest.raises(Cancelled):
        handle.result(timeout=10)
    # The cancel created the task that resumes the workflow; it ends with the run.
    eventually(
        lambda: not [t for t in client.search_tasks(worker.group) if t.root_id == handle.id],
        what="the workflow's last task to end",
    )
    assert lines(path) == []
    assert not exists(client, f"{handle.id}.1")


def test_sleep_now_random(client: Client, worker: Worker) -> None:
    handle = client.start(sleeper, id=new_id("sleep"))
    moment, number = handle.result(timeout=10)
    assert 0 <= number < 1
    assert client.get(f"{handle.id}.0").tags["troth:timer"] == "true"
    assert isinstance(moment, str)


def test_child_workflows(client: Client, worker: Worker) -> None:
    assert client.start(parent, 3, id=new_id("parent")).result(timeout=15) == [0, 2, 4, 200]


GATE = threading.Event()
BLOCKING = threading.Event()


def gated(path: str) -> str:
    append(path, "gated start")
    if BLOCKING.is_set():
        GATE.wait(30)
    return "through"


def gated_flow(ctx: Context, path: str) -> Generator[Any, Any, str]:
    return (yield ctx.run(gated, path))


def test_graceful_stop_releases_tasks_to_other_workers_at_once(
    client: Client, tmp_path: Path
) -> None:
    effects = tmp_path / "effects"
    BLOCKING.set()
    first = Worker(client, group="stop-test", lease=timedelta(seconds=30))
    first.workflow(gated_flow)
    first.start()
    try:
        handle = client.start(gated_flow, str(effects), id=new_id("gated"), group="stop-test")
        eventually(lambda: lines(effects) == ["gated start"], what="the step to start")
        BLOCKING.clear()
        started = time.monotonic()
        first.stop(grace=0.2)  # its step is still running: the task is released anyway
        second = Worker(client, group="stop-test", lease=timedelta(seconds=30))
        second.workflow(gated_flow)
        with second:
            assert handle.result(timeout=10) == "through"
        assert time.monotonic() - started < 10  # well before the 30 s lease could expire
    finally:
        GATE.set()
        first.stop()


def hog_cpu(path: str, seconds: float) -> str:
    append(path, "hog start")
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:  # pure Python: holds the GIL as much as it can
        n += 1
    return "hogged"


def hogging(ctx: Context, path: str) -> Generator[Any, Any, str]:
    return (yield ctx.run(hog_cpu, path, 3.5))


@pytest.mark.slow
def test_a_step_hogging_the_cpu_past_its_lease_keeps_its_task(
    client: Client, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    effects = tmp_path / "effects"
    hog = Worker(client, group="hog", lease=timedelta(seconds=1))
    hog.workflow(hogging)
    with caplog.at_level(logging.INFO, logger="troth.worker"), hog:
        handle = client.start(hogging, str(effects), id=new_id("hog"), group="hog")
        assert handle.result(timeout=15) == "hogged"
    assert lines(effects) == ["hog start"]  # ran once: the lease never lapsed
    lost = [r for r in caplog.records if f"{hog.worker_id} lost" in r.getMessage()]
    assert not lost
