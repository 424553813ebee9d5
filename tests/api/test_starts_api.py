"""Starts that say what happened, and time that means what it says (issue 12 items 3-4),
on every server kind (the `server` fixture: SQLite and PostgreSQL).

- A repeat of a start (same workflow, group and arguments) answers the existing run,
  `created=False`; another workflow, group or arguments is ALREADY_EXISTS
  (`WORKFLOW_ALREADY_EXISTS`) naming the difference, unless the start carries the
  original start's idempotency key. Raw `CreatePromise` calls (grpcurl) and the SDK
  get the same answers.
- A workflow started without a ttl lives 30 days (`--default-workflow-ttl`), a
  plain promise one (`--default-ttl`); `ctx.start(..., ttl=)` gives a child its own.
- A step whose timeout its workflow's expiry cut short carries the effective
  expire_time, and the worker logs a warning naming both.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Generator, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from _support import error_info, eventually, exists

from troth import Client, Context, Worker
from troth.errors import AlreadyExistsError, Reason
from troth.v1 import promises_pb2, types_pb2

if TYPE_CHECKING:
    from _support import ServerProcess

    from troth import Promise
    from troth.v1 import promises_pb2_grpc

DAY = timedelta(days=1)
SLACK = timedelta(seconds=30)  # a create's time against the test's reading of it
JSON = {"content-type": "application/json"}
GROUP = "starts-api"


def waiter(ctx: Context, days: float) -> Generator[Any, Any, Any]:
    approval = yield ctx.promise(timeout=timedelta(days=days))
    return (yield approval)


def parent(
    ctx: Context, child_ttl_days: float | None, wait_days: float
) -> Generator[Any, Any, Any]:
    ttl = None if child_ttl_days is None else timedelta(days=child_ttl_days)
    child = yield ctx.start(waiter, wait_days, ttl=ttl)
    return (yield child)


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.address, timeout=10) as c:
        yield c


@pytest.fixture(scope="module")
def worker(client: Client) -> Iterator[Worker]:
    w = Worker(client, group=GROUP, concurrency=4, lease=timedelta(seconds=5))
    for fn in (waiter, parent):
        w.workflow(fn)
    w.start()
    yield w
    w.stop()


def _wid(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def _lifetime(promise: Promise) -> timedelta:
    assert promise.expire_time is not None
    return promise.expire_time - promise.create_time


def _start_request(
    wid: str, name: str = "publish", args: bytes = b'["post-7"]', key: str = ""
) -> promises_pb2.CreatePromiseRequest:
    return promises_pb2.CreatePromiseRequest(
        id=wid,
        param=types_pb2.Payload(headers=JSON, data=args),
        tags={"troth:invoke": "nobody-polls-this", "troth:func": name},
        idempotency_key=key,
    )


# -- item 4: repeats and conflicts ------------------------------------------------------


def test_a_raw_start_repeated_is_the_same_run_and_another_is_refused_naming_it(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    wid = _wid("raw")
    first = stub.CreatePromise(_start_request(wid, key="req-1"))
    assert first.created
    again = stub.CreatePromise(_start_request(wid))  # no key: compared by what it starts
    assert not again.created and again.promise.create_time == first.promise.create_time
    with pytest.raises(grpc.RpcError) as caught:
        stub.CreatePromise(_start_request(wid, name="approve", args=b'["post-8"]'))
    error = caught.value
    assert error.code() is grpc.StatusCode.ALREADY_EXISTS
    info = error_info(error)
    assert info.reason == Reason.WORKFLOW_ALREADY_EXISTS
    assert dict(info.metadata) == {
        "promise_id": wid,
        "workflow": "publish",
        "differences": "workflow,arguments",
    }
    assert f"workflow '{wid}' already exists as 'publish' (this start names 'approve')" in (
        error.details() or ""
    )
    # The original key vouches for the start, whatever it says.
    vouched = stub.CreatePromise(_start_request(wid, name="approve", key="req-1"))
    assert not vouched.created and vouched.promise.tags["troth:func"] == "publish"


def test_client_start_says_whether_it_started_the_run(client: Client) -> None:
    wid = _wid("sdk")
    first = client.start("publish", "post-7", id=wid, group="nobody-polls-this")
    assert first.created is True
    again = client.start("publish", "post-7", id=wid, group="nobody-polls-this")
    assert again.created is False and again == first
    with pytest.raises(AlreadyExistsError) as caught:
        client.start("publish", "post-8", id=wid, group="nobody-polls-this")
    assert caught.value.reason == Reason.WORKFLOW_ALREADY_EXISTS
    assert f"workflow '{wid}' already exists as 'publish' with other arguments" in str(caught.value)
    with pytest.raises(AlreadyExistsError, match="in group 'nobody-polls-this'"):
        client.start("publish", "post-7", id=wid, group="elsewhere")
    # A start of an id a plain promise holds says that it is not a workflow.
    plain = _wid("plain")
    client.create(plain, {"post": 7})
    with pytest.raises(AlreadyExistsError, match="is a promise, not a workflow") as refused:
        client.start("publish", id=plain)
    assert refused.value.reason == Reason.ALREADY_EXISTS


def test_the_original_idempotency_key_gets_the_run_whatever_its_arguments(
    client: Client,
) -> None:
    wid = _wid("keyed")
    first = client.start("publish", 1, id=wid, group="nobody-polls-this", idempotency_key="r-1")
    assert first.created
    again = client.start("publish", 2, id=wid, group="nobody-polls-this", idempotency_key="r-1")
    assert again.created is False
    assert client.decode(client.get(wid).param) == [1]  # the first start's arguments
    with pytest.raises(AlreadyExistsError, match="pass the original start's idempotency key"):
        client.start("publish", 2, id=wid, group="nobody-polls-this", idempotency_key="r-2")


# -- item 3: lifetimes ------------------------------------------------------------------


def test_a_workflow_lives_30_days_by_default_and_a_promise_one(client: Client) -> None:
    wid = _wid("default")
    client.start("publish", id=wid, group="nobody-polls-this")
    assert abs(_lifetime(client.get(wid)) - 30 * DAY) < SLACK
    plain = _wid("plain")
    assert abs(_lifetime(client.create(plain).promise) - DAY) < SLACK
    week = _wid("week")
    client.start("publish", id=week, group="nobody-polls-this", ttl=7 * DAY)
    assert abs(_lifetime(client.get(week)) - 7 * DAY) < SLACK


def test_a_child_workflow_gets_the_ttl_it_asks_for(client: Client, worker: Worker) -> None:
    """A 7-day child under a 10-day parent, waiting 5 days: nothing is cut, no warning."""
    wid = _wid("parent")
    client.start(parent, 7, 5, id=wid, group=GROUP, ttl=10 * DAY)
    eventually(lambda: exists(client, f"{wid}.0.0"), 20, "the child's approval")
    child, approval = client.get(f"{wid}.0"), client.get(f"{wid}.0.0")
    assert abs(_lifetime(child) - 7 * DAY) < SLACK
    assert abs(_lifetime(approval) - 5 * DAY) < SLACK
    client.resolve(approval.id, "yes")
    assert client.handle(wid).result(timeout=20) == "yes"


def test_a_child_without_a_ttl_lives_as_long_as_its_parent(client: Client, worker: Worker) -> None:
    """The issue's case: a 7-day approval in a child of a 10-day parent, no ttl given
    to the child (it used to get the promise default, a day)."""
    wid = _wid("parent")
    client.start(parent, None, 7, id=wid, group=GROUP, ttl=10 * DAY)
    eventually(lambda: exists(client, f"{wid}.0.0"), 20, "the child's approval")
    root, child = client.get(wid), client.get(f"{wid}.0")
    assert child.expire_time == root.expire_time  # the 30-day default, cut to the parent's
    assert abs(_lifetime(client.get(f"{wid}.0.0")) - 7 * DAY) < SLACK
    client.cancel(wid)


def test_a_step_cut_short_by_its_workflow_carries_the_expiry_and_is_warned_of(
    client: Client, worker: Worker, caplog: pytest.LogCaptureFixture
) -> None:
    """A 20-day child under a 1-day parent, and in it a 3-day approval: both end with
    the parent, each says so in its expire_time, and the worker warns of each."""
    caplog.set_level(logging.WARNING, logger="troth.worker")
    wid = _wid("short")
    client.start(parent, 20, 3, id=wid, group=GROUP, ttl=DAY)
    eventually(lambda: exists(client, f"{wid}.0.0"), 20, "the child's approval")
    root, child, approval = client.get(wid), client.get(f"{wid}.0"), client.get(f"{wid}.0.0")
    assert root.expire_time is not None
    assert child.expire_time == approval.expire_time == root.expire_time
    expires = root.expire_time.isoformat(timespec="seconds").replace("+00:00", "Z")

    def warned(step: str, asked: str, workflow: str) -> bool:
        wanted = f"step '{step}' asked for {asked}, but workflow '{workflow}' expires at {expires}"
        return any(wanted in r.getMessage() for r in caplog.records)

    eventually(lambda: warned(f"{wid}.0", "a ttl of 20d", wid), 10, "the child's warning")
    eventually(lambda: warned(f"{wid}.0.0", "a timeout of 3d", f"{wid}.0"), 10, "the step's")
    record = next(r for r in caplog.records if f"'{wid}.0.0'" in r.getMessage())
    assert record.levelno == logging.WARNING
    assert (record.step_id, record.workflow_id) == (f"{wid}.0.0", f"{wid}.0")  # type: ignore[attr-defined]
    client.cancel(wid)
