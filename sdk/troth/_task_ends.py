"""How a task's hold ends, as the runner ends it: suspended, completed (settling the
workflow's root), or given back because a step it ran was recorded first by an
earlier holder of the task. A step's record the execution carries (`troth._carry`)
goes with the suspension or the completion, in the same call."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from troth._carry import superseded
from troth._step_writes import until_landed
from troth.errors import AlreadySettledError, PromiseTimedOutError, RpcError

if TYPE_CHECKING:
    import threading
    from collections.abc import Sequence

    from troth._carry import Carrier
    from troth._leases import Held, Leases
    from troth._promise import Promise
    from troth._tasks import TaskCalls
    from troth.client import Client
    from troth.codec import Payload

__all__ = ["TaskEnds"]

_log = logging.getLogger("troth.worker")


class TaskEnds:
    """The calls that end a task's hold, for the runner (thread-safe: no state).

    Args:
        client: Its codec encodes a rejection's value.
        tasks: The `TaskService` calls, as the worker makes them.
        leases: The worker's leases (a result waiting to land keeps its task busy).
        abandon: Set when the worker stops waiting for running tasks: an outcome
            still being recorded is given up.
    """

    def __init__(
        self, client: Client, tasks: TaskCalls, leases: Leases, abandon: threading.Event
    ) -> None:
        self._client = client
        self._tasks = tasks
        self._leases = leases
        self._abandon = abandon

    def suspend(
        self, held: Held, awaiting: Sequence[str], carrier: Carrier
    ) -> list[Promise] | None:
        """Suspend the task on `awaiting` (with the carried step's record, if any); the
        promises already settled, or None when the carried step was recorded first with
        another result (the workflow's execution here is void: give the task back)."""
        record = carrier.record
        if record is not None:
            try:
                answer = self._tasks.suspend(
                    held.task_id, held.counter, awaiting, record_step=record
                )
            except RpcError as exc:
                if superseded(exc):
                    carrier.drop()
                    return None
                # Anything else: the step is recorded by its own call (through any
                # outage), then the task suspends as it would have.
                _log.info(
                    "suspending workflow %r with its last step's record failed (%s); "
                    "recording the step by itself",
                    held.root_id,
                    exc,
                    extra={"workflow_id": held.root_id},
                )
            else:
                carrier.carried(answer.recorded)
                return answer.settled
            if not carrier.land():
                return None
        return self._tasks.suspend(held.task_id, held.counter, awaiting).settled

    def give_back(self, held: Held) -> None:
        """A step this execution ran was recorded first by an earlier holder of the task,
        with another result: what ran here after it is void; the task goes back to the
        group, to be replayed from the record."""
        _log.info(
            "a step of workflow %r was recorded first by an earlier holder of task %s; "
            "giving the task back to replay it from the record",
            held.root_id,
            held.task_id,
            extra={"workflow_id": held.root_id},
        )
        self._leases.release(held)

    def complete(
        self,
        held: Held,
        *,
        resolve: Payload | None = None,
        reject: Any = None,
        carrier: Carrier | None = None,
    ) -> bool:
        """Complete the task with the workflow's outcome, settling its root: kept and
        tried again through any outage until it lands, the task busy meanwhile (as a
        step's result: `StepWriter`); a lease lost meanwhile (`LeaseLostError`) leaves
        the outcome to the task's new holder, whose replay reaches it again. With the
        `carrier`'s record: recorded in the same call (False: another record stood, and
        nothing was done)."""
        encoded_reject = None if reject is None else self._client.encode(reject)
        record = None if carrier is None else carrier.record
        if carrier is not None and record is not None:
            try:
                with self._leases.busy(held):
                    recorded = self._tasks.complete(
                        held.task_id,
                        held.counter,
                        resolve=resolve,
                        reject=encoded_reject,
                        record_step=record,
                    )
            except RpcError as exc:
                if superseded(exc):
                    carrier.drop()
                    return False
                # Anything else (an outage, a root settled meanwhile): the step by its
                # own call, then the completion as it would have gone.
                if not carrier.land():
                    return False
            else:
                carrier.carried(recorded)
                return True

        def complete() -> None:
            try:
                self._tasks.complete(
                    held.task_id, held.counter, resolve=resolve, reject=encoded_reject
                )
            except (AlreadySettledError, PromiseTimedOutError) as exc:
                # The root was settled meanwhile (cancelled, timed out): that stands.
                _log.info(
                    "workflow %r finished, but its root was already settled (%s)",
                    held.root_id,
                    exc,
                    extra={"workflow_id": held.root_id},
                )
                self._tasks.complete(held.task_id, held.counter)

        with self._leases.busy(held):
            until_landed(
                complete,
                what=f"workflow {held.root_id!r} finished",
                abandon=self._abandon,
                extra={"workflow_id": held.root_id, "task_id": held.task_id},
            )
        return True
