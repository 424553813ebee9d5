"""`Context`: the only object workflow code talks to.

Every method returns a command (see `troth._commands`) and does no I/O: the
workflow yields the command and the replay engine decides what happens,
recording each step as a durable promise. So the methods are cheap, pure and
safe to call on every replay::

    @worker.workflow
    def publish(ctx: Context, post_id: str) -> Generator[Any, Any, dict[str, Any]]:
        approval = yield ctx.promise(timeout=timedelta(days=3))
        yield ctx.run(send_email, approval.id)
        decision = yield approval
        return {"post": post_id, "decision": decision}

`ctx.log` is a logger that is silent while the workflow replays what an earlier
execution already ran (`ctx.is_replaying`), so each line appears once per run, not
once per replay.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from troth import _arguments as check
from troth._commands import (
    AwaitAll,
    AwaitAny,
    AwaitAtLeast,
    CreatePromise,
    Now,
    PromiseHandle,
    Random,
    ReadState,
    RetryPolicy,
    RunStep,
    Sleep,
    StartWorkflow,
    WriteState,
)
from troth._schema import decision_schema

if TYPE_CHECKING:
    from troth._approvers import Approvers

__all__ = ["Context", "PromiseHandle", "RetryPolicy"]

_RESERVED_TAG_PREFIX = "troth:"


class _ReplayAwareLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger adapter that drops every record while its workflow replays."""

    def __init__(self, logger: logging.Logger, workflow_id: str, replaying: Callable[[], bool]):
        super().__init__(logger, {"workflow_id": workflow_id})
        self._replaying = replaying

    def isEnabledFor(self, level: int) -> bool:
        return not self._replaying() and self.logger.isEnabledFor(level)

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs


def _never_replaying() -> bool:
    return False


class Context:
    """What a workflow receives as its first argument. Every method returns a command to yield.

    Attributes:
        id: The workflow's id: its root promise's id, and the prefix of its step ids.
        log: A `logging.LoggerAdapter` (logger `troth.workflow`, extra
            `workflow_id`) that is silent while the workflow replays
            (`is_replaying`): a line logged before a suspension is not logged
            again by the worker that resumes the workflow.

    .. versionadded:: 0.1.0
    """

    __slots__ = ("_replaying", "id", "log")

    def __init__(self, id: str, *, replaying: Callable[[], bool] = _never_replaying) -> None:
        self.id = id
        self._replaying = replaying
        self.log: logging.LoggerAdapter[logging.Logger] = _ReplayAwareLogger(
            logging.getLogger("troth.workflow"), id, replaying
        )

    @property
    def is_replaying(self) -> bool:
        """True while the workflow re-runs what an earlier execution already ran: the
        steps it recorded, and on to the wait where it suspended (and while a suspended
        workflow is closed, its `finally:` blocks running). `ctx.log` is silent then;
        use it to keep any other output of workflow code (a print, a metric) to once
        per run, as Temporal's `workflow.unsafe.is_replaying()` is used.

        Best effort on one side only: where the worker cannot tell (an expiry seen
        just before the suspension), it says False, so output may repeat, never be lost.

        .. versionchanged:: 0.2.0 True up to the wait where the execution before
           suspended, not only until its last recorded step.
        """
        return self._replaying()

    def promise(
        self,
        *,
        id: str | None = None,
        timeout: timedelta | None = None,
        tags: Mapping[str, str] | None = None,
        schema: Mapping[str, Any] | type | None = None,
        title: str = "",
        message: str = "",
        check_args: bool = True,
        approvers: Approvers | None = None,
    ) -> CreatePromise:
        """A latent promise: `yield` it for a `PromiseHandle`; yield the handle to wait.

        The wait ends when someone settles the promise by id: a resolve gives
        the `yield` its value, a reject raises `Rejected` (with the decoded
        reason as `.value`), a timeout raises `TimedOut`.

        Args:
            id: Its id; default `<workflow id>.<n>`. Choose one (e.g.
                f"approval-{post_id}") when a gateway must settle it by a
                name it knows, even before the workflow gets here (see
                `Client.resolve(..., create_if_missing=True)`). A chosen id
                never ends in `.<number>`, the form kept for numbered steps
                (`ValueError`).
            timeout: After this long it is rejected as timed out (the wait raises
                `TimedOut`); default the server's (`--default-ttl`, 1 day). Capped
                by the workflow's own expiry (its `ttl`, default 30 days): the
                worker logs a warning naming both when it is.
            tags: Extra string tags; keys starting with `troth:` are reserved.
            schema: What a decision must look like: a JSON Schema dict, a
                dataclass or a pydantic model class. The server refuses a
                resolve value that does not match (INVALID_ARGUMENT naming the
                field), and with a class the `yield` returns an instance of it.
            title: A short line for the human who decides (shown by `troth
                approvals list` and `GetPromise`).
            message: The longer text for that human.
            check_args: Record a digest of everything the human sees or the
                workflow may branch on (`id`, `timeout`, `schema`, `title`,
                `message`, `tags`, `approvers`) on the step and, on replay, fail
                with `NonDeterminismError` if the code now asks something else at
                this position (a router that switched branch while it waited).
                Pass False where they legitimately vary between runs (e.g. a
                timeout computed from the clock). Steps recorded before the
                digest covered title, message, tags and approvers are checked on
                `id`, `timeout` and `schema` only.
            approvers: Who may resolve or reject it (`troth.Approvers`): the
                server refuses anyone else (`PermissionDeniedError`, reason
                `NOT_AN_APPROVER`). A settle token (`handle.settle_token()`)
                acts for a principal and is checked against them as that
                principal's settle.
        """
        call = "ctx.promise"
        check.step_name(call, id)
        timeout = check.duration(call, timeout, "timeout")
        user_tags = check.tags(call, tags)
        check.texts(call, title=title, message=message)
        check.flag(call, check_args, "check_args")
        check.approvers(call, approvers)
        reserved = sorted(k for k in user_tags if k.startswith(_RESERVED_TAG_PREFIX))
        if reserved:
            raise ValueError(f"tags {reserved} use the reserved prefix 'troth:'; rename them")
        if timeout is not None and timeout <= timedelta(0):
            raise ValueError(f"timeout must be positive, not {timeout}")
        return CreatePromise(
            id=id,
            timeout=timeout,
            tags=user_tags,
            schema=None if schema is None else decision_schema(schema),
            title=title,
            message=message,
            check_args=check_args,
            approvers=approvers,
        )

    def run(
        self,
        fn: Callable[..., Any],
        *args: Any,
        retry: RetryPolicy | None = None,
        id: str | None = None,
        check_args: bool = True,
    ) -> RunStep:
        """Run `fn(*args)` as a checkpointed step: `yield` it for the result.

        The function runs at least once and its result is recorded exactly
        once; a replay returns the recorded result (or raises the recorded
        failure as `PromiseRejectedError`) without calling `fn`.

        Args:
            fn: Any callable; its `__qualname__` is recorded to detect changed code.
            args: Passed to `fn` as they are (they are not encoded).
            retry: How failures are retried; default `RetryPolicy()`: no
                maximum (3 attempts in a task, then the task fails and is
                retried after a backoff, the step unrecorded: a bug waits for
                its fix). Give `max_attempts` or `non_retryable` for failures
                the workflow should see as `PromiseRejectedError`.
            id: The step's id; default `<workflow id>.<n>` (a chosen one never
                ends in `.<number>`: `ValueError`).
            check_args: Record a digest of `args` (and of a `functools.partial`'s
                bound arguments) on the step and, on replay, fail with
                `NonDeterminismError` if the code now passes others at this
                position, instead of returning the result recorded for the
                old ones. Pass False where the arguments legitimately vary
                between runs (e.g. a timestamp in an email body). Arguments
                with no canonical JSON encoding (objects of unknown classes)
                are not checked; see `troth._digests`.
        """
        if not callable(fn):
            raise TypeError(
                f"ctx.run: fn must be a function (ctx.run(fn, *args)), not {type(fn).__name__}"
            )
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise TypeError(
                f"ctx.run: retry must be a troth.RetryPolicy, not {type(retry).__name__}"
            )
        check.step_name("ctx.run", id)
        check.flag("ctx.run", check_args, "check_args")
        return RunStep(fn=fn, args=args, retry=retry or RetryPolicy(), id=id, check_args=check_args)

    def sleep(
        self, duration: timedelta | float, *, id: str | None = None, check_args: bool = True
    ) -> Sleep:
        """A durable timer: `yield` it to wait `duration` (a timedelta or seconds).

        With `check_args` (the default) the duration is recorded as a digest and
        a replay that asks for another one fails with `NonDeterminismError`;
        pass False for a duration computed from the clock (`deadline - now`).
        """
        delta = check.duration("ctx.sleep", duration, "duration", in_seconds=True)
        if delta is None:
            raise TypeError("ctx.sleep: duration must be a datetime.timedelta or seconds, not None")
        check.step_name("ctx.sleep", id)
        if delta < timedelta(0):
            raise ValueError(f"duration must not be negative, not {delta}")
        return Sleep(duration=delta, id=id, check_args=check_args)

    def start(
        self,
        workflow: str | Callable[..., Any],
        *args: Any,
        id: str | None = None,
        group: str | None = None,
        check_args: bool = True,
        ttl: timedelta | None = None,
    ) -> StartWorkflow:
        """Start a child workflow: `yield` it for a `PromiseHandle`; yield that for the result.

        Args:
            workflow: The registered name, or the workflow function itself.
            args: Its arguments; they must be encodable with the codec.
            id: The child's id; default `<workflow id>.<n>` (its steps nest below it).
            group: The group whose workers run it; default this workflow's group.
            check_args: Record a digest of the name, `args`, `id` and `ttl` on
                the step and, on replay, fail with `NonDeterminismError` if the
                code now starts the child with others at this position. Pass
                False where they legitimately vary between runs.
            ttl: How long the child may take in all (it times out after);
                default the server's workflow lifetime (`--default-workflow-ttl`,
                30 days). Capped by this workflow's own expiry: the worker logs
                a warning naming both when it is.

        .. versionchanged:: 0.2.0 `ttl`.
        """
        check.step_name("ctx.start", id)
        check.optional_text("ctx.start", group, "group")
        return StartWorkflow(
            name=check.workflow_name(workflow),
            args=args,
            id=id,
            group=group,
            check_args=check_args,
            ttl=_child_ttl("ctx.start", ttl),
        )

    def rpc(
        self,
        workflow: str | Callable[..., Any],
        *args: Any,
        id: str | None = None,
        group: str | None = None,
        check_args: bool = True,
        ttl: timedelta | None = None,
    ) -> StartWorkflow:
        """Start a child workflow and wait for it: `yield` it for the child's result.

        `check_args` and `ttl` as for `start`.
        """
        check.step_name("ctx.rpc", id)
        check.optional_text("ctx.rpc", group, "group")
        return StartWorkflow(
            name=check.workflow_name(workflow),
            args=args,
            id=id,
            group=group,
            wait=True,
            check_args=check_args,
            ttl=_child_ttl("ctx.rpc", ttl),
        )

    def all(self, handles: Iterable[PromiseHandle], *, decisions: bool = False) -> AwaitAll:
        """Wait for every handle: `yield` it for their values, in order (fails fast).
        With `decisions`, a `Decision` (value, settled_by, settle_time) for each."""
        return AwaitAll(handles=_handles(handles), decisions=decisions)

    def any(self, handles: Iterable[PromiseHandle], *, decisions: bool = False) -> AwaitAny:
        """Wait for the first handle to settle: `yield` it for its value (or its error).
        With `decisions`, a `Decision` (value, settled_by, settle_time)."""
        found = _handles(handles)
        if not found:
            raise ValueError("ctx.any() needs at least one handle")
        return AwaitAny(handles=found, decisions=decisions)

    def decision(self, handle: PromiseHandle) -> AwaitAny:
        """Wait for one promise like `yield handle`, but get a `Decision`: its value and
        who settled it (`settled_by`, `settle_time`), as recorded, so replays agree.
        A rejection or timeout raises, as `yield handle` does.

        .. versionadded:: 0.2.0
        """
        return AwaitAny(handles=_handles((handle,)), decisions=True)

    def at_least(
        self,
        count: int,
        handles: Iterable[PromiseHandle],
        *,
        distinct: bool = False,
        decisions: bool = False,
    ) -> AwaitAtLeast:
        """Wait until `count` of the handles are resolved: `yield` it for their values,
        in settle order. Raises the deciding rejection once `count` is out of reach.

        With `distinct`, a resolve counts only if no resolve counted before it was
        settled by the same principal (`settled_by`): one person cannot fill a
        quorum. Give the promises `Approvers(distinct=True)` too, and the server
        refuses the second settle outright. With `decisions`, the yield gives a
        `Decision` (value, settled_by, settle_time) for each counted resolve."""
        found = _handles(handles)
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError(f"ctx.at_least() takes a whole number, not {count!r}")
        if not 1 <= count <= len(found):
            raise ValueError(
                f"ctx.at_least({count}, ...) needs between 1 and {len(found)} "
                f"(the number of handles given)"
            )
        return AwaitAtLeast(count=count, handles=found, distinct=distinct, decisions=decisions)

    def now(self) -> Now:
        """The current time, recorded: `yield` it for an aware UTC datetime that replays."""
        return Now()

    def random(self) -> Random:
        """A random float in [0, 1), recorded: `yield` it for a number that replays."""
        return Random()

    def state(self, name: str, default: Any = None) -> ReadState:
        """Read the workflow's state slot `name`, recorded: `yield` it for the value
        (`default` for a slot never written). The server reads the slot in the step's
        own transaction, so a replay returns what this run saw, and a read after an
        operator's rewrite (`Client.replace_state`, made while the run was parked)
        sees the rewrite. Read it again after each wait to see what was rewritten.

        .. versionadded:: 0.3.0
        """
        return ReadState(_state_name("ctx.state", name), default)

    def set_state(self, name: str, value: Any) -> WriteState:
        """Write the workflow's state slot `name`, recorded: `yield` it for the slot's
        new version. Written once, in the step's own transaction, by the worker
        holding the run's task (never again on replay).

        .. versionadded:: 0.3.0
        """
        return WriteState(_state_name("ctx.set_state", name), value)

    def __repr__(self) -> str:
        return f"Context(id={self.id!r})"


def _child_ttl(call: str, ttl: object) -> timedelta | None:
    delta = check.duration(call, ttl, "ttl")
    if delta is not None and delta <= timedelta(0):
        raise ValueError(f"{call}: ttl must be positive, not {delta}")
    return delta


def _handles(handles: Iterable[PromiseHandle]) -> tuple[PromiseHandle, ...]:
    found = tuple(handles)
    for handle in found:
        if not isinstance(handle, PromiseHandle):
            raise TypeError(
                f"expected PromiseHandle values (what `yield ctx.promise()` and "
                f"`yield ctx.start(...)` return), got {type(handle).__name__}"
            )
    return found


_STATE_NAME = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")


def _state_name(call: str, name: object) -> str:
    if not isinstance(name, str) or not _STATE_NAME.fullmatch(name):
        raise ValueError(
            f"{call}: name must be 1 to 128 characters of letters, digits, `_`, `-`, `.` "
            f"and `:`, not {name!r}"
        )
    return name
