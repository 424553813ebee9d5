"""The sans-I/O replay engine: drives one workflow generator against its history.

`Engine` is the only owner of the generator's `send`/`throw`/`close`. Given
the workflow, its arguments, its root promise id and the history (the step
promises the server holds for it), `Engine.advance()` runs the generator as
far as it can without I/O and answers with one `Outcome`:

- `CreateStep`: a step promise must be created. For `RunStep` the caller then
  runs the function (retrying per its policy) and resolves or rejects the
  step with the result (`error_value(exc)` for a failure); for `Now` and
  `Random` it resolves it with `command.draw()`; for the others it creates it
  pending (with `ttl`). Feed the created or settled promise back with
  `advance([promise])`.
- `Suspend(awaiting)`: the workflow waits on promises still pending. Register
  callbacks for them; if some settled meanwhile, feed them back with
  `advance([...])`, else the task ends and the workflow resumes by replay.
- `Done(value)` / `Failed(error)`: resolve the root promise / the workflow raised.
  The worker decides what a `Failed` means (`troth._failures`): the workflow's
  outcome rejects the root; a bug fails only the task, which is retried.

It never raises for anything the workflow does: exceptions out of workflow
code and non-determinism both come back as `Failed`. It does no I/O, reads no
clock and draws no random numbers.

Replay. A step command at position n (counting only commands that create a
promise) gets the id `<root>.<n>`, unless given an explicit id. If the
history holds that id, the step's `troth:kind`/`troth:func` tags must match
the command, and so must its `troth:args` digest of what the command asks
(`troth._digests`; computed in the digest version the step recorded) when both
the recorded step and the command have one (not for histories recorded before
digests, nor for a step that opts out with `check_args=False`), else
`Failed(NonDeterminismError)`; a settled step's value is sent into the generator
(or its error thrown) without running anything, so a function whose step is
settled is never called again. A recorded step the code never reaches before it
finishes, blocks or raises is non-determinism too; when the code raised, the
error names that exception and has it as its `__cause__` (the worker reports a
bug's own traceback: `troth._failures.task_failure`).

Awaiting. Yielding a `PromiseHandle`, `AwaitAll`, `AwaitAny` or `AwaitAtLeast` creates no
promise and shifts no id. Where several awaited promises are settled,
`AwaitAny` (and `AwaitAll`'s fail-fast) pick the earliest by the server's
settle time, not by what this process happened to see first, so a replay that
sees more of them settled still takes the same path.

Closing and `finally:`. A workflow suspended at a `yield` is a live generator.
The engine keeps it until `close()` (the worker calls it when the task ends
or it evicts the workflow from its cache), and `close()` is the one place that
ends it: it throws the private `_Evicted` (a `GeneratorExit`) in at the
suspended `yield`, so the workflow's `finally:` blocks and `with` exits run
then, once per close, in the process that held it, with `ctx.log` silenced.
They therefore run on every eviction, not once per workflow: durable cleanup
belongs in a step after the `try`, not in `finally:`. A `yield` inside such a
`finally:` is not run (the engine does no I/O while closing); it is the case
where Python reports `RuntimeError("generator ignored GeneratorExit")`, which
`close()` logs at WARNING on `troth.engine` and then closes the generator
again, so it never surfaces later from the garbage collector.

Layout. The engine owns the generator and the order of steps; what it knows
of the promises, and what an await makes of them, is `troth._history.History`.

Logging. `ctx.log` is silent while `Engine.replaying` (`ctx.is_replaying`): from
the start until the workflow has gone past everything an earlier execution ran,
that is until every step recorded in the history (the root's own steps, by
`parent_id`: named steps as well as `<root>.<n>` ones) has been replayed and,
when the engine knows when its task was created (`resumed_at`), it has also
passed the wait where the execution before suspended (the first wait answered
by a settle that execution cannot have seen: `troth._history.Horizon`); or
until the engine first asks for I/O. So a line logged before the suspension
(after the last recorded step, say, just before `yield approval`) is logged
once, not again by the worker that resumes. `Engine.replayed` counts the steps
answered from the history. Where the horizon is unsure (an expiry seen just
before the suspension), a line may appear again: at least once, never lost.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Self

from troth._commands import (
    TAG_ARGS,
    TAG_FUNC,
    TAG_KIND,
    AwaitAll,
    AwaitAny,
    AwaitAtLeast,
    Command,
    CreatePromise,
    Now,
    PromiseHandle,
    Random,
    ReadState,
    RunStep,
    SettleToken,
    Sleep,
    StartWorkflow,
    StepCommand,
    WriteState,
)
from troth._digests import args_digest, describe_args, describe_recorded, recorded_version
from troth._failures import describe_error
from troth._history import Awaiting, History, Horizon, Resolution, Send, Throw, step_tags
from troth.codec import Codec, JsonCodec, Payload
from troth.context import Context
from troth.errors import Cancelled, NonDeterminismError

if TYPE_CHECKING:
    from troth._promise import Promise

__all__ = [
    "CreateStep",
    "Done",
    "Engine",
    "Failed",
    "Outcome",
    "Suspend",
    "Workflow",
    "describe_tags",
    "error_value",
]

_log = logging.getLogger("troth.engine")

Workflow = Callable[..., Generator[Any, Any, Any]]
"""A workflow: a generator function `def wf(ctx, *args)`."""

_STEP_TYPES = (
    CreatePromise, RunStep, Sleep, StartWorkflow, Now, Random, SettleToken, ReadState, WriteState
)  # fmt: skip
STATE_VERSION_TAG = "troth:state-version"
"""On a state step: the slot's version it read or wrote (the server's tag)."""
_AWAIT_TYPES = (PromiseHandle, AwaitAll, AwaitAny, AwaitAtLeast)
_CLOSE_ATTEMPTS = 5


@dataclass(frozen=True, slots=True)
class CreateStep:
    """The server must create step promise `step_id` (and, for some commands, settle it).

    Attributes:
        step_id: The step promise's id.
        position: Its position n among the workflow's step commands.
        command: What the workflow yielded.
        tags: The tags to create it with (they record what was yielded).
        param: The param to create it with (a child workflow's encoded arguments).
        ttl: Its timeout (`ctx.promise(timeout=...)`, a sleep's duration, a
            child workflow's ttl), or None for the server's default.
        exists: True when the history already holds the step, pending: a
            `RunStep` (or `Now`/`Random`) whose worker died before recording
            its result. Run it again and settle the existing promise.
    """

    step_id: str
    position: int
    command: StepCommand
    tags: Mapping[str, str]
    param: Payload
    ttl: timedelta | None = None
    exists: bool = False
    requested_by: str = ""
    """Who asks, for a `ctx.promise` step: `workflow <root id>`."""


@dataclass(frozen=True, slots=True)
class Suspend:
    """The workflow waits on these pending promises (one of them, or all of them)."""

    awaiting: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Done:
    """The workflow returned `value`: resolve the root promise with it."""

    value: Any


@dataclass(frozen=True, slots=True)
class Failed:
    """The workflow raised `error` (or replay found it changed): reject the root promise if
    it is the workflow's outcome, else fail the task (`troth._failures.fails_workflow`).
    `Cancelled`, a `BaseException`, is the one error out of workflow code that is not an
    `Exception`."""

    error: Exception | Cancelled


Outcome = CreateStep | Suspend | Done | Failed
"""What `Engine.advance` answers."""


class _Evicted(GeneratorExit):
    """Thrown into a suspended workflow by `Engine.close()`: it leaves this process.

    A `GeneratorExit`, hence a `BaseException`: `except Exception` in workflow
    code does not swallow it, and `except GeneratorExit` sees it as a close.
    """


def error_value(error: BaseException) -> dict[str, str]:
    """What a failed step (or workflow) is rejected with: the exception's type and message."""
    kind = type(error)
    module = "" if kind.__module__ == "builtins" else f"{kind.__module__}."
    return {"type": f"{module}{kind.__qualname__}", "message": str(error)}


def describe_tags(tags: Mapping[str, str]) -> str:
    """A step as `NonDeterminismError` names it, e.g. `run(send_email)` or `promise`."""
    kind = tags.get(TAG_KIND) or "untagged promise"
    func = tags.get(TAG_FUNC)
    return f"{kind}({func})" if func else kind


class Engine:
    """Drives one workflow generator against its history; see the module docstring.

    Args:
        workflow: The generator function, called as `workflow(ctx, *args)`.
        args: The decoded arguments (the root promise's param).
        root_id: The root promise's id.
        history: The root's descendant promises the server holds (settled, and
            pending ones known to exist), in any order. The root itself may be
            included: if it is cancelled, the workflow gets `Cancelled`
            instead of any new step or wait.
        codec: Decodes step values and encodes child arguments; default JSON.
        group: This workflow's group, the default for child workflows.
        resumed_at: When the task being run was created (`Task.create_time`), if
            known: with it, `ctx.log` stays silent until the workflow has passed the
            wait where the execution before this one suspended (see the module
            docstring); without it (`troth replay`), only until the recorded steps
            are replayed.
    """

    def __init__(
        self,
        workflow: Workflow,
        args: Sequence[Any] = (),
        *,
        root_id: str,
        history: Iterable[Promise] = (),
        codec: Codec | None = None,
        group: str | None = None,
        resumed_at: datetime | None = None,
    ) -> None:
        self.root_id = root_id
        self._workflow = workflow
        self._args = tuple(args)
        self._codec: Codec = codec or JsonCodec()
        self._group = group
        self._history = History(root_id, self._codec)
        self._cancel_delivered = False
        for promise in history:
            self._history.record(promise)
        self._to_replay = {
            id for id, p in self._history.known.items() if self._history.is_own_step(p)
        }
        """The recorded steps not yet replayed: while any is left, `ctx.log` is silent."""
        known = self._history.known
        self._horizon: Horizon | None = (
            Horizon(resumed_at, max(known[id].create_time for id in self._to_replay))
            if resumed_at is not None and self._to_replay
            else None
        )
        """Set until the workflow passed the wait where the execution before suspended."""
        self._replayed = 0
        self.context = Context(root_id, replaying=lambda: self.replaying)
        self._gen: Generator[Any, Any, Any] | None = None
        self._started = False
        self._closing = False
        self._live = False
        self._next_position = 0
        self._current: Command[Any] | None = None
        self._current_id = ""
        self._current_position = -1
        self._pending: Resolution | None = None
        self._final: Done | Failed | None = None

    # -- public protocol ---------------------------------------------------

    @property
    def replaying(self) -> bool:
        """True while re-running what an earlier execution ran: the recorded steps, and
        up to the wait where the execution before suspended (and while closing):
        `ctx.log` is silent."""
        if self._closing:
            return True
        return not self._live and (bool(self._to_replay) or self._horizon is not None)

    @property
    def replayed(self) -> int:
        """How many step commands were answered from the history (recorded and reached)."""
        return self._replayed

    @property
    def finished(self) -> bool:
        """True once `advance` answered `Done` or `Failed`."""
        return self._final is not None

    def advance(self, settled: Iterable[Promise] = ()) -> Outcome:
        """Record `settled` (promises created or settled since), then run until I/O is needed.

        Repeating a call without new promises repeats the answer. After
        `Done`/`Failed`, every call answers the same.
        """
        for promise in settled:
            self._history.record(promise)
        if self._final is not None:
            return self._final
        if self._closing:
            raise RuntimeError("Engine.advance() after close(); build a new Engine to replay")
        if not self._started:
            outcome = self._start()
            if outcome is not None:
                return outcome
        while True:
            step = self._resolve()
            if not isinstance(step, Send | Throw):
                return step
            outcome = self._resume(step)
            if outcome is not None:
                return outcome

    def close(self) -> None:
        """End a suspended workflow's generator here and now (its `finally:` blocks run).

        The one place the engine ends a generator it did not see finish; call
        it when the task ends or the workflow is evicted. Idempotent. Never
        raises for what the workflow's cleanup does; `ctx.log` stays silent.
        """
        gen, self._gen = self._gen, None
        self._closing = True
        if gen is not None:
            _close_generator(gen, self.root_id)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- driving the generator --------------------------------------------

    def _start(self) -> Outcome | None:
        self._started = True
        try:
            # Typed as a generator, but user code may be a plain function.
            gen: object = self._workflow(self.context, *self._args)
        except Exception as exc:
            return self._finish(Failed(exc))
        if not isinstance(gen, Generator):
            name = getattr(self._workflow, "__qualname__", repr(self._workflow))
            return self._finish(
                Failed(
                    TypeError(
                        f"workflow {name} returned {type(gen).__name__}, not a generator: "
                        "a workflow must `yield` its steps (write `yield ctx.run(...)`)"
                    )
                )
            )
        self._gen = gen
        return self._resume(Send(None))

    def _resume(self, resolution: Resolution) -> Outcome | None:
        """Send or throw into the generator; accept what it yields, or finish."""
        gen = self._gen
        assert gen is not None, "engine bug: resuming without a generator"
        self._current = None
        try:
            if isinstance(resolution, Throw):
                if isinstance(resolution.error, Cancelled) and self._history.root_cancelled:
                    self._cancel_delivered = True
                yielded = gen.throw(resolution.error)
            else:
                yielded = gen.send(resolution.value)
        except StopIteration as stop:
            self._gen = None
            return self._finish(Done(stop.value))
        except (Exception, Cancelled) as exc:  # a cancel the workflow let through
            self._gen = None
            return self._finish(Failed(exc))
        self._accept(yielded)
        return None

    def _accept(self, yielded: Any) -> None:
        if isinstance(yielded, _STEP_TYPES):
            position = self._next_position
            self._next_position += 1
            self._current = yielded
            self._current_position = position
            self._current_id = yielded.id or f"{self.root_id}.{position}"
        elif isinstance(yielded, _AWAIT_TYPES):
            self._current = yielded
        else:
            hint = (
                " (a generator: did you mean `yield from`?)" if inspect.isgenerator(yielded) else ""
            )
            self._pending = Throw(
                TypeError(
                    f"workflows yield commands from ctx (ctx.run(...), ctx.promise(), ...) or "
                    f"handles, not {type(yielded).__name__}{hint}"
                )
            )

    def _resolve(self) -> Resolution | Outcome:
        """What to send into the generator for the current command, or the I/O it needs."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            return pending
        command = self._current
        history = self._history
        awaited: Resolution | Awaiting
        if isinstance(command, PromiseHandle):
            awaited = history.await_all((command,), single=True)
        elif isinstance(command, AwaitAll):
            awaited = history.await_all(command.handles, single=False, decisions=command.decisions)
        elif isinstance(command, AwaitAny):
            awaited = history.await_any(command.handles, command.decisions)
        elif isinstance(command, AwaitAtLeast):
            awaited = history.await_at_least(
                command.count, command.handles, command.distinct, command.decisions
            )
        else:
            assert isinstance(command, _STEP_TYPES), f"engine bug: nothing to resolve ({command})"
            return self._resolve_step(command)
        if isinstance(awaited, Awaiting):
            return self._suspend(awaited.ids)
        self._waited(history.decided)
        return awaited

    def _resolve_step(self, command: StepCommand) -> Resolution | Outcome:
        step_id, position = self._current_id, self._current_position
        tags = step_tags(command, self._group)
        if isinstance(command, CreatePromise) and command.schema is not None:
            self._history.decisions[step_id] = command.schema
        recorded = self._history.known.get(step_id)
        if recorded is None:
            return self._create(command, step_id, position, tags)
        if (recorded.tags.get(TAG_KIND), recorded.tags.get(TAG_FUNC)) != (
            tags.get(TAG_KIND),
            tags.get(TAG_FUNC),
        ):
            return self._nondeterminism(
                position, describe_tags(recorded.tags), describe_tags(tags), step_id
            )
        recorded_digest = recorded.tags.get(TAG_ARGS)
        version = recorded_version(recorded_digest) if recorded_digest else None
        # Computed in the version the step recorded: a history is checked on what it
        # recorded, never on more (a promise recorded before version 2, on its id,
        # timeout and schema only).
        digest = args_digest(command, version) if version else None
        if recorded_digest and digest and recorded_digest != digest:
            # Only when both sides have one: a history recorded before digests,
            # or a step opted out (`check_args=False`) on either side, is not checked.
            asked = describe_recorded(recorded)
            return self._nondeterminism(
                position,
                f"{describe_tags(recorded.tags)} with arguments "
                f"{f'{asked}, ' if asked else ''}digest {recorded_digest}",
                f"{describe_tags(tags)} with arguments {describe_args(command)}, digest {digest}",
                step_id,
            )
        if isinstance(command, CreatePromise) or (
            isinstance(command, StartWorkflow) and not command.wait
        ):
            return self._replayed_step(step_id, Send(PromiseHandle(step_id)))
        if isinstance(command, Sleep | StartWorkflow):
            if not recorded.is_settled:
                return self._suspend((step_id,))
            self._waited(recorded)  # a timer or a child the execution before waited for
            return self._replayed_step(step_id, self._history.result(recorded))
        if isinstance(command, ReadState | WriteState) and recorded.is_settled:
            # Read or written by the server in the step's own transaction: never pending.
            version = int(recorded.tags.get(STATE_VERSION_TAG) or 0)
            if isinstance(command, WriteState):
                return self._replayed_step(step_id, Send(version))
            if version == 0:
                return self._replayed_step(step_id, Send(command.default))
        # RunStep, Now, Random: a pending one lost its worker before its result was recorded.
        if not recorded.is_settled:
            return self._create(command, step_id, position, tags, exists=True)
        return self._replayed_step(step_id, self._history.result(recorded))

    def _create(
        self,
        command: StepCommand,
        step_id: str,
        position: int,
        tags: Mapping[str, str],
        *,
        exists: bool = False,
    ) -> Resolution | Outcome:
        if self._history.root_cancelled and not self._cancel_delivered:
            # Once the workflow has been told, it may run compensation steps
            # (checkpointed like any other) before it ends; it may not wait again.
            self._horizon = None  # news to the workflow: what it logs now is new
            return Throw(Cancelled(self.root_id))
        param = Payload()
        ttl: timedelta | None = None
        if isinstance(command, StartWorkflow):
            try:
                param = self._codec.encode(list(command.args))
            except Exception as exc:  # the codec's TypeError/ValueError, at the yield
                return Throw(exc)
            ttl = command.ttl
        elif isinstance(command, CreatePromise):
            ttl = command.timeout
        elif isinstance(command, Sleep):
            ttl = command.duration
        self._live = True
        requested_by = f"workflow {self.root_id}" if isinstance(command, CreatePromise) else ""
        return CreateStep(step_id, position, command, tags, param, ttl, exists, requested_by)

    def _waited(self, decided: Promise | None) -> None:
        """A wait answered from the history by `decided`: past the point where the
        execution before suspended if that execution cannot have seen it settled (a
        wait that needed no promise, `ctx.all([])`, tells nothing)."""
        horizon = self._horizon
        if horizon is not None and decided is not None and horizon.is_new(decided):
            self._horizon = None

    def _replayed_step(self, step_id: str, resolution: Resolution) -> Resolution:
        """A recorded step answered from the history, without I/O."""
        self._replayed += 1
        self._to_replay.discard(step_id)
        return resolution

    def _suspend(self, awaiting: tuple[str, ...]) -> Resolution | Outcome:
        if self._history.root_cancelled:
            self._horizon = None  # news to the workflow: what it logs now is new
            return Throw(Cancelled(self.root_id))
        unreached = self._unreached()
        if unreached is not None:
            return unreached
        self._live = True
        return Suspend(awaiting)

    def _finish(self, outcome: Done | Failed) -> Done | Failed:
        raised = outcome.error if isinstance(outcome, Failed) else None
        unreached = self._unreached(raised)
        self._final = unreached or outcome
        return self._final

    def _unreached(self, raised: BaseException | None = None) -> Failed | None:
        """Non-determinism when the history holds a step at a position the code has not
        reached (before it blocked, returned, or raised `raised`: named, and the cause)."""
        ahead = [
            (position, promise)
            for promise in self._history.known.values()
            if (position := self._history.position_of(promise.id)) is not None
            and position >= self._next_position
            and self._history.is_own_step(promise)
        ]
        if not ahead:
            return None
        position, promise = min(ahead, key=lambda item: item[0])
        return self._nondeterminism(
            position, describe_tags(promise.tags), None, promise.id, raised=raised
        )

    def _nondeterminism(
        self,
        position: int,
        recorded: str | None,
        yielded: str | None,
        step_id: str,
        *,
        raised: BaseException | None = None,
    ) -> Failed:
        error = NonDeterminismError(
            position,
            recorded=recorded,
            yielded=yielded,
            step_id=step_id,
            raised="" if raised is None else describe_error(raised),
        )
        error.__cause__ = raised
        gen, self._gen = self._gen, None
        if gen is not None:
            closing, self._closing = self._closing, True
            try:
                _close_generator(gen, self.root_id)
            finally:
                self._closing = closing
        self._final = Failed(error)
        return self._final


def _close_generator(gen: Generator[Any, Any, Any], workflow_id: str) -> None:
    """End a generator, running its `finally:` blocks; never raise, never leave it alive."""
    if inspect.getgeneratorstate(gen) == inspect.GEN_CLOSED:
        return
    try:
        gen.throw(_Evicted(f"workflow {workflow_id!r} left this worker; it resumes by replay"))
    except (GeneratorExit, StopIteration):
        return
    except (Exception, Cancelled):
        _log.warning(
            "workflow %r raised while closing (in a finally: block); ignored",
            workflow_id,
            exc_info=True,
            extra={"workflow_id": workflow_id},
        )
        return
    # It yielded again while being closed: a `yield` in `finally:` or after
    # `except GeneratorExit`. Python calls that "generator ignored GeneratorExit".
    for _ in range(_CLOSE_ATTEMPTS):
        _log.warning(
            "workflow %r yielded while being closed (a `yield` inside `finally:` or "
            "after catching GeneratorExit): generator ignored GeneratorExit; the step it "
            "yielded is not run. Move durable cleanup out of `finally:` into a step",
            workflow_id,
            extra={"workflow_id": workflow_id},
        )
        try:
            gen.close()
            return
        except RuntimeError:
            if inspect.getgeneratorstate(gen) == inspect.GEN_CLOSED:
                return
        except Exception:
            return
    _log.error(
        "workflow %r keeps yielding while being closed; giving up on its cleanup",
        workflow_id,
        extra={"workflow_id": workflow_id},
    )
