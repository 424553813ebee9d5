"""Typing contract: workflows, workers and handles as users write them (mypy --strict).

Not run by pytest; `make typecheck` checks it, so a change to the public API
of `Worker`, `Context`, `Client.start` or `Handle` that breaks users' type
checking fails CI. The shapes follow DESIGN §3 and §6.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import troth
from troth import (
    Cancelled,
    Client,
    Context,
    Handle,
    Promise,
    PromiseHandle,
    PromiseRejectedError,
    PromiseState,
    PromiseTimedOutError,
    RetryPolicy,
    Worker,
)

worker = Worker(
    Client("127.0.0.1:7070"),
    group="workers",
    worker_id="worker-1",
    concurrency=8,
    lease=timedelta(seconds=10),
    cache_size=64,
    shutdown_grace=timedelta(seconds=5),
    max_reconnect_backoff=2.0,
)


def send_email(to: str, link: str) -> str:
    return f"sent to {to}: {link}"


def charge(order: str, cents: int) -> dict[str, int]:
    return {order: cents}


@worker.workflow
def publish(ctx: Context, post_id: str) -> Generator[Any, Any, dict[str, Any]]:
    approval: PromiseHandle = yield ctx.promise(timeout=timedelta(days=3), tags={"post": post_id})
    explicit: PromiseHandle = yield ctx.promise(id=f"{ctx.id}.approval")
    unchecked: PromiseHandle = yield ctx.promise(timeout=timedelta(hours=1), check_args=False)
    assert unchecked.id
    link: str = approval.id
    sent: str = yield ctx.run(send_email, "editor@example.com", link)
    yield ctx.run(send_email, "editor@example.com", f"sent at {sent}", check_args=False)
    ctx.log.info("sent %s (replaying: %s)", sent, ctx.is_replaying)
    try:
        decision: Any = yield approval
    except PromiseTimedOutError as exc:
        decision = {"timed_out": exc.promise_id}
    except PromiseRejectedError as exc:
        decision = {"rejected": exc.value}
    yield explicit
    return {"post": post_id, "decision": decision}


@worker.workflow(name="checkout")
def checkout_v2(ctx: Context, order: str, cents: int) -> Generator[Any, Any, str]:
    policy = RetryPolicy(
        max_attempts=5,
        initial_backoff=0.5,
        max_backoff=10.0,
        multiplier=2.0,
        non_retryable=(KeyError, ValueError),
    )
    try:
        receipt: dict[str, int] = yield ctx.run(charge, order, cents, retry=policy, id="charge")
    except PromiseRejectedError as exc:
        yield ctx.run(send_email, "ops@example.com", f"charge failed: {exc.value}")
        raise
    yield ctx.sleep(timedelta(minutes=5))
    yield ctx.sleep(1.5, id=f"{ctx.id}.cooldown")
    yield ctx.sleep(timedelta(seconds=2), check_args=False)
    moment: datetime = yield ctx.now()
    roll: float = yield ctx.random()
    notes: list[str] = yield ctx.state("notes", default=[])
    version: int = yield ctx.set_state("notes", [*notes, str(receipt[order])])
    print(version)
    return f"{receipt[order]} at {moment.isoformat()} ({roll:.2f})"


@worker.workflow
def fan_out(ctx: Context, orders: list[str]) -> Generator[Any, Any, list[Any]]:
    children: list[PromiseHandle] = []
    for order in orders:
        child: PromiseHandle = yield ctx.start("checkout", order, 100, group="payments")
        children.append(child)
    by_function: PromiseHandle = yield ctx.start(publish, "post-1", id=f"{ctx.id}.publish")
    every: list[Any] = yield ctx.all(children)
    first: Any = yield ctx.any([by_function, *children])
    quorum: list[Any] = yield ctx.at_least(2, children)
    direct: str = yield ctx.rpc(checkout_v2, "order-0", 1, group="payments")
    named: dict[str, Any] = yield ctx.rpc("publish", "post-2", id=f"{ctx.id}.rpc")
    loose: PromiseHandle = yield ctx.start("publish", "post-3", check_args=False)
    also: Any = yield ctx.rpc(publish, "post-4", group="payments", check_args=False)
    week: PromiseHandle = yield ctx.start("publish", "post-5", ttl=timedelta(days=7))
    children.append(week)
    children.append(loose)
    return [*every, first, *quorum, direct, named, also]


@worker.workflow
def cancellable(ctx: Context) -> Generator[Any, Any, None]:
    try:
        yield (yield ctx.promise())
    except Cancelled:
        yield ctx.run(send_email, "ops@example.com", "cancelled")
        raise


def registered() -> Mapping[str, Callable[..., Generator[Any, Any, Any]]]:
    return worker.workflows


def run_embedded() -> None:
    with worker:
        pass
    other = Worker(Client(), group="payments")
    other.workflow(checkout_v2)
    other.start()
    other.stop(grace=1.0)
    other.stop()


def run_forever() -> None:
    logging.basicConfig(level=logging.INFO)
    worker.run()


def gateway(client: Client) -> dict[str, Any]:
    handle: Handle = client.start(publish, "post-7", id="publish-post-7", group="workers")
    by_name: Handle = client.start("publish", "post-7", id="publish-post-7")
    bounded = client.start(
        "checkout", "order-1", 250, id="checkout-1", group="payments", ttl=timedelta(hours=1)
    )
    assert handle == by_name and hash(handle) == hash(by_name)
    started: bool = handle.created
    keyed = client.start("publish", "post-7", id="publish-post-7", idempotency_key="req-7")
    assert started or not keyed.created
    workflow_id: str = handle.id
    root: Promise = client.handle(workflow_id).get()
    if root.state is PromiseState.PENDING:
        client.resolve(f"{workflow_id}.0", {"approved": True})
    try:
        result: Any = handle.result(timeout=30)
    except troth.DeadlineExceededError:
        cancelled: bool = handle.cancel({"reason": "took too long"})
        return {"cancelled": cancelled}
    except (PromiseRejectedError, Cancelled, PromiseTimedOutError) as exc:
        return {"failed": str(exc)}
    print(bounded.result())
    return {"result": result}


@dataclass
class Decision:
    approved: bool
    note: str = ""


@worker.workflow(name="reviewed", version="2", compatible=("1",))
def reviewed(ctx: Context, post: str) -> Generator[Any, Any, dict[str, Any]]:
    approval = yield ctx.promise(
        id=f"approval-{post}",
        schema=Decision,
        title=f"Publish {post}?",
        message="Ready for review.",
        timeout=timedelta(days=3),
    )
    legal = yield ctx.promise(schema={"type": "boolean"})
    try:
        decision = yield approval
        signed_off = yield legal
    except troth.Rejected as declined:
        reason: Any = declined.reason
        return {"declined": reason}
    except troth.TimedOut as late:
        return {"escalated": late.promise_id}
    except Cancelled:
        yield ctx.run(print, "compensate")
        raise
    return {"decision": decision, "legal": signed_off}


def early_gateway(client: Client) -> None:
    client.resolve("approval-post-9", Decision(True), create_if_missing=True)
    client.reject("approval-post-10", {"reason": "no"}, create_if_missing=True)
    made = client.create("ask-1", schema=Decision, title="Go?", message="m", requested_by="ops")
    shown: str = made.promise.title + made.promise.message + made.promise.requested_by
    print(shown, made.promise.schema, made.promise.workflow_version)


def versions(w: Worker) -> list[str]:
    registered: troth.WorkflowRegistration = w.registrations["reviewed"]
    return [registered.version, *registered.compatible]


# A bug pauses, it does not lose: failing is explicit (issue 12 item 5).
@worker.workflow(name="refund", fail_on=(ValueError, KeyError))
def refund(ctx: Context, amount: int) -> Generator[Any, Any, int]:
    if amount <= 0:
        raise ValueError("not positive")
    approval = yield ctx.promise(timeout=timedelta(days=3))
    decision: dict[str, Any] = yield approval
    if not decision.get("approved"):
        raise troth.WorkflowFailed("refund refused", details=decision)
    return amount


@worker.workflow(fail_on=LookupError)
def strict(ctx: Context) -> Generator[Any, Any, None]:
    yield ctx.now()


failed: troth.WorkflowFailed = troth.WorkflowFailed("no")
failure_message: str = failed.message
fails_on: tuple[type[BaseException], ...] = worker.registrations["refund"].fail_on
