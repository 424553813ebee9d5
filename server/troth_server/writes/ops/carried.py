"""A step's record carried in the call that ends a task's hold (`CompleteTask` with
`record_step`): one call and one write where a worker made two (the step's
`CreatePromise`, then its suspension or completion)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from troth_server.domain.steps import StepRecorded
from troth_server.writes.batch import Batch, Keys

if TYPE_CHECKING:
    from troth_server.domain.promise import Promise, SettleRequest
    from troth_server.store import WriteTx
    from troth_server.writes.group_commit import WriteOp
    from troth_server.writes.ops.create import CreateOp

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class RecordThenOp(Generic[R]):
    """`step` (a fenced create, already settled with the step's result) and then `then`
    (a `SuspendOp` or `CompleteOp` of the same task), in one transaction.

    A step that exists with the same result counts as recorded (this call repeated,
    its first answer lost). One that exists with another result was recorded first
    by an earlier holder of the task: that record stands and nothing is done
    (`StepRecorded`: the worker replays from it). A `then` refused after the step was
    created (the lease moved on) keeps the step, as the step's own call would have:
    a finished result is accepted at any counter the task had, and the worker, told
    of the refusal, records the step again by itself and finds it recorded.
    """

    step: CreateOp
    then: WriteOp[R]

    def keys(self, tx: WriteTx, now: int) -> Keys:
        return merged(self.step.keys(tx, now), self.then.keys(tx, now))

    def apply(self, batch: Batch) -> tuple[Promise, R]:
        existing = batch.get(self.step.request.id)
        settled_with = self.step.settled_with
        assert settled_with is not None, "a carried step is recorded settled"
        if existing is not None and not same_result(existing, settled_with):
            raise StepRecorded(existing)
        recorded, _ = self.step.apply(batch)
        return recorded, self.then.apply(batch)


def same_result(step: Promise, result: SettleRequest) -> bool:
    """Whether `step` was settled with `result` (its state and value)."""
    value = step.value
    return (
        step.state is result.state
        and value.data == result.value.data
        and dict(value.headers) == dict(result.value.headers)
    )


def merged(first: Keys, second: Keys) -> Keys:
    """What two ops of one transaction need loaded: both ops' keys."""
    fields: dict[str, Any] = {}
    for key in dataclasses.fields(Keys):
        a, b = getattr(first, key.name), getattr(second, key.name)
        fields[key.name] = (a or b) if isinstance(a, bool) else (*a, *b)
    return Keys(**fields)
