"""The replay engine alone: histories in, commands out. No server, no I/O.

`World` below is a stand-in for the server *for these tests only*: it keeps
promises in a dict, runs step functions when the engine asks, and settles
promises when a test says so. The engine under test is the real one.
"""

from __future__ import annotations

import gc
import logging
import pickle
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from troth import (
    Cancelled,
    Context,
    JsonCodec,
    NonDeterminismError,
    Promise,
    PromiseHandle,
    PromiseRejectedError,
    PromiseState,
    PromiseTimedOutError,
    RetryPolicy,
    WorkflowError,
)
from troth._commands import CreatePromise, Now, Random, RunStep, Sleep, StartWorkflow
from troth._digests import args_digest
from troth._engine import CreateStep, Done, Engine, Failed, Outcome, Suspend, error_value
from troth._failures import fails_workflow
from troth.codec import Payload
from troth.testing import load_history, replay

FIXTURES = Path(__file__).parent.parent / "fixtures" / "histories"
CODEC = JsonCodec()
T0 = datetime(2025, 1, 1, tzinfo=UTC)
Gen = Generator[Any, Any, Any]


# -- a stand-in server for driving the engine -------------------------------


class World:
    """Promises by id; runs step functions once when asked; settles on demand."""

    def __init__(self, promises: Iterable[Promise] = ()) -> None:
        self.promises: dict[str, Promise] = {p.id: p for p in promises}
        self.ticks = 0
        self.calls: list[str] = []

    def _now(self) -> datetime:
        self.ticks += 1
        return T0 + timedelta(seconds=self.ticks)

    def execute(self, step: CreateStep) -> Promise:
        existing = self.promises.get(step.step_id)
        if existing is not None and existing.is_settled:
            return existing
        command = step.command
        state, value = PromiseState.PENDING, None
        if isinstance(command, RunStep):
            self.calls.append(step.step_id)
            try:
                state, value = PromiseState.RESOLVED, command.fn(*command.args)
            except Exception as exc:
                state, value = PromiseState.REJECTED, error_value(exc)
        elif isinstance(command, Now):
            state, value = PromiseState.RESOLVED, (T0 + timedelta(hours=self.ticks)).isoformat()
        elif isinstance(command, Random):
            state, value = PromiseState.RESOLVED, (self.ticks % 7) / 7
        now = self._now()
        promise = Promise(
            id=step.step_id,
            state=state,
            param=step.param,
            value=CODEC.encode(value) if state is not PromiseState.PENDING else Payload(),
            tags=dict(step.tags),
            create_time=now,
            settle_time=now if state is not PromiseState.PENDING else None,
        )
        self.promises[step.step_id] = promise
        return promise

    def settle(self, promise_id: str, state: PromiseState, value: Any = None) -> Promise:
        old = self.promises.get(promise_id) or make(promise_id, PromiseState.PENDING)
        assert not old.is_settled
        new = replace(old, state=state, value=CODEC.encode(value), settle_time=self._now())
        self.promises[promise_id] = new
        return new

    def history(self) -> list[Promise]:
        return list(self.promises.values())


def make(
    promise_id: str,
    state: PromiseState = PromiseState.RESOLVED,
    value: Any = None,
    tags: dict[str, str] | None = None,
    settled_at: int | None = None,
) -> Promise:
    settled = state is not PromiseState.PENDING
    return Promise(
        id=promise_id,
        state=state,
        param=Payload(),
        value=CODEC.encode(value) if settled else Payload(),
        tags=tags or {"troth:kind": "promise"},
        create_time=T0,
        settle_time=T0 + timedelta(seconds=settled_at or 0) if settled else None,
    )


def drive(engine: Engine, world: World, new: Iterable[Promise] = ()) -> Outcome:
    """Advance, doing every CreateStep the engine asks for, until it suspends or ends."""
    outcome = engine.advance(new)
    while isinstance(outcome, CreateStep):
        outcome = engine.advance([world.execute(outcome)])
    return outcome


def steps(engine: Engine, world: World) -> tuple[list[CreateStep], Outcome]:
    """Like `drive`, but also return the CreateSteps asked for, in order."""
    asked: list[CreateStep] = []
    outcome = engine.advance()
    while isinstance(outcome, CreateStep):
        asked.append(outcome)
        outcome = engine.advance([world.execute(outcome)])
    return asked, outcome


# -- the workflows of DESIGN §3 and the fixtures ----------------------------

CALLS: list[str] = []


def send_email(approval_id: str) -> str:
    CALLS.append(f"send_email {approval_id}")
    return f"sent {approval_id}"


def send_sms(approval_id: str) -> str:
    raise AssertionError("never run in these tests")


def publish(ctx: Context, post_id: str) -> Gen:
    approval = yield ctx.promise(timeout=timedelta(days=3))
    yield ctx.run(send_email, approval.id)
    decision = yield approval
    return {"post": post_id, "decision": decision}


def charge(n: int) -> dict[str, int]:
    CALLS.append(f"charge {n}")
    return {"charged": n}


def refund(n: int) -> dict[str, int]:
    CALLS.append(f"refund {n}")
    return {"refunded": n}


def order(ctx: Context, n: int) -> Gen:
    started = yield ctx.now()
    yield ctx.run(charge, n)
    try:
        yield ctx.rpc("ship", n)
        status = "shipped"
    except PromiseRejectedError as exc:
        yield ctx.run(refund, n)
        status = f"refunded: {exc.value['message']}"
    return {"order": n, "status": status, "at": started.isoformat()}


@pytest.fixture(autouse=True)
def _clear_calls() -> None:
    CALLS.clear()


# -- histories in, commands out ----------------------------------------------


def test_fresh_run_asks_for_each_step_then_suspends_on_the_approval() -> None:
    world = World()
    engine = Engine(publish, ["post-7"], root_id="p", group="workers")
    asked, outcome = steps(engine, world)
    digests = [args_digest(s.command) for s in asked]
    assert [(s.step_id, s.position, dict(s.tags)) for s in asked] == [
        ("p.0", 0, {"troth:kind": "promise", "troth:group": "workers", "troth:args": digests[0]}),
        ("p.1", 1, {"troth:kind": "run", "troth:func": "send_email", "troth:args": digests[1]}),
    ]
    assert asked[0].ttl == timedelta(days=3)
    assert isinstance(asked[1].command, RunStep)
    assert asked[1].command.args == ("p.0",)
    assert outcome == Suspend(awaiting=("p.0",))
    assert CALLS == ["send_email p.0"]
    engine.close()

    # The human approves; any worker replays from the server's history.
    world.settle("p.0", PromiseState.RESOLVED, {"approved": True})
    with Engine(publish, ["post-7"], root_id="p", history=world.history()) as again:
        asked, outcome = steps(again, world)
    assert asked == []
    assert outcome == Done({"post": "post-7", "decision": {"approved": True}})
    assert CALLS == ["send_email p.0"], "a settled step's function ran again"


def test_repeated_advance_repeats_the_answer() -> None:
    engine = Engine(publish, ["x"], root_id="p")
    first = engine.advance()
    assert isinstance(first, CreateStep)
    assert engine.advance() == first
    engine.close()


def test_cached_engine_continues_when_fed_the_settlement() -> None:
    world = World()
    engine = Engine(publish, ["post-7"], root_id="p")
    assert drive(engine, world) == Suspend(("p.0",))
    settled = world.settle("p.0", PromiseState.RESOLVED, "yes")
    assert engine.advance([settled]) == Done({"post": "post-7", "decision": "yes"})
    assert CALLS == ["send_email p.0"]


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        ("publish_suspended.json", Suspend(("publish-post-7.0",))),
        (
            "publish_approved.json",
            Done({"post": "post-7", "decision": {"approved": True, "by": "ada"}}),
        ),
    ],
)
def test_recorded_publish_histories_replay(fixture: str, expected: Outcome) -> None:
    root_id, args, history = load_history(FIXTURES / fixture)
    assert replay(publish, args, history, root_id=root_id) == expected
    assert CALLS == []


def test_recorded_saga_history_replays_its_compensation_without_running_anything() -> None:
    root_id, args, history = load_history(FIXTURES / "order_compensated.json")
    outcome = replay(order, args, history, root_id=root_id)
    assert outcome == Done(
        {"order": 9, "status": "refunded: no stock", "at": "2025-03-04T05:06:07+00:00"}
    )
    assert CALLS == []


def test_replay_stops_at_the_first_step_the_history_lacks() -> None:
    root_id, args, history = load_history(FIXTURES / "order_compensated.json")
    truncated = [p for p in history if p.id in {"order-9.0", "order-9.1"}]
    outcome = replay(order, args, truncated, root_id=root_id)
    assert isinstance(outcome, CreateStep)
    assert outcome.step_id == "order-9.2"
    assert isinstance(outcome.command, StartWorkflow)
    assert outcome.command.wait
    assert CODEC.decode(outcome.param) == [9]
    assert CALLS == []


# -- non-determinism -----------------------------------------------------------


def publish_sms(ctx: Context, post_id: str) -> Gen:
    approval = yield ctx.promise()
    yield ctx.run(send_sms, approval.id)
    return (yield approval)


def publish_reordered(ctx: Context, post_id: str) -> Gen:
    yield ctx.run(send_email, "early")
    approval = yield ctx.promise()
    return (yield approval)


def publish_without_email(ctx: Context, post_id: str) -> Gen:
    approval = yield ctx.promise()
    return (yield approval)


def publish_with_audit(ctx: Context, post_id: str) -> Gen:
    approval = yield ctx.promise()
    yield ctx.sleep(60)
    yield ctx.run(send_email, approval.id)
    return (yield approval)


@pytest.mark.parametrize(
    ("workflow", "position", "recorded", "yielded"),
    [
        (publish_sms, 1, "run(send_email)", "run(send_sms)"),
        (publish_reordered, 0, "promise", "run(send_email)"),
        (publish_without_email, 1, "run(send_email)", None),
        (publish_with_audit, 1, "run(send_email)", "sleep"),
    ],
    ids=["changed-function", "changed-order", "removed-step", "added-step"],
)
@pytest.mark.parametrize("fixture", ["publish_suspended.json", "publish_approved.json"])
def test_changed_workflow_fails_naming_position_and_both_commands(
    workflow: Callable[..., Gen],
    position: int,
    recorded: str,
    yielded: str | None,
    fixture: str,
) -> None:
    root_id, args, history = load_history(FIXTURES / fixture)
    with Engine(workflow, args, root_id=root_id, history=history) as engine:
        outcome = engine.advance()
    assert isinstance(outcome, Failed)
    error = outcome.error
    assert isinstance(error, NonDeterminismError)
    assert (error.position, error.recorded, error.yielded) == (position, recorded, yielded)
    assert error.step_id == f"{root_id}.{position}"
    assert f"step {position}" in str(error)
    assert recorded in str(error)
    assert CALLS == []

    with pytest.raises(NonDeterminismError) as raised:
        replay(workflow, args, history, root_id=root_id)
    assert raised.value.position == position


def test_a_step_recorded_past_the_end_is_a_removed_step() -> None:
    def short(ctx: Context) -> Gen:
        yield ctx.run(charge, 1)
        return "done"

    history = [
        make("r.0", value={"charged": 1}, tags={"troth:kind": "run", "troth:func": "charge"}),
        make("r.1", value={"refunded": 1}, tags={"troth:kind": "run", "troth:func": "refund"}),
    ]
    with pytest.raises(NonDeterminismError) as raised:
        replay(short, [], history, root_id="r")
    assert (raised.value.position, raised.value.recorded, raised.value.yielded) == (
        1,
        "run(refund)",
        None,
    )


def test_child_steps_and_explicit_ids_do_not_count_as_removed_steps() -> None:
    def wf(ctx: Context) -> Gen:
        return (yield ctx.run(charge, 1))

    history = [
        make("r.0", value={"charged": 1}, tags={"troth:kind": "run", "troth:func": "charge"}),
        make("r.0.0", tags={"troth:kind": "run", "troth:func": "other"}),
        make("elsewhere", tags={"troth:kind": "promise"}),
    ]
    assert replay(wf, [], history, root_id="r") == Done({"charged": 1})


def test_nondeterminism_error_pickles_and_is_a_workflow_error() -> None:
    error = NonDeterminismError(3, recorded="run(a)", yielded=None, step_id="r.3")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.position, copy.recorded, copy.yielded, copy.step_id) == (3, "run(a)", None, "r.3")
    assert isinstance(copy, WorkflowError)
    assert "nothing" in str(copy)


# -- checkpoints, rejections and compensation --------------------------------


def test_settled_run_step_is_never_called_even_when_it_would_fail() -> None:
    def explode() -> None:
        raise AssertionError("a settled step ran again")

    def wf(ctx: Context) -> Gen:
        return (yield ctx.run(explode))

    history = [make("r.0", value=42, tags={"troth:kind": "run", "troth:func": "explode"})]
    assert replay(wf, [], history, root_id="r") == Done(42)


def test_pending_run_step_is_run_again_and_says_it_exists() -> None:
    def wf(ctx: Context) -> Gen:
        return (yield ctx.run(charge, 5))

    history = [
        make("r.0", PromiseState.PENDING, tags={"troth:kind": "run", "troth:func": "charge"})
    ]
    world = World(history)
    with Engine(wf, [], root_id="r", history=history) as engine:
        asked, outcome = steps(engine, world)
    assert [(s.step_id, s.exists) for s in asked] == [("r.0", True)]
    assert outcome == Done({"charged": 5})
    assert CALLS == ["charge 5"]


def test_failed_step_raises_into_the_workflow_which_compensates() -> None:
    def reserve(n: int) -> None:
        raise ValueError(f"only {n - 1} left")

    def wf(ctx: Context, n: int) -> Gen:
        yield ctx.run(charge, n)
        try:
            yield ctx.run(reserve, n, retry=RetryPolicy(max_attempts=1))
        except PromiseRejectedError as exc:
            yield ctx.run(refund, n)
            return {"refunded": True, "why": exc.value, "from": exc.promise_id}
        return {"refunded": False}

    world = World()
    with Engine(wf, [3], root_id="o") as engine:
        outcome = drive(engine, world)
    expected = Done(
        {
            "refunded": True,
            "why": {"type": "ValueError", "message": "only 2 left"},
            "from": "o.1",
        }
    )
    assert outcome == expected
    assert CALLS == ["charge 3", "refund 3"]
    # Replay: the same path, nothing runs.
    assert replay(wf, [3], world.history(), root_id="o") == expected
    assert CALLS == ["charge 3", "refund 3"]


def test_uncaught_rejection_fails_the_workflow_with_it() -> None:
    def wf(ctx: Context) -> Gen:
        approval = yield ctx.promise()
        return (yield approval)

    history = [make("r.0", PromiseState.REJECTED, {"reason": "no"})]
    outcome = replay(wf, [], history, root_id="r")
    assert isinstance(outcome, Failed)
    assert isinstance(outcome.error, PromiseRejectedError)
    assert outcome.error.value == {"reason": "no"}
    assert "'r.0' was rejected" in str(outcome.error)


def test_timed_out_latent_promise_raises_promise_timed_out_which_can_be_caught() -> None:
    def wf(ctx: Context) -> Gen:
        approval = yield ctx.promise(timeout=timedelta(seconds=1))
        try:
            return (yield approval)
        except PromiseTimedOutError as exc:
            return f"expired {exc.promise_id}"

    history = [make("r.0", PromiseState.REJECTED_TIMEDOUT)]
    assert replay(wf, [], history, root_id="r") == Done("expired r.0")


def test_timer_resolves_and_a_timed_out_timer_counts_as_elapsed() -> None:
    def wf(ctx: Context) -> Gen:
        yield ctx.sleep(timedelta(hours=1))
        return "woke"

    with Engine(wf, [], root_id="r") as engine:
        step = engine.advance()
        assert isinstance(step, CreateStep)
        assert step.tags == {
            "troth:kind": "sleep",
            "troth:timer": "true",
            "troth:args": args_digest(step.command),
        }
        assert step.ttl == timedelta(hours=1)
    timer_tags = {"troth:kind": "sleep", "troth:timer": "true"}
    for state in (PromiseState.RESOLVED, PromiseState.REJECTED_TIMEDOUT):
        history = [make("r.0", state, tags=timer_tags)]
        assert replay(wf, [], history, root_id="r") == Done("woke")
    pending = [make("r.0", PromiseState.PENDING, tags=timer_tags)]
    assert replay(wf, [], pending, root_id="r") == Suspend(("r.0",))


def test_cancelled_step_raises_cancelled() -> None:
    def wf(ctx: Context) -> Gen:
        approval = yield ctx.promise()
        try:
            yield approval
        except Cancelled as exc:
            return f"cancelled {exc.promise_id}"
        return "approved"

    history = [make("r.0", PromiseState.REJECTED_CANCELED)]
    assert replay(wf, [], history, root_id="r") == Done("cancelled r.0")


def test_cancelled_root_raises_cancelled_instead_of_new_work_only() -> None:
    seen: list[str] = []

    def wf(ctx: Context) -> Gen:
        yield ctx.run(charge, 1)  # recorded: replays normally
        try:
            yield ctx.run(refund, 1)  # new: refused under a cancelled root
        except Cancelled as exc:
            seen.append(exc.promise_id)
            raise

    history = [
        make("r", PromiseState.REJECTED_CANCELED),
        make("r.0", value={"charged": 1}, tags={"troth:kind": "run", "troth:func": "charge"}),
    ]
    outcome = replay(wf, [], history, root_id="r")
    assert isinstance(outcome, Failed)
    assert isinstance(outcome.error, Cancelled)
    assert seen == ["r"]
    assert CALLS == []


def test_after_the_cancel_is_delivered_compensation_steps_run_once() -> None:
    def wf(ctx: Context) -> Gen:
        yield ctx.run(charge, 1)
        approval = yield ctx.promise()
        try:
            yield approval
        except Cancelled:
            yield ctx.run(refund, 1)  # compensation: a step like any other
            try:
                yield (yield ctx.promise())  # but no new wait
            except Cancelled:
                pass
            raise
        return "approved"

    CALLS.clear()
    world = World(
        [
            make("r", PromiseState.REJECTED_CANCELED),
            make("r.0", value={"charged": 1}, tags={"troth:kind": "run", "troth:func": "charge"}),
            make("r.1", PromiseState.REJECTED_CANCELED, tags={"troth:kind": "promise"}),
        ]
    )
    engine = Engine(wf, [], root_id="r", history=world.promises.values())
    outcome = drive(engine, world)
    assert isinstance(outcome, Failed) and isinstance(outcome.error, Cancelled)
    assert CALLS == ["refund 1"]
    assert world.promises["r.2"].tags["troth:func"] == "refund"
    assert world.promises["r.3"].tags["troth:kind"] == "promise"  # created, never waited on
    # A replay (another worker) finds the compensation recorded: it is not run again.
    again = replay(wf, [], list(world.promises.values()), root_id="r")
    assert isinstance(again, Failed) and isinstance(again.error, Cancelled)
    assert CALLS == ["refund 1"]


def test_except_exception_around_a_wait_does_not_swallow_a_cancel() -> None:
    """`Cancelled` is a `BaseException` (issue 27), as `asyncio.CancelledError` is: a
    broad `except Exception:` around a wait lets it through, so the steps after it do
    not run and the workflow ends cancelled, as it does without the handler."""

    def wf(ctx: Context) -> Gen:
        yield ctx.run(charge, 1)
        approval = yield ctx.promise()
        try:
            yield approval
        except Exception:  # a broad handler around a wait (for a rejection, say)
            pass
        yield ctx.run(refund, 1)  # must not run after a cancel
        return "went on as if nothing happened"

    CALLS.clear()
    world = World(
        [
            make("r", PromiseState.REJECTED_CANCELED),
            make("r.0", value={"charged": 1}, tags={"troth:kind": "run", "troth:func": "charge"}),
            make("r.1", PromiseState.REJECTED_CANCELED, tags={"troth:kind": "promise"}),
        ]
    )
    with Engine(wf, [], root_id="r", history=world.promises.values()) as engine:
        outcome = drive(engine, world)
    assert CALLS == [], "the step after the handler ran after the cancel"
    assert not isinstance(Cancelled("r"), Exception)
    assert isinstance(outcome, Failed), outcome
    assert isinstance(outcome.error, Cancelled)
    assert outcome.error.promise_id == "r.1"
    assert "r.2" not in world.promises
    # What the worker makes of it: the workflow's outcome (the root stays cancelled),
    # not a bug to retry.
    assert fails_workflow(outcome.error)
    # `except Cancelled:` still catches it, and so does `except BaseException:`.
    assert isinstance(replay(_catches_cancelled, [], world.history(), root_id="r"), Done)


def _catches_cancelled(ctx: Context) -> Gen:
    yield ctx.run(charge, 1)
    approval = yield ctx.promise()
    try:
        yield approval
    except Cancelled:
        return "cancelled"
    return "approved"


@dataclass(frozen=True)
class Decision:
    approved: bool
    note: str = ""


def test_a_typed_promise_decodes_into_its_schema_type() -> None:
    def wf(ctx: Context) -> Gen:
        decision = yield (yield ctx.promise(schema=Decision))
        return decision

    approved = make("r.0", value={"approved": True}, tags={"troth:kind": "promise"})
    assert replay(wf, [], [approved], root_id="r") == Done(Decision(True))
    # A value that does not fit (say, settled before the wait declared its schema)
    # raises at the yield, where the workflow can catch it.
    outcome = replay(
        wf, [], [make("r.0", value=["no"], tags={"troth:kind": "promise"})], root_id="r"
    )
    assert isinstance(outcome, Failed) and isinstance(outcome.error, TypeError)
    assert "does not fit Decision" in str(outcome.error)


# -- ids -----------------------------------------------------------------------


def test_awaiting_creates_no_promise_and_shifts_no_id() -> None:
    def wf(ctx: Context) -> Gen:
        first = yield ctx.promise()
        yield first
        yield first
        second = yield ctx.promise()
        return second.id

    world = World()
    engine = Engine(wf, [], root_id="r")
    assert drive(engine, world) == Suspend(("r.0",))
    assert engine.advance([world.settle("r.0", PromiseState.RESOLVED)]) == CreateStep(
        "r.1",
        1,
        CreatePromise(),
        {"troth:kind": "promise", "troth:args": args_digest(CreatePromise())},
        Payload(),
        requested_by="workflow r",
    )
    engine.close()


def test_explicit_ids_are_honoured_and_keep_their_position() -> None:
    def wf(ctx: Context) -> Gen:
        approval = yield ctx.promise(id="approval-7", tags={"team": "legal"})
        yield ctx.run(charge, 1, id="charge-once")
        after = yield ctx.promise()
        return [approval.id, after.id]

    world = World()
    with Engine(wf, [], root_id="r") as engine:
        asked, outcome = steps(engine, world)
    assert [(s.step_id, s.position) for s in asked] == [
        ("approval-7", 0),
        ("charge-once", 1),
        ("r.2", 2),
    ]
    assert asked[0].tags == {
        "team": "legal",
        "troth:kind": "promise",
        "troth:args": args_digest(asked[0].command),
    }
    assert outcome == Done(["approval-7", "r.2"])
    assert replay(wf, [], world.history(), root_id="r") == outcome
    assert CALLS == ["charge 1"]


def test_child_workflows_nest_their_ids() -> None:
    def child(ctx: Context, x: int) -> Gen:
        a = yield ctx.run(charge, x)
        b = yield ctx.promise()
        return [a, b.id]

    def parent(ctx: Context) -> Gen:
        handle = yield ctx.start(child, 7)
        other = yield ctx.start("child", 8, id="custom-child", group="elsewhere")
        results = yield ctx.all([handle, other])
        return [handle.id, other.id, results]

    world = World()
    engine = Engine(parent, [], root_id="r", group="workers")
    asked, outcome = steps(engine, world)
    first, second = (args_digest(s.command) for s in asked)
    assert [(s.step_id, dict(s.tags), CODEC.decode(s.param)) for s in asked] == [
        (
            "r.0",
            {
                "troth:kind": "start",
                "troth:func": "child",
                "troth:invoke": "workers",
                "troth:args": first,
            },
            [7],
        ),
        (
            "custom-child",
            {
                "troth:kind": "start",
                "troth:func": "child",
                "troth:invoke": "elsewhere",
                "troth:args": second,
            },
            [8],
        ),
    ]
    assert outcome == Suspend(("r.0", "custom-child"))

    # Each child runs as its own root: its steps nest under its id.
    for child_id, arg in [("r.0", 7), ("custom-child", 8)]:
        with Engine(child, [arg], root_id=child_id) as child_engine:
            child_steps, child_outcome = steps(child_engine, world)
        assert [s.step_id for s in child_steps] == [f"{child_id}.0", f"{child_id}.1"]
        assert child_outcome == Done([{"charged": arg}, f"{child_id}.1"])
        world.settle(child_id, PromiseState.RESOLVED, arg * 10)

    final = engine.advance([world.promises["r.0"], world.promises["custom-child"]])
    assert final == Done(["r.0", "custom-child", [70, 80]])
    # The parent's history includes the grandchildren; they do not disturb its replay.
    assert replay(parent, [], world.history(), root_id="r") == final


def test_rpc_waits_for_the_child_result() -> None:
    def wf(ctx: Context) -> Gen:
        return (yield ctx.rpc("child", 1))

    tags = {"troth:kind": "start", "troth:func": "child"}
    assert replay(wf, [], [make("r.0", PromiseState.PENDING, tags=tags)], root_id="r") == Suspend(
        ("r.0",)
    )
    assert replay(wf, [], [make("r.0", value="ok", tags=tags)], root_id="r") == Done("ok")


def test_start_and_rpc_are_the_same_recorded_kind() -> None:
    def started(ctx: Context) -> Gen:
        handle = yield ctx.start("child")
        return (yield handle)

    def called(ctx: Context) -> Gen:
        return (yield ctx.rpc("child"))

    world = World()
    with Engine(started, [], root_id="r") as engine:
        drive(engine, world)
    world.settle("r.0", PromiseState.RESOLVED, 1)
    assert replay(called, [], world.history(), root_id="r") == Done(1)


def test_child_args_the_codec_cannot_encode_raise_at_the_yield() -> None:
    def wf(ctx: Context) -> Gen:
        try:
            yield ctx.start("child", {1, 2})
        except TypeError as exc:
            return str(exc)
        return "started"

    outcome = replay(wf, [], [], root_id="r")
    assert isinstance(outcome, Done)
    assert outcome.value.startswith("JsonCodec cannot encode")


# -- all / any -------------------------------------------------------------------


def _three(ctx: Context) -> Gen:
    handles = []
    for _ in range(3):
        handles.append((yield ctx.promise()))
    return handles


def test_any_picks_the_earliest_settled_not_the_first_listed() -> None:
    def wf(ctx: Context) -> Gen:
        handles = yield from _three(ctx)
        return (yield ctx.any(handles))

    history = [
        make("r.0", value="late", settled_at=30),
        make("r.1", PromiseState.PENDING),
        make("r.2", value="early", settled_at=10),
    ]
    assert replay(wf, [], history, root_id="r") == Done("early")
    pending = [make(f"r.{i}", PromiseState.PENDING) for i in range(3)]
    assert replay(wf, [], pending, root_id="r") == Suspend(("r.0", "r.1", "r.2"))


def test_at_least_returns_the_first_resolved_in_settle_order() -> None:
    def wf(ctx: Context) -> Gen:
        handles = yield from _three(ctx)
        return (yield ctx.at_least(2, handles))

    pending = [make(f"r.{i}", PromiseState.PENDING) for i in range(3)]
    assert replay(wf, [], pending, root_id="r") == Suspend(("r.0", "r.1", "r.2"))
    one = [make("r.0", PromiseState.PENDING), make("r.1", value="b"), pending[2]]
    assert replay(wf, [], one, root_id="r") == Suspend(("r.0", "r.2"))
    two = [make("r.0", PromiseState.PENDING), make("r.1", value="b", settled_at=20),
           make("r.2", value="c", settled_at=10)]  # fmt: skip
    assert replay(wf, [], two, root_id="r") == Done(["c", "b"])
    # A rejection does not end the wait while the quorum can still be reached...
    rejected_one = [make("r.0", PromiseState.REJECTED, "no", settled_at=5),
                    make("r.1", value="b", settled_at=20), pending[2]]  # fmt: skip
    assert replay(wf, [], rejected_one, root_id="r") == Suspend(("r.2",))
    # ...and a replay that sees the third settled too decides as the first run did.
    later = [make("r.0", PromiseState.REJECTED, "no", settled_at=5),
             make("r.1", value="b", settled_at=20), make("r.2", value="c", settled_at=30),
             ]  # fmt: skip
    assert replay(wf, [], later, root_id="r") == Done(["b", "c"])
    decided = [make("r.0", value="a", settled_at=1), make("r.1", value="b", settled_at=2),
               make("r.2", PromiseState.REJECTED, "late no", settled_at=3)]  # fmt: skip
    assert replay(wf, [], decided, root_id="r") == Done(["a", "b"])


def test_at_least_raises_the_rejection_that_puts_the_quorum_out_of_reach() -> None:
    def wf(ctx: Context) -> Gen:
        handles = yield from _three(ctx)
        try:
            return (yield ctx.at_least(2, handles))
        except PromiseRejectedError as exc:
            return f"declined: {exc.value}"

    failing = [make("r.0", PromiseState.REJECTED, "first no", settled_at=5),
               make("r.1", PromiseState.PENDING),
               make("r.2", PromiseState.REJECTED, "second no", settled_at=7)]  # fmt: skip
    assert replay(wf, [], failing, root_id="r") == Done("declined: second no")


def test_at_least_checks_its_count() -> None:
    ctx = Context("r")
    handles = [PromiseHandle("r.0"), PromiseHandle("r.1")]
    with pytest.raises(ValueError, match="between 1 and 2"):
        ctx.at_least(3, handles)
    with pytest.raises(ValueError, match="between 1 and 2"):
        ctx.at_least(0, handles)
    with pytest.raises(TypeError, match="whole number"):
        ctx.at_least(True, handles)


def test_all_returns_values_in_order_and_fails_fast_on_the_earliest_rejection() -> None:
    def wf(ctx: Context) -> Gen:
        handles = yield from _three(ctx)
        return (yield ctx.all(handles))

    resolved = [make(f"r.{i}", value=i, settled_at=10 - i) for i in range(3)]
    assert replay(wf, [], resolved, root_id="r") == Done([0, 1, 2])
    partly = [make("r.0", value=0), *(make(f"r.{i}", PromiseState.PENDING) for i in (1, 2))]
    assert replay(wf, [], partly, root_id="r") == Suspend(("r.1", "r.2"))
    failing = [
        make("r.0", PromiseState.PENDING),
        make("r.1", PromiseState.REJECTED, "second", settled_at=20),
        make("r.2", PromiseState.REJECTED, "first", settled_at=5),
    ]
    outcome = replay(wf, [], failing, root_id="r")
    assert isinstance(outcome, Failed)
    assert isinstance(outcome.error, PromiseRejectedError)
    assert (outcome.error.promise_id, outcome.error.value) == ("r.2", "first")

    def empty(ctx: Context) -> Gen:
        return (yield ctx.all([]))

    assert replay(empty, [], [], root_id="r") == Done([])


# -- now / random ---------------------------------------------------------------


def test_now_and_random_are_recorded_and_replay_identically() -> None:
    def wf(ctx: Context) -> Gen:
        first = yield ctx.now()
        roll = yield ctx.random()
        return [first, roll]

    engine = Engine(wf, [], root_id="r")
    step = engine.advance()
    assert isinstance(step, CreateStep)
    assert isinstance(step.command, Now)
    assert step.tags == {"troth:kind": "now"}
    moment = datetime(2025, 5, 6, 7, 8, 9, tzinfo=UTC)
    now_step = replace(make("r.0", value=moment.isoformat(), tags=dict(step.tags)))
    step = engine.advance([now_step])
    assert isinstance(step, CreateStep)
    assert isinstance(step.command, Random)
    roll_step = make("r.1", value=0.125, tags=dict(step.tags))
    first = engine.advance([roll_step])
    assert first == Done([moment, 0.125])

    for _ in range(3):
        assert replay(wf, [], [roll_step, now_step], root_id="r") == first


def test_draw_gives_values_the_engine_reads_back() -> None:
    def wf(ctx: Context) -> Gen:
        return [(yield ctx.now()), (yield ctx.random())]

    history = [
        make("r.0", value=Now.draw(), tags={"troth:kind": "now"}),
        make("r.1", value=Random.draw(), tags={"troth:kind": "random"}),
    ]
    outcome = replay(wf, [], history, root_id="r")
    assert isinstance(outcome, Done)
    moment, roll = outcome.value
    assert moment.tzinfo is not None
    assert 0 <= roll < 1


# -- misuse comes back as outcomes, never as exceptions out of the engine -------


def test_yielding_something_else_raises_type_error_at_the_yield() -> None:
    def sub(ctx: Context) -> Gen:
        yield ctx.promise()

    def wf(ctx: Context) -> Gen:
        try:
            yield sub(ctx)
        except TypeError as exc:
            assert "yield from" in str(exc)
        yield 42

    outcome = replay(wf, [], [], root_id="r")
    assert isinstance(outcome, Failed)
    assert isinstance(outcome.error, TypeError)
    assert "not int" in str(outcome.error)


def test_plain_function_and_bad_arguments_fail_the_workflow() -> None:
    def plain(ctx: Context) -> int:
        return 1

    outcome = replay(plain, [], [], root_id="r")  # type: ignore[arg-type]
    assert isinstance(outcome, Failed)
    assert "not a generator" in str(outcome.error)
    outcome = replay(publish, [], [], root_id="r")
    assert isinstance(outcome, Failed)
    assert isinstance(outcome.error, TypeError)


def test_advance_after_close_is_a_caller_bug() -> None:
    engine = Engine(publish, ["x"], root_id="r")
    engine.advance()
    engine.close()
    engine.close()
    with pytest.raises(RuntimeError, match="after close"):
        engine.advance()


# -- logging is silent during replay ----------------------------------------------


def test_ctx_log_is_silent_while_replaying(caplog: pytest.LogCaptureFixture) -> None:
    def wf(ctx: Context) -> Gen:
        ctx.log.info("start")
        yield ctx.run(charge, 1)
        ctx.log.info("charged")
        yield ctx.run(refund, 1)
        ctx.log.info("refunded", extra={"amount": 1})
        return "ok"

    caplog.set_level(logging.INFO, logger="troth.workflow")
    world = World()
    with Engine(wf, [], root_id="r") as engine:
        drive(engine, world)
    assert [r.getMessage() for r in caplog.records] == ["start", "charged", "refunded"]
    assert caplog.records[-1].workflow_id == "r"  # type: ignore[attr-defined]
    assert caplog.records[-1].amount == 1  # type: ignore[attr-defined]

    caplog.clear()
    partial = [p for p in world.history() if p.id == "r.0"]
    with Engine(wf, [], root_id="r", history=partial) as engine:
        replaying = [engine.replaying]
        drive(engine, world)
        replaying.append(engine.replaying)
    assert replaying == [True, False]
    assert [r.getMessage() for r in caplog.records] == ["charged", "refunded"]

    caplog.clear()
    assert replay(wf, [], world.history(), root_id="r") == Done("ok")
    assert [r.getMessage() for r in caplog.records] == ["refunded"]


def test_ctx_log_is_silent_while_replaying_named_steps(caplog: pytest.LogCaptureFixture) -> None:
    """Steps with explicit ids are recorded steps too (by `parent_id`): replaying them is
    silent, and `Engine.replayed` counts them."""

    def wf(ctx: Context) -> Gen:
        yield ctx.run(charge, 1, id="charge-order-1")
        ctx.log.info("charged")
        approval = yield ctx.promise(id="approve-order-1")
        ctx.log.info("asked")
        yield approval
        ctx.log.info("approved")
        return "ok"

    world = World()
    with Engine(wf, [], root_id="r") as engine:
        assert isinstance(drive(engine, world), Suspend)
    world.settle("approve-order-1", PromiseState.RESOLVED, True)
    # As the server records them: each step's parent is the root.
    history = [replace(p, parent_id="r", root_id="r") for p in world.history()]

    caplog.set_level(logging.INFO, logger="troth.workflow")
    with Engine(wf, [], root_id="r", history=history) as engine:
        assert engine.replaying
        assert drive(engine, world) == Done("ok")
        assert engine.replayed == 2
    # Without knowing when its task was created (`troth replay`): silent until the last
    # recorded step was replayed, then at least once.
    assert [r.getMessage() for r in caplog.records] == ["asked", "approved"]

    # A worker knows it (the task's create time): silent up to the wait it resumes at.
    caplog.clear()
    resumed_at = world.promises["approve-order-1"].settle_time
    with Engine(wf, [], root_id="r", history=history, resumed_at=resumed_at) as engine:
        assert drive(engine, world) == Done("ok")
    assert [r.getMessage() for r in caplog.records] == ["approved"]

    # Another workflow's promise with a `<root>.<n>`-looking id is not a step of this one.
    stranger = replace(make("r.7"), parent_id="someone-else")
    with Engine(wf, [], root_id="r", history=[*history, stranger]) as engine:
        assert drive(engine, world) == Done("ok")


def _resume(
    wf: Callable[..., Gen], world: World, resumed_at: datetime | None, caplog: Any
) -> tuple[Outcome, list[str]]:
    """Run `wf` as a fresh worker does on a resume (the history, the task's create
    time): its outcome, and what `ctx.log` logged."""
    caplog.clear()
    with Engine(wf, [], root_id="r", history=world.history(), resumed_at=resumed_at) as engine:
        outcome = drive(engine, world)
    return outcome, [r.getMessage() for r in caplog.records]


def test_a_resume_logs_nothing_the_execution_before_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 27: a line logged after the last recorded step, before the wait where the
    workflow suspended, was logged again by the worker that resumed it. Each line is
    logged once in all, across the executions of one run."""

    def wf(ctx: Context) -> Gen:
        ctx.log.info("started")
        first = yield ctx.promise()
        second = yield ctx.promise()
        ctx.log.info("waiting for the first")
        one = yield first
        ctx.log.info(f"first said {one}; waiting for the second")
        two = yield second
        ctx.log.info(f"second said {two}")
        yield ctx.run(charge, 1)
        ctx.log.info("charged")
        return [one, two]

    caplog.set_level(logging.INFO, logger="troth.workflow")
    world = World()
    with Engine(wf, [], root_id="r") as engine:
        assert isinstance(drive(engine, world), Suspend)
    logged = [r.getMessage() for r in caplog.records]
    assert logged == ["started", "waiting for the first"]

    # The first settles: the server creates the resume task in that transaction.
    first = world.settle("r.0", PromiseState.RESOLVED, "yes")
    outcome, lines = _resume(wf, world, first.settle_time, caplog)
    assert isinstance(outcome, Suspend)
    assert lines == ["first said yes; waiting for the second"]
    logged += lines

    # The second settles; a third worker replays both waits.
    second = world.settle("r.1", PromiseState.RESOLVED, "no")
    outcome, lines = _resume(wf, world, second.settle_time, caplog)
    assert outcome == Done(["yes", "no"])
    logged += lines
    assert logged == [
        "started",
        "waiting for the first",
        "first said yes; waiting for the second",
        "second said no",
        "charged",
    ]


def test_a_resume_after_a_timer_or_a_timeout_loses_no_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An expiry is settled as of its expire time, by a sweep that may come later, so
    before the task it creates: the lines after the wait it ends are new, and logged."""

    def wf(ctx: Context) -> Gen:
        approval = yield ctx.promise(timeout=timedelta(hours=1))
        ctx.log.info("asked")
        try:
            yield approval
        except PromiseTimedOutError:
            ctx.log.info("nobody answered")
        yield ctx.sleep(60)
        ctx.log.info("slept")
        return "done"

    caplog.set_level(logging.INFO, logger="troth.workflow")
    world = World()
    with Engine(wf, [], root_id="r") as engine:
        assert isinstance(drive(engine, world), Suspend)
    created = world.promises["r.0"].create_time
    expired = replace(
        world.promises["r.0"],
        state=PromiseState.REJECTED_TIMEDOUT,
        settle_time=created + timedelta(hours=1),
        settled_by="troth:timeout",
    )
    world.promises["r.0"] = expired
    swept = created + timedelta(hours=1, seconds=1)  # the sweep created the task
    outcome, lines = _resume(wf, world, swept, caplog)
    assert isinstance(outcome, Suspend)  # on the timer
    assert lines == ["nobody answered"]

    # The timer, created by that resume, fires 60 s later; the sweep is 1 s late.
    timer = replace(world.promises["r.1"], create_time=swept + timedelta(seconds=1))
    world.promises["r.1"] = replace(
        timer,
        state=PromiseState.RESOLVED,
        settle_time=timer.create_time + timedelta(seconds=60),
        settled_by="troth:timeout",
    )
    outcome, lines = _resume(wf, world, timer.create_time + timedelta(seconds=61), caplog)
    assert outcome == Done("done")
    assert lines == ["slept"]


# -- the finally: decision ------------------------------------------------------


def test_suspension_keeps_the_generator_and_close_runs_finally_once_silently(
    caplog: pytest.LogCaptureFixture,
) -> None:
    events: list[str] = []

    def wf(ctx: Context) -> Gen:
        approval = yield ctx.promise()
        try:
            return (yield approval)
        except Exception:
            events.append("except Exception caught the close")
            raise
        finally:
            ctx.log.warning("cleanup")
            events.append(f"finally replaying={ctx.is_replaying}")

    caplog.set_level(logging.DEBUG)
    world = World()
    engine = Engine(wf, [], root_id="r")
    assert drive(engine, world) == Suspend(("r.0",))
    gc.collect()
    assert events == [], "suspension must not run finally:"
    engine.close()
    assert events == ["finally replaying=True"]
    engine.close()
    assert events == ["finally replaying=True"]
    assert [r for r in caplog.records if r.name.startswith("troth")] == []


def test_close_of_a_finished_or_unstarted_engine_runs_nothing() -> None:
    events: list[str] = []

    def wf(ctx: Context) -> Gen:
        try:
            yield ctx.run(charge, 1)
        finally:
            events.append("finally")

    Engine(wf, [], root_id="r").close()
    assert events == []
    with Engine(wf, [], root_id="r") as engine:
        drive(engine, World())
    assert events == ["finally"]


def test_yield_inside_finally_is_not_run_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    def cleanup() -> None:
        raise AssertionError("a closing workflow's step ran")

    def wf(ctx: Context) -> Gen:
        approval = yield ctx.promise()
        try:
            yield approval
        finally:
            yield ctx.run(cleanup)

    engine = Engine(wf, [], root_id="r")
    assert drive(engine, World()) == Suspend(("r.0",))
    engine.close()  # must not raise, nor leave the generator for the GC to complain about
    gc.collect()
    warnings = [r for r in caplog.records if r.name == "troth.engine"]
    assert len(warnings) == 1
    assert "generator ignored GeneratorExit" in warnings[0].getMessage()


def test_a_stubborn_generator_is_closed_anyway(caplog: pytest.LogCaptureFixture) -> None:
    def wf(ctx: Context) -> Gen:
        refusals = 0
        while True:
            try:
                yield ctx.promise()
                yield PromiseHandle("external")
            except BaseException:  # a workflow that refuses to stop, twice
                refusals += 1
                if refusals > 2:
                    raise

    engine = Engine(wf, [], root_id="r")
    assert drive(engine, World()) == Suspend(("external",))
    engine.close()
    gc.collect()
    messages = [r.getMessage() for r in caplog.records if r.name == "troth.engine"]
    assert len(messages) == 2
    assert all("generator ignored GeneratorExit" in m for m in messages)


def test_exception_in_finally_while_closing_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def wf(ctx: Context) -> Gen:
        try:
            yield PromiseHandle("external")
        finally:
            raise ValueError("cleanup failed")

    engine = Engine(wf, [], root_id="r")
    assert engine.advance() == Suspend(("external",))
    engine.close()
    assert any("raised while closing" in r.getMessage() for r in caplog.records)


def test_nondeterminism_closes_the_generator_in_the_same_way() -> None:
    events: list[str] = []

    def wf(ctx: Context) -> Gen:
        try:
            yield ctx.run(refund, 1)
        finally:
            events.append("finally")

    history = [make("r.0", tags={"troth:kind": "run", "troth:func": "charge"})]
    with pytest.raises(NonDeterminismError):
        replay(wf, [], history, root_id="r")
    assert events == ["finally"]


# -- commands, context and errors ------------------------------------------------


def test_context_methods_only_build_commands() -> None:
    ctx = Context("r")
    assert ctx.promise(timeout=timedelta(seconds=5)) == CreatePromise(timeout=timedelta(seconds=5))
    assert ctx.sleep(1.5) == Sleep(timedelta(seconds=1.5))
    assert ctx.start(publish, "x") == StartWorkflow("publish", ("x",))
    assert ctx.rpc("publish", group="g").wait
    assert ctx.run(charge, 1).name == "charge"
    assert not ctx.is_replaying
    with pytest.raises(ValueError, match="reserved"):
        ctx.promise(tags={"troth:kind": "run"})
    with pytest.raises(ValueError, match="positive"):
        ctx.promise(timeout=timedelta(0))
    with pytest.raises(ValueError, match="negative"):
        ctx.sleep(-1)
    with pytest.raises(ValueError, match="at least one"):
        ctx.any([])
    with pytest.raises(TypeError, match="PromiseHandle"):
        ctx.all(["r.0"])  # type: ignore[list-item]


def test_retry_policy_backoff_and_non_retryable() -> None:
    policy = RetryPolicy(
        max_attempts=4, initial_backoff=0.5, max_backoff=1.5, non_retryable=(KeyError,)
    )
    assert [policy.backoff(n) for n in (1, 2, 3)] == [0.5, 1.0, 1.5]
    assert policy.should_retry(ValueError(), 3)
    assert not policy.should_retry(ValueError(), 4)
    assert not policy.should_retry(KeyError(), 1)
    assert not policy.should_retry(KeyboardInterrupt(), 1)
    for bad in ({"max_attempts": 0}, {"multiplier": 0.5}, {"initial_backoff": -1}):
        with pytest.raises(ValueError):
            RetryPolicy(**bad)


def test_workflow_errors_pickle() -> None:
    for error in (PromiseRejectedError("p", {"type": "X", "message": "m"}), Cancelled("p")):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert str(copy) == str(error)
    assert str(PromiseRejectedError("p", {"type": "X", "message": "m"})).endswith("X: m")


# -- property: any settle order replays to the same commands ----------------------

FUNCS = [charge, refund, send_email]

ops = st.lists(
    st.one_of(
        st.tuples(st.just("run"), st.integers(0, len(FUNCS) - 1)),
        st.tuples(st.just("promise")),
        st.tuples(st.just("await"), st.integers(0, 5)),
        st.tuples(st.just("any"), st.integers(0, 5), st.integers(0, 5)),
        st.tuples(st.just("sleep")),
        st.tuples(st.just("now")),
        st.tuples(st.just("random")),
    ),
    max_size=10,
)


def program(operations: list[tuple[Any, ...]]) -> Callable[..., Gen]:
    def wf(ctx: Context) -> Gen:
        handles: list[PromiseHandle] = []
        out: list[Any] = []
        for op in operations:
            try:
                if op[0] == "run":
                    out.append((yield ctx.run(FUNCS[op[1]], len(out))))
                elif op[0] == "promise":
                    handles.append((yield ctx.promise()))
                elif op[0] == "await" and handles:
                    out.append((yield handles[op[1] % len(handles)]))
                elif op[0] == "any" and handles:
                    pair = [handles[op[1] % len(handles)], handles[op[2] % len(handles)]]
                    out.append((yield ctx.any(pair)))
                elif op[0] == "sleep":
                    out.append((yield ctx.sleep(1)))
                elif op[0] == "now":
                    out.append((yield ctx.now()).isoformat())
                elif op[0] == "random":
                    out.append((yield ctx.random()))
            except PromiseRejectedError as exc:
                out.append(["rejected", exc.promise_id, exc.value])
        return out

    return wf


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations=ops, data=st.data())
def test_any_settle_order_and_any_worker_replay_to_the_same_commands(
    operations: list[tuple[Any, ...]], data: st.DataObject
) -> None:
    CALLS.clear()
    wf = program(operations)
    world = World()
    created: list[str] = []
    engine = Engine(wf, [], root_id="r")
    new: list[Promise] = []
    while True:
        outcome = engine.advance(new)
        new = []
        if isinstance(outcome, CreateStep):
            assert outcome.step_id not in created or outcome.exists
            created.append(outcome.step_id)
            new = [world.execute(outcome)]
            continue
        if not isinstance(outcome, Suspend):
            break
        # Settle some pending promises, in an order hypothesis picks, then resume
        # either on the cached engine or by replay on a fresh one (another worker).
        pending = sorted(p.id for p in world.history() if not p.is_settled)
        must = data.draw(st.sampled_from(outcome.awaiting))
        others = data.draw(st.lists(st.sampled_from(pending), unique=True, max_size=3))
        for promise_id in dict.fromkeys([*others, must]):
            is_timer = world.promises[promise_id].tags.get("troth:timer") == "true"
            reject = not is_timer and data.draw(st.booleans())
            state = PromiseState.REJECTED if reject else PromiseState.RESOLVED
            new.append(world.settle(promise_id, state, f"value of {promise_id}"))
        if data.draw(st.booleans()):
            engine.close()
            engine = Engine(wf, [], root_id="r", history=world.history())
            new = []
    engine.close()
    assert isinstance(outcome, Done)
    assert created == [f"r.{i}" for i in range(len(created))]
    runs = [s for s in created if world.promises[s].tags["troth:kind"] == "run"]
    assert world.calls == runs, "a run step's function ran more than once"
    calls_before = list(CALLS)
    # Any later replay of the full history: same result, nothing asked, nothing run.
    assert replay(wf, [], world.history(), root_id="r") == outcome
    assert replay(wf, [], reversed(world.history()), root_id="r") == outcome
    assert calls_before == CALLS
