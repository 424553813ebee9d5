"""The replay engine and a workflow's state slots (`ctx.state`, `ctx.set_state`): a
read or write is a step the server records (resolved with the slot's value, tagged
with its version); a replay answers it from the record, whatever the slot holds now;
a read of a slot never written gives the default; a changed slot name at a position
is non-determinism. Pure: histories in, outcomes out."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from troth import Context, JsonCodec, NonDeterminismError, Promise, PromiseState
from troth._commands import ReadState, WriteState
from troth._engine import CreateStep, Done, Engine, Failed, Suspend
from troth.codec import Payload

CODEC = JsonCodec()
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def recorded(step: CreateStep, version: int, value: Any = None) -> Promise:
    """The step as the server records it (what `StateStepOp` writes)."""
    return Promise(
        id=step.step_id,
        state=PromiseState.RESOLVED,
        param=Payload(),
        value=CODEC.encode(value) if version else Payload(),
        tags={**step.tags, "troth:state": step.tags["troth:func"],
              "troth:state-version": str(version)},
        create_time=T0,
        settle_time=T0,
        parent_id="w",
    )  # fmt: skip


def loop(ctx: Context) -> Generator[Any, Any, Any]:
    thread = yield ctx.state("thread", default=["hello"])
    version = yield ctx.set_state("thread", [*thread, "asked"])
    approval = yield ctx.promise(id="w.approval")
    yield approval
    after = yield ctx.state("thread")
    return {"thread": thread, "version": version, "after": after}


def test_reads_and_writes_are_steps_answered_from_the_record() -> None:
    engine = Engine(loop, root_id="w")
    read = engine.advance()
    assert isinstance(read, CreateStep) and isinstance(read.command, ReadState)
    assert read.tags == {"troth:kind": "state", "troth:func": "thread"}
    write = engine.advance([recorded(read, 0)])  # never written: the default
    assert isinstance(write, CreateStep) and isinstance(write.command, WriteState)
    assert write.command.value == ["hello", "asked"]
    assert write.tags == {"troth:kind": "state_set", "troth:func": "thread"}
    history = [recorded(read, 0), recorded(write, 1, ["hello", "asked"])]
    promise = engine.advance(history[1:])
    assert isinstance(promise, CreateStep)
    approval = Promise(
        id="w.approval", state=PromiseState.PENDING, param=Payload(), value=Payload(),
        tags=dict(promise.tags), create_time=T0, parent_id="w",
    )  # fmt: skip
    assert isinstance(engine.advance([approval]), Suspend)
    history.append(approval)

    # Resumed elsewhere after an operator rewrote the slot (version 2): the recorded
    # read and write replay as they were; the read after the wait is a new step.
    settled = replace(
        approval, state=PromiseState.RESOLVED, value=CODEC.encode(True), settle_time=T0
    )
    replay = Engine(loop, root_id="w", history=[*history[:2], settled])
    after = replay.advance()
    assert isinstance(after, CreateStep) and isinstance(after.command, ReadState)
    assert replay.replayed == 3
    done = replay.advance([recorded(after, 2, ["rewritten"])])
    assert done == Done({"thread": ["hello"], "version": 1, "after": ["rewritten"]})


def test_a_changed_slot_name_is_non_determinism() -> None:
    engine = Engine(loop, root_id="w")
    read = engine.advance()
    assert isinstance(read, CreateStep)
    other = recorded(read, 1, ["x"])
    other = replace(other, tags={"troth:kind": "state", "troth:func": "notes"})
    failed = Engine(loop, root_id="w", history=[other]).advance()
    assert isinstance(failed, Failed) and isinstance(failed.error, NonDeterminismError)
    assert "state(notes)" in str(failed.error) and "state(thread)" in str(failed.error)


@pytest.mark.parametrize("name", ["", "a b", "x" * 129, "slash/no", 7])
def test_a_bad_slot_name_is_refused_at_the_call(name: Any) -> None:
    ctx = Context("w")
    with pytest.raises(ValueError, match="name must be 1 to 128 characters"):
        ctx.state(name)
    with pytest.raises(ValueError, match="name must be 1 to 128 characters"):
        ctx.set_state(name, 1)
