"""A step's record carried by the call that ends the task's hold (DESIGN §4 rule 6).

A `run`, `now` or `random` step computes its result in the worker, and was
recorded by a call of its own before the workflow went on. When the workflow's
next move is to wait (a suspension) or to finish, the `CompleteTask` that does
that now carries the record (`record_step`): one call and one write instead of
two, in one transaction. Meanwhile the workflow goes on with the result as it
will be recorded (`Carried.provisional`): only workflow code runs between the
two, which any replay runs again anyway, and nothing of it leaves the process
before the record lands.

- Any other next move (another step, a failure, the end of the task by an
  error) records it first by its own call, exactly as before.
- The carrying call failing for any reason (an outage, a lease that moved on)
  but one: the step is recorded by its own call, through any outage
  (`StepWriter.record_carried`), then the task goes on as it would have. An
  outage alone never re-runs a finished step.
- The one reason: the step was recorded already with another result (an
  earlier holder of the task was first: `STEP_RECORDED`, and nothing was
  done). The workflow went on here with a result that is not the record: its
  execution here is dropped and the task given back, to be replayed from the
  record. The same when the step's own call finds another result recorded.

Until the record lands the task is busy (`Leases.busy`): no failed heartbeat
takes it, as for a step's own record.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from troth.errors import FailedPreconditionError, Reason

if TYPE_CHECKING:
    from troth._engine import CreateStep
    from troth._leases import Held, Leases
    from troth._promise import Promise
    from troth._step_writes import Carried, StepWriter
    from troth.v1 import promises_pb2

__all__ = ["Carrier", "superseded"]


def superseded(error: Exception) -> bool:
    """Whether a carrying call was refused because the step was recorded already with
    another result (`STEP_RECORDED`: nothing was done)."""
    return isinstance(error, FailedPreconditionError) and error.reason == Reason.STEP_RECORDED


class Carrier:
    """The record (at most one) a task's execution carries to its next call."""

    def __init__(self, steps: StepWriter, leases: Leases, held: Held) -> None:
        self._steps = steps
        self._leases = leases
        self._held = held
        self._pending: Carried | None = None
        self._busy = contextlib.ExitStack()

    @property
    def record(self) -> promises_pb2.CreatePromiseRequest | None:
        """The record to carry with the next call, if any."""
        return None if self._pending is None else self._pending.request

    def run(self, step: CreateStep) -> Promise:
        """Run `step` (one `StepWriter.carries`) and hold its record; answer the step
        as it will be recorded."""
        assert self._pending is None, "a carried record lands before the next step runs"
        self._steps.confirm(self._held, step)
        self._busy.enter_context(self._leases.busy(self._held))
        try:
            self._pending = self._steps.compute(self._held, step)
        except BaseException:
            self._busy.close()
            raise
        return self._pending.provisional

    def carried(self, recorded: Promise | None) -> None:
        """The call that carried the record recorded it (as `recorded`)."""
        assert self._pending is not None
        self._held.written.append(recorded or self._pending.provisional)
        self._done()

    def land(self) -> bool:
        """Record the held step by its own call (nothing held: nothing to do), through
        any outage; False when the record found is another result (the workflow went
        on with one that is not the record: give the task back)."""
        pending = self._pending
        if pending is None:
            return True
        try:
            stored = self._steps.record_carried(self._held, pending)
        except BaseException:
            self._done()
            raise
        self._held.written.append(stored)
        self._done()
        expected = pending.provisional
        return stored.state is expected.state and stored.value == expected.value

    def drop(self) -> None:
        """Forget the held record (the server refused it: another one stands)."""
        self._done()

    def _done(self) -> None:
        self._pending = None
        self._busy.close()
