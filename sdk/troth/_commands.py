"""The commands workflow code yields, and the handles it gets back.

A command is a frozen description of one thing a workflow wants: `Context`
builds them, `troth._engine.Engine` interprets them, and nothing here does I/O.

Commands that create a step promise (and so take the next position n, and the
id `<root>.<n>` unless an explicit id is given):

| command         | made by                 | the `yield` returns                        |
|-----------------|-------------------------|--------------------------------------------|
| `CreatePromise` | `ctx.promise()`         | a `PromiseHandle` at once (latent promise) |
| `RunStep`       | `ctx.run(fn, *args)`    | `fn`'s result, run once and checkpointed   |
| `Sleep`         | `ctx.sleep(duration)`   | None, once the timer promise resolves      |
| `StartWorkflow` | `ctx.start()` / `rpc()` | a `PromiseHandle` / the child's result     |
| `Now`           | `ctx.now()`             | the recorded time (an aware UTC datetime)  |
| `Random`        | `ctx.random()`          | the recorded float in [0, 1)               |
| `ReadState`     | `ctx.state(name)`       | the slot's value as the run read it        |
| `WriteState`    | `ctx.set_state(name, v)`| the slot's new version (an int)            |

Commands that only wait, so they create no promise and shift no id: a
`PromiseHandle` itself (yield it to await it), `AwaitAll`, `AwaitAny` and
`AwaitAtLeast`.
"""

from __future__ import annotations

import enum
import functools
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from troth._tags import TAG_ARGS, TAG_FUNC, TAG_GROUP, TAG_INVOKE, TAG_KIND, TAG_TIMER

if TYPE_CHECKING:
    from troth._approvers import Approvers
    from troth._schema import DecisionSchema

__all__ = [
    "TAG_ARGS",
    "TAG_FUNC",
    "TAG_GROUP",
    "TAG_INVOKE",
    "TAG_KIND",
    "TAG_TIMER",
    "AwaitAll",
    "AwaitAny",
    "AwaitAtLeast",
    "Command",
    "CreatePromise",
    "Kind",
    "Now",
    "PromiseHandle",
    "Random",
    "ReadState",
    "RetryPolicy",
    "RunStep",
    "SettleToken",
    "Sleep",
    "StartWorkflow",
    "StepCommand",
    "WriteState",
    "func_name",
]

T_co = TypeVar("T_co", covariant=True)


class Kind(enum.StrEnum):
    """The `troth:kind` tag of a step promise: which command created it."""

    PROMISE = "promise"
    RUN = "run"
    SLEEP = "sleep"
    START = "start"
    NOW = "now"
    RANDOM = "random"
    SETTLE_TOKEN = "settle_token"
    STATE = "state"
    STATE_SET = "state_set"


def func_name(fn: Callable[..., Any]) -> str:
    """The name recorded in `troth:func` for a function run as a step.

    The qualified name (`Class.method`), without the enclosing function of a
    nested one (so moving a helper in or out of a function is no change), and
    the wrapped function of a `functools.partial`.
    """
    while isinstance(fn, functools.partial):
        fn = fn.func
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if not name:
        return type(fn).__qualname__
    return str(name).rsplit("<locals>.", 1)[-1]


class Command(Generic[T_co]):
    """Base of everything a workflow may yield. `T_co` is what the yield returns.

    Python cannot type `x = yield cmd` per yield (a generator's send type is
    fixed), so workflows are typed `Generator[Any, Any, R]`; the parameter
    documents intent and helps readers.
    """

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a `ctx.run` step retries its function.

    Attempt n (1-based) that fails waits `min(max_backoff, initial_backoff *
    multiplier ** (n - 1))` seconds before attempt n + 1.

    By default there is no maximum (as Temporal's default activity retry policy):
    a step keeps failing only on a bug or an outage, and either is fixed by
    something other than the workflow, so the run waits instead of failing.
    After `ATTEMPTS_PER_TASK` (3) attempts in one task, the worker fails the
    task (`FailTask`, the step's exception and traceback, shown by `troth tasks
    list`) and records nothing for the step: the server retries the task after
    its backoff (1 s doubling to 5 min), the root stays PENDING with its
    approvals, and the step runs again on the next attempt, on fixed code once
    deployed.

    The step is rejected (the workflow sees `PromiseRejectedError` at its
    `yield`, where it can compensate, else the run fails) only by the user's
    choice: after an explicit `max_attempts` failures, or at once for an
    exception that is an instance of one of `non_retryable`.

    Attributes:
        max_attempts: Attempts in all, at least 1 (1 means no retry); None (the
            default) for no maximum.
        initial_backoff: Seconds to wait after the first failure.
        max_backoff: Upper bound of any one wait, in seconds.
        multiplier: Growth of the wait per attempt, at least 1.
        non_retryable: Exception types that are never retried.

    .. versionadded:: 0.1.0
    .. versionchanged:: 0.2.0 `max_attempts` defaults to None (no maximum), not 3.
    """

    max_attempts: int | None = None
    initial_backoff: float = 1.0
    max_backoff: float = 60.0
    multiplier: float = 2.0
    non_retryable: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        if self.max_attempts is not None and (
            isinstance(self.max_attempts, bool) or self.max_attempts < 1
        ):
            raise ValueError(
                f"max_attempts must be at least 1, or None for no maximum, not {self.max_attempts}"
            )
        if self.initial_backoff < 0 or self.max_backoff < 0:
            raise ValueError("initial_backoff and max_backoff must not be negative")
        if self.multiplier < 1:
            raise ValueError(f"multiplier must be at least 1, not {self.multiplier}")
        object.__setattr__(self, "non_retryable", tuple(self.non_retryable))

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        if attempt < 1:
            raise ValueError(f"attempt is 1-based, not {attempt}")
        if self.initial_backoff == 0:
            return 0.0
        try:
            grown = self.initial_backoff * self.multiplier ** (attempt - 1)
        except OverflowError:  # a retry with no maximum gets there: the cap holds
            return self.max_backoff
        return min(self.max_backoff, grown)

    def retryable(self, error: BaseException) -> bool:
        """Whether `error` may be retried at all (an `Exception` not declared non-retryable)."""
        return isinstance(error, Exception) and not isinstance(error, self.non_retryable)

    def should_retry(self, error: BaseException, attempt: int) -> bool:
        """Whether failed attempt number `attempt` (1-based) that raised `error` is retried."""
        if not self.retryable(error):
            return False
        return self.max_attempts is None or attempt < self.max_attempts


@dataclass(frozen=True, slots=True)
class PromiseHandle(Command[Any]):
    """A promise the workflow created (`ctx.promise()`) or started (`ctx.start()`).

    Yield the handle to wait for the promise: the `yield` returns its value,
    or raises `PromiseRejectedError`, `PromiseTimedOutError` or `Cancelled`.
    Waiting creates no promise and shifts no step id.

    Attributes:
        id: The promise's id: settle a latent promise with `client.resolve(id, ...)`.

    .. versionadded:: 0.1.0
    """

    id: str

    def settle_token(
        self,
        *,
        outcomes: Iterable[str] = (),
        ttl: timedelta | None = None,
        acts_for: str | None = None,
    ) -> SettleToken:
        """A settle token for this promise, minted once and recorded as a step: `yield`
        it for the token (a str to put in a link), the same on every replay.

        The settle made with it is that of the principal it acts for, checked
        against the promise's approvers (see `Client.mint_settle_token`); a refusal
        (`NOT_AN_APPROVER`, `ROLE_NOT_ALLOWED`) is raised at the `yield`.

        Args:
            outcomes: "resolve" and/or "reject"; default both.
            ttl: How long the link works; default until the promise expires.
            acts_for: The approver the link is for (a principal the promise's
                `Approvers` names); the worker's principal then needs the gateway
                role. Default: the worker's principal itself.
        """
        if acts_for is not None and not isinstance(acts_for, str):
            raise TypeError(f"acts_for must be a principal's name (str), not {acts_for!r}")
        return SettleToken(self.id, tuple(sorted(set(outcomes))), ttl, acts_for=acts_for)


@dataclass(frozen=True, slots=True)
class SettleToken(Command[str]):
    """Mint a settle token for `promise_id` (`PromiseHandle.settle_token`): the worker
    asks the server once and records the token on a step, so replays get the same one."""

    promise_id: str
    outcomes: tuple[str, ...] = ()
    ttl: timedelta | None = None
    id: str | None = None
    check_args: bool = True
    """Record a digest of the promise id, outcomes, ttl and acts_for, and check it on replay."""
    acts_for: str | None = None
    """The principal the token acts for; None for the worker's own."""


@dataclass(frozen=True, slots=True)
class CreatePromise(Command[PromiseHandle]):
    """Create a latent promise: pending until someone settles it by id, or it times out."""

    id: str | None = None
    timeout: timedelta | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    schema: DecisionSchema | None = None
    """What a resolve value must look like, and the type the `yield` returns."""
    title: str = ""
    message: str = ""
    check_args: bool = True
    """Record a digest of id, timeout, schema, title, message, tags and approvers, and
    check it on replay (`troth._digests`)."""
    approvers: Approvers | None = None
    """Who may settle it, enforced by the server (`troth.Approvers`)."""


@dataclass(frozen=True, slots=True)
class RunStep(Command[Any]):
    """Run `fn(*args)` once, checkpointed: its result is recorded on the step promise."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    id: str | None = None
    check_args: bool = True
    """Record a digest of the function's arguments, and check it on replay."""

    @property
    def name(self) -> str:
        """The function's name, as recorded in the step's `troth:func` tag."""
        return func_name(self.fn)


@dataclass(frozen=True, slots=True)
class Sleep(Command[None]):
    """Wait `duration` on a durable timer promise (tagged `troth:timer=true`)."""

    duration: timedelta
    id: str | None = None
    check_args: bool = True
    """Record a digest of the duration, and check it on replay."""


@dataclass(frozen=True, slots=True)
class StartWorkflow(Command[Any]):
    """Start a child workflow; with `wait`, also wait for its result (`ctx.rpc`).

    Attributes:
        name: The registered workflow name.
        args: Its arguments, encoded with the codec into the child's param.
        id: The child's root promise id; default `<parent root>.<n>`.
        group: The group that runs it; default the parent's group.
        wait: True for `ctx.rpc` (the yield returns the result), False for
            `ctx.start` (the yield returns a `PromiseHandle`).
        check_args: Record a digest of name, arguments, id and ttl, and check it on replay.
        ttl: The child's lifetime; None for the server's default workflow
            lifetime. Capped by the parent's (the worker warns when it is).
    """

    name: str
    args: tuple[Any, ...] = ()
    id: str | None = None
    group: str | None = None
    wait: bool = False
    check_args: bool = True
    ttl: timedelta | None = None


@dataclass(frozen=True, slots=True)
class Now(Command[datetime]):
    """Read the clock once, durably: replays return the same aware UTC datetime."""

    id: str | None = None

    @staticmethod
    def draw() -> str:
        """The value the worker resolves a new `now` step with: the UTC time, ISO 8601."""
        return datetime.now(UTC).isoformat()


@dataclass(frozen=True, slots=True)
class Random(Command[float]):
    """Draw a random float in [0, 1) once, durably: replays return the same number."""

    id: str | None = None

    @staticmethod
    def draw() -> float:
        """The value the worker resolves a new `random` step with."""
        return random.random()  # not for cryptography, nor needs to be


@dataclass(frozen=True, slots=True)
class ReadState(Command[Any]):
    """Read the workflow's state slot `name`, recorded: the server reads it in the
    step's own transaction, so a replay returns what the run saw; `default` for a
    slot never written."""

    name: str
    default: Any = None
    id: str | None = None


@dataclass(frozen=True, slots=True)
class WriteState(Command[int]):
    """Write the workflow's state slot `name`, recorded: the server writes it in the
    step's own transaction (once, however often the step is replayed); the yield
    returns the slot's new version."""

    name: str
    value: Any
    id: str | None = None


@dataclass(frozen=True, slots=True)
class AwaitAll(Command[list[Any]]):
    """Wait for every handle; the yield returns their values in handle order.

    Fails fast: once one is rejected, the yield raises that rejection (the
    earliest by settle time if several are), without waiting for the rest.
    """

    handles: tuple[PromiseHandle, ...]
    decisions: bool = False
    """Give a `Decision` (value, settled_by, settle_time) for each, not the bare value."""


@dataclass(frozen=True, slots=True)
class AwaitAny(Command[Any]):
    """Wait for the first handle to settle; the yield returns its value or raises its error.

    "First" is by the server's settle time (ties: handle order), so a replay
    that sees more of them settled picks the same one as the first execution.
    """

    handles: tuple[PromiseHandle, ...]
    decisions: bool = False
    """Give a `Decision` (value, settled_by, settle_time), not the bare value."""


@dataclass(frozen=True, slots=True)
class AwaitAtLeast(Command[list[Any]]):
    """Wait until `count` of the handles are resolved (a quorum: "2 of 3 approvers");
    the yield returns those values, in the order they were settled.

    Settles are taken in the server's settle order (ties: handle order). Once
    so many are rejected that `count` can no longer be reached, the yield raises
    the rejection that made it so. A replay that sees more of them settled
    decides the same way.
    """

    count: int
    handles: tuple[PromiseHandle, ...]
    distinct: bool = False
    """Count a resolve only if no other counted one was settled by the same principal."""
    decisions: bool = False
    """Give a `Decision` (value, settled_by, settle_time) for each, not the bare value."""


StepCommand = (
    CreatePromise
    | RunStep
    | Sleep
    | StartWorkflow
    | Now
    | Random
    | SettleToken
    | ReadState
    | WriteState
)
"""The commands that create a step promise, and so take a position."""
