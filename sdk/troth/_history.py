"""What the replay engine knows of a workflow's promises, and what an await makes of them.

`History` is the engine's record of the root's step promises (the history a
task carried, and every promise created or settled since): it answers what a
settled promise gives the `yield` that awaits it (its value, decoded, or the
error to throw) and what each kind of await (`PromiseHandle`, `AwaitAll`,
`AwaitAny`, `AwaitAtLeast`) resolves to on what is settled so far, or which
promises it still waits on. Pure: no I/O, no clock (the server's settle times
order the promises), no generator; `troth._engine.Engine` drives the generator.

`step_tags` is what a step command is recorded with (its kind, function,
group and arguments digest): replay compares them with the recorded step's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from troth._commands import (
    TAG_ARGS,
    TAG_FUNC,
    TAG_GROUP,
    TAG_INVOKE,
    TAG_KIND,
    TAG_TIMER,
    CreatePromise,
    Kind,
    Now,
    PromiseHandle,
    ReadState,
    RunStep,
    SettleToken,
    Sleep,
    StartWorkflow,
    StepCommand,
    WriteState,
)
from troth._digests import args_digest
from troth._promise import Decision, Promise, PromiseState
from troth.errors import Cancelled, PromiseRejectedError, timed_out

if TYPE_CHECKING:
    from troth._schema import DecisionSchema
    from troth.codec import Codec

__all__ = ["EXPIRY_PRINCIPAL", "Awaiting", "History", "Horizon", "Resolution", "Send", "Throw",
           "step_tags"]  # fmt: skip

EXPIRY_PRINCIPAL = "troth:timeout"
"""The `settled_by` of a promise settled by its own expiry (a timeout, a timer): its
settle time is its `expire_time`, which may be earlier than the sweep that settled it."""


@dataclass(frozen=True, slots=True)
class Send:
    """Send `value` into the generator at its `yield`."""

    value: Any


@dataclass(frozen=True, slots=True)
class Throw:
    """Throw `error` into the generator at its `yield`."""

    error: Exception | Cancelled


Resolution = Send | Throw


@dataclass(frozen=True, slots=True)
class Awaiting:
    """An await that cannot resolve yet: it waits on these pending promises."""

    ids: tuple[str, ...]


class History:
    """The root's promises as the engine knows them, and what awaits make of them.

    Args:
        root_id: The root promise's id.
        codec: Decodes the values of settled promises.
    """

    def __init__(self, root_id: str, codec: Codec) -> None:
        self.root_id = root_id
        self._codec = codec
        self._prefix = f"{root_id}."
        self.known: dict[str, Promise] = {}
        """Every promise known by id, the root's own excepted."""
        self.decisions: dict[str, DecisionSchema] = {}
        """Typed `ctx.promise` steps: their values are decoded into the declared type."""
        self.root_cancelled = False
        self.decided: Promise | None = None
        """The promise whose settlement decided the last await answered (None: it waits):
        the latest one an `all` needed, the first an `any` took, the one that filled or
        broke a quorum, the earliest failure."""

    def record(self, promise: Promise) -> None:
        """Learn a promise created or settled (the root's own: whether it is cancelled)."""
        if promise.id == self.root_id:
            self.root_cancelled = promise.state is PromiseState.REJECTED_CANCELED
            return
        known = self.known.get(promise.id)
        if known is not None and known.is_settled and not promise.is_settled:
            return  # a stale read never un-settles a promise
        self.known[promise.id] = promise

    def is_own_step(self, promise: Promise) -> bool:
        """A step of this workflow: its parent is the root (histories from before
        `parent_id`, and hand-written ones, say so by the id `<root>.<n>`)."""
        if promise.parent_id:
            return promise.parent_id == self.root_id
        return self.position_of(promise.id) is not None

    def position_of(self, promise_id: str) -> int | None:
        """n for a step id `<root>.<n>`; None for any other id."""
        if not promise_id.startswith(self._prefix):
            return None
        rest = promise_id[len(self._prefix) :]
        return int(rest) if rest.isdigit() and rest.isascii() else None

    # -- awaits ------------------------------------------------------------

    def await_all(
        self, handles: Sequence[PromiseHandle], *, single: bool, decisions: bool = False
    ) -> Resolution | Awaiting:
        """Every value (one, for a single handle), or the earliest failure."""
        promises = [self.known.get(h.id) for h in handles]
        settled = [(i, p) for i, p in enumerate(promises) if p is not None and p.is_settled]
        results = {i: self.result(p, decisions) for i, p in settled}
        failed = [(i, p) for i, p in settled if isinstance(results[i], Throw)]
        self.decided = None
        if failed:
            first, self.decided = min(failed, key=lambda item: _settle_order(item[1], item[0]))
            return results[first]
        if len(settled) < len(handles):
            pending = [h.id for h, p in zip(handles, promises, strict=True) if not _settled(p)]
            return Awaiting(tuple(dict.fromkeys(pending)))
        if settled:  # (an `all` of no handles needs nothing)
            _, self.decided = max(settled, key=lambda item: _settle_order(item[1], item[0]))
        values = [results[i] for i in range(len(handles))]
        if single:
            return values[0]
        return Send([v.value for v in values if isinstance(v, Send)])

    def await_any(
        self, handles: Sequence[PromiseHandle], decisions: bool = False
    ) -> Resolution | Awaiting:
        """The result of the earliest settled, by the server's settle time."""
        settled = self._settled(handles)
        self.decided = None
        if not settled:
            return Awaiting(tuple(dict.fromkeys(h.id for h in handles)))
        _, first = min(settled, key=lambda item: _settle_order(item[1], item[0]))
        self.decided = first
        return self.result(first, decisions)

    def await_at_least(
        self,
        count: int,
        handles: Sequence[PromiseHandle],
        distinct: bool = False,
        decisions: bool = False,
    ) -> Resolution | Awaiting:
        """The first `count` values, or the failure that puts them out of reach."""
        settled = self._settled(handles)
        # Replayed in settle order, so that the decision is the one the first
        # execution made, however many more have settled since.
        values: list[Any] = []
        rejected = 0
        approvers: set[str] = set()
        self.decided = None
        for _, promise in sorted(settled, key=lambda item: _settle_order(item[1], item[0])):
            result = self.result(promise, decisions)
            if distinct and isinstance(result, Send) and promise.settled_by:
                approver = settler(promise.settled_by)
                if approver in approvers:
                    # The same principal again: it counts once, so this one is lost.
                    result = Throw(_not_distinct(promise))
                approvers.add(approver)
            if isinstance(result, Send):
                values.append(result.value)
                if len(values) == count:
                    self.decided = promise
                    return Send(values)
            else:
                rejected += 1
                if len(handles) - rejected < count:
                    self.decided = promise
                    return result
        settled_ids = {p.id for _, p in settled}
        return Awaiting(tuple(dict.fromkeys(h.id for h in handles if h.id not in settled_ids)))

    def _settled(self, handles: Sequence[PromiseHandle]) -> list[tuple[int, Promise]]:
        return [
            (i, p)
            for i, p in enumerate(self.known.get(h.id) for h in handles)
            if p is not None and p.is_settled
        ]

    # -- values ------------------------------------------------------------

    def result(self, promise: Promise, decisions: bool = False) -> Resolution:
        """What a settled promise gives the `yield` that awaits it: with `decisions`,
        a resolved one's value as a `Decision` carrying who settled it, from the record."""
        result = self._plain_result(promise)
        if decisions and isinstance(result, Send):
            decision = Decision(promise.id, result.value, promise.settled_by, promise.settle_time)
            return Send(decision)
        return result

    def _plain_result(self, promise: Promise) -> Resolution:
        state = promise.state
        is_timer = promise.tags.get(TAG_TIMER) == "true"
        if state is PromiseState.RESOLVED or (is_timer and state is PromiseState.REJECTED_TIMEDOUT):
            try:
                value = self._codec.decode(promise.value)
                kind = promise.tags.get(TAG_KIND)
                if kind == Kind.NOW:
                    value = datetime.fromisoformat(value)
                elif kind == Kind.RANDOM:
                    value = float(value)
            except Exception as exc:  # a value this codec cannot read, raised at the yield
                return Throw(exc)
            decision = self.decisions.get(promise.id)
            if decision is not None and decision.decode is not None:
                try:
                    value = decision.decode(value)
                except Exception as exc:  # e.g. settled early, before its schema was known
                    return Throw(
                        TypeError(
                            f"the value of promise {promise.id!r} does not fit "
                            f"{decision.name}: {exc}"
                        )
                    )
            return Send(value)
        if state is PromiseState.REJECTED:
            try:
                value = self._codec.decode(promise.value)
            except Exception:
                value = promise.value.data
            return Throw(PromiseRejectedError(promise.id, value))
        if state is PromiseState.REJECTED_CANCELED:
            return Throw(Cancelled(promise.id))
        assert state is PromiseState.REJECTED_TIMEDOUT, f"engine bug: {promise.id} is {state}"
        return Throw(
            timed_out(promise.id, f"promise {promise.id!r} timed out before anyone settled it")
        )


@dataclass(frozen=True, slots=True)
class Horizon:
    """What the execution of a workflow before this one can have seen settled, so that
    a replay knows when it has gone past the point where that execution suspended
    (`ctx.log` is silent until then: its lines were logged once already).

    That execution suspended at a wait on promises all pending when it did; the task
    resuming the workflow was created (`resumed_at`, the server's clock) by the first
    settle of one of them, in that settle's transaction, or later. So a settle at or
    after `resumed_at` is new to this execution, and one before it was seen; except an
    expiry (a timeout, a timer), settled as of its `expire_time` by a sweep that may
    come later: one after the newest step the earlier execution created
    (`last_step`) is counted as new. Every error is on the side of logging a line
    again, never of losing one, as long as the server creates a resume task in the
    transaction of the settle that calls for it (or of the completion that finds one
    came meanwhile), as it does: a task created later than that would leave the
    lines after that wait silent until the workflow's next step.

    Attributes:
        resumed_at: When the task being run was created (`Task.create_time`).
        last_step: The newest creation time of the workflow's recorded steps.
    """

    resumed_at: datetime
    last_step: datetime | None

    def is_new(self, promise: Promise) -> bool:
        """Whether `promise` settled after the earlier execution suspended."""
        settled = promise.settle_time
        if settled is None or settled >= self.resumed_at:
            return True
        if (
            promise.settled_by == EXPIRY_PRINCIPAL
            or promise.state is PromiseState.REJECTED_TIMEDOUT
        ):
            return self.last_step is None or settled > self.last_step
        return False


def step_tags(command: StepCommand, group: str | None) -> dict[str, str]:
    """The tags a step command's promise is created with (`group`: the workflow's,
    the default of a child workflow's)."""
    if isinstance(command, CreatePromise):
        tags = {**command.tags, TAG_KIND: Kind.PROMISE}
        if group:
            tags[TAG_GROUP] = group
        return _with_digest(tags, command)
    if isinstance(command, RunStep):
        return _with_digest({TAG_KIND: Kind.RUN, TAG_FUNC: command.name}, command)
    if isinstance(command, Sleep):
        return _with_digest({TAG_KIND: Kind.SLEEP, TAG_TIMER: "true"}, command)
    if isinstance(command, StartWorkflow):
        tags = {TAG_KIND: Kind.START, TAG_FUNC: command.name}
        invoke = command.group or group
        if invoke:
            tags[TAG_INVOKE] = invoke
        return _with_digest(tags, command)
    if isinstance(command, SettleToken):
        return _with_digest({TAG_KIND: Kind.SETTLE_TOKEN}, command)
    if isinstance(command, Now):
        return {TAG_KIND: Kind.NOW}
    if isinstance(command, ReadState):
        return {TAG_KIND: Kind.STATE, TAG_FUNC: command.name}
    if isinstance(command, WriteState):
        return {TAG_KIND: Kind.STATE_SET, TAG_FUNC: command.name}
    return {TAG_KIND: Kind.RANDOM}


def _with_digest(tags: dict[str, str], command: StepCommand) -> dict[str, str]:
    digest = args_digest(command)
    if digest is not None:
        tags[TAG_ARGS] = digest
    return tags


def _settled(promise: Promise | None) -> bool:
    return promise is not None and promise.is_settled


_SETTLED_VIA = re.compile(r"([\x21-\x7e]+) via settle-token [A-Za-z0-9_-]{1,32}:[A-Za-z0-9_-]+")


def settler(settled_by: str) -> str:
    """The principal a settle acted for, from the promise's `settled_by`: a settle
    with a settle token is recorded as `<principal> via settle-token <key>:<id>` and
    counts as that principal's (the server's `settle_tokens.settler` reads it so)."""
    via = _SETTLED_VIA.fullmatch(settled_by)
    return settled_by if via is None else via[1]


def _not_distinct(promise: Promise) -> PromiseRejectedError:
    """What a quorum of distinct approvers raises when it is out of reach because one
    principal settled several of its promises."""
    return PromiseRejectedError(
        promise.id,
        {"reason": f"{settler(promise.settled_by)!r} already approved: approvers must be distinct"},
    )


def _settle_order(promise: Promise, index: int) -> tuple[int, float, int]:
    """Earliest settle time first; unknown times last; ties in handle order."""
    if promise.settle_time is None:
        return (1, 0.0, index)
    return (0, promise.settle_time.timestamp(), index)
