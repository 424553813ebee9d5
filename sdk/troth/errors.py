"""The one error hierarchy of the troth SDK, and the reasons servers send.

```
TrothError(Exception)
├── RpcError                     code, reason, message, metadata; raised by Client calls
│   ├── NotFoundError
│   ├── AlreadyExistsError
│   ├── FailedPreconditionError
│   │   ├── AlreadySettledError  reason ALREADY_SETTLED; .promise_id, .state
│   │   ├── PromiseTimedOutError reason TIMED_OUT; .promise_id
│   │   └── LeaseLostError       reason STALE_COUNTER
│   ├── InvalidArgumentError     .field
│   ├── UnauthenticatedError
│   ├── PermissionDeniedError
│   ├── ResourceExhaustedError
│   │   └── OverloadedError      reason OVERLOADED; .retry_after: retried by the SDK
│   ├── UnavailableError         retryable
│   └── DeadlineExceededError    also a builtin TimeoutError
├── WorkflowError                raised into (or out of) workflow code by the replay engine
│   ├── NonDeterminismError      .position, .recorded, .yielded: replay met a changed workflow
│   ├── PromiseRejectedError     .promise_id, .value: what `yield` on a rejected step raises
│   └── WorkflowFailed           .message, .details: raised by workflow code to fail its run
├── RegistrationError            .name: a workflow could not be registered on a Worker
└── ConfigurationError

Cancelled(BaseException)         .promise_id: the step (or the workflow) was cancelled
```

`Cancelled` is a `BaseException`, outside this tree, for the reason Python's
`asyncio.CancelledError` is: a `try: ... except Exception:` around a wait in workflow
code must not swallow a cancel (and let the next step run as if nothing happened).
`except Cancelled:` catches it, as before; `except Exception`, `except TrothError` and
`except WorkflowError` no longer do (changed in 0.2.0).

A step that timed out raises `PromiseTimedOutError` into the workflow, the
same class a late settle gets from the server, so one `except` covers both.

`Reason` is the single source of the stable `ErrorInfo.reason` strings: the
server imports it too. Every `RpcError` keeps the gRPC status code, the
`ErrorInfo` reason and metadata, and the server's message, which already says
what to do; `str(error)` adds a short summary of what went wrong. gRPC errors
become these classes in one place: `troth._transport.map_rpc_errors`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import grpc

ERROR_DOMAIN = "troth.dev"
"""The `ErrorInfo.domain` of every error a troth server sends."""


class Reason(enum.StrEnum):
    """Stable machine-readable reasons carried in `google.rpc.ErrorInfo.reason`."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    WORKFLOW_ALREADY_EXISTS = "WORKFLOW_ALREADY_EXISTS"
    """A start of a workflow id that exists as another workflow, group or arguments
    (ALREADY_EXISTS); metadata `workflow` names the existing one and `differences`
    what differs (`workflow`, `group`, `arguments`)."""
    ALREADY_SETTLED = "ALREADY_SETTLED"
    TIMED_OUT = "TIMED_OUT"
    STALE_COUNTER = "STALE_COUNTER"
    TASK_NOT_PENDING = "TASK_NOT_PENDING"
    WORKFLOW_SETTLED = "WORKFLOW_SETTLED"
    """A new pending step under a root that is settled (cancelled, finished)."""
    STEP_RECORDED = "STEP_RECORDED"
    """A step result carried in a `CompleteTask` (`record_step`) for a step recorded
    already with another result, by an earlier holder of the task (FAILED_PRECONDITION):
    nothing was done; the worker replays the workflow from the record."""
    NOT_A_WORKFLOW = "NOT_A_WORKFLOW"
    """A workflow operation (`troth workflows fail`) on a promise that is no workflow's root."""
    WORKFLOW_NOT_PAUSED = "WORKFLOW_NOT_PAUSED"
    """A retry-now (`troth workflows retry-now`) of a workflow whose task is not waiting out
    a retry backoff after its code failed (FAILED_PRECONDITION): metadata `state` says
    what it is doing instead."""
    WORKFLOW_NOT_PARKED = "WORKFLOW_NOT_PARKED"
    """A read of a workflow's state for a rewrite (`Client.replace_state`) while the run
    is not parked: a worker holds its task, or it is over (FAILED_PRECONDITION)."""
    RESERVED_FOR_WORKFLOW = "RESERVED_FOR_WORKFLOW"
    """A step write under a workflow without the fence of the task holding it."""
    INVALID_PAGE_TOKEN = "INVALID_PAGE_TOKEN"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    CREDENTIALS_MISSING = "CREDENTIALS_MISSING"
    """No `authorization: Bearer ...` metadata on a call to a server with authentication on."""
    CREDENTIALS_MALFORMED = "CREDENTIALS_MALFORMED"
    """`authorization` metadata that is not `Bearer <token>` with a troth token or a JWT."""
    TOKEN_UNKNOWN = "TOKEN_UNKNOWN"
    """A token the server does not know: no such key id (revoked?), or no JWT keys."""
    TOKEN_INVALID = "TOKEN_INVALID"
    """A token that fails verification: wrong secret, bad signature, algorithm,
    issuer, audience or claims."""
    TOKEN_EXPIRED = "TOKEN_EXPIRED"
    """A JWT past its `exp` (beyond the server's small leeway)."""
    ROLE_NOT_ALLOWED = "ROLE_NOT_ALLOWED"
    """The caller's roles may not call this RPC (the RPC x role table), or may not do
    what it asks: `MintSettleToken` with `acts_for` another principal needs the
    `gateway` role itself (`admin` does not imply it)."""
    GROUP_NOT_ALLOWED = "GROUP_NOT_ALLOWED"
    """A worker asked for a task group its grant does not name."""
    NOT_THE_TASKS_WORKER = "NOT_THE_TASKS_WORKER"
    """A task call (heartbeat, complete, release, callbacks) or a fenced step write
    from a principal the task was not leased to: the right counter is not enough."""
    OUTSIDE_PREFIXES = "OUTSIDE_PREFIXES"
    """A principal scoped to id prefixes named a promise outside them (or polled:
    a scoped principal works for no task group), or its prefixes changed while its
    watch was open."""
    GRANT_CHANGED = "GRANT_CHANGED"
    """The principal's roles or task groups changed (a token file reloaded) while its
    watch was open: what it may read was decided when it opened; open it again."""
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    OVERLOADED = "OVERLOADED"
    """The server refused the call for now: too many concurrent calls, streams or
    queued writes. The status carries a `google.rpc.RetryInfo` delay; retry after it."""
    STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    INTERNAL = "INTERNAL"
    NOT_AN_APPROVER = "NOT_AN_APPROVER"
    """A resolve or reject by a principal the promise's approver policy does not
    allow; metadata `rule` names the rule (approvers, not_requester, distinct)."""
    SETTLE_TOKEN_MALFORMED = "SETTLE_TOKEN_MALFORMED"
    """A `settle_token` that is not a token at all (cut short, or not one of ours)."""
    SETTLE_TOKEN_OUTDATED = "SETTLE_TOKEN_OUTDATED"
    """A settle token of an older format (`st1`), minted by an older server: it acted
    for no principal, so it no longer settles anything; ask for a new link."""
    SETTLE_TOKEN_UNKNOWN_KEY = "SETTLE_TOKEN_UNKNOWN_KEY"
    """A settle token signed with a key this server does not have (retired, or forged)."""
    SETTLE_TOKEN_BAD_SIGNATURE = "SETTLE_TOKEN_BAD_SIGNATURE"
    """A settle token whose signature does not match: forged, or altered (its promise,
    outcomes, expiry or principal)."""
    SETTLE_TOKEN_EXPIRED = "SETTLE_TOKEN_EXPIRED"
    SETTLE_TOKEN_WRONG_PROMISE = "SETTLE_TOKEN_WRONG_PROMISE"
    """A valid settle token, for another promise than the one settled."""
    SETTLE_TOKEN_PROMISE_REPLACED = "SETTLE_TOKEN_PROMISE_REPLACED"
    """A valid settle token for an earlier promise of this id, pruned since: the
    promise of that id now is another one (created again)."""
    SETTLE_TOKEN_OUTCOME_NOT_ALLOWED = "SETTLE_TOKEN_OUTCOME_NOT_ALLOWED"
    """A valid settle token that does not allow this outcome (e.g. reject-only)."""
    SETTLE_TOKEN_USED = "SETTLE_TOKEN_USED"
    """The promise was already settled with this very token: a token works once."""
    SETTLE_TOKEN_VOID = "SETTLE_TOKEN_VOID"
    """The token's promise was cancelled (its workflow cancelled or ended): its links
    are void."""
    SETTLE_TOKENS_OFF = "SETTLE_TOKENS_OFF"
    """MintSettleToken on a server started without `--settle-token-keys`."""


class TrothError(Exception):
    """Base class of every error the troth SDK raises on purpose."""


class RpcError(TrothError):
    """A troth server (or the gRPC channel to it) refused or failed a call.

    Attributes:
        code: The gRPC status code.
        reason: The `ErrorInfo.reason` the server sent (a `Reason` value), or
            "" when the error carried none (e.g. the server was unreachable).
        message: The server's message: what was wrong and what to do.
        metadata: The `ErrorInfo.metadata` the server sent (e.g. `field`).

    .. versionadded:: 0.1.0
    """

    retryable: ClassVar[bool] = False
    """Whether repeating the same call later may succeed."""

    _summary: ClassVar[str] = ""

    def __init__(
        self,
        code: grpc.StatusCode,
        reason: str,
        message: str,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.metadata: dict[str, str] = dict(metadata or {})
        self.attempts = 1
        """How many times the SDK made the call before giving up with this error."""
        self.retried_for = 0.0
        """Seconds from the first attempt until the SDK gave up."""
        self.gave_up = ""
        """Why the SDK stopped retrying, when it retried at all."""

    def retried(self, attempts: int, seconds: float, why: str) -> None:
        """Record that this is the last answer of `attempts` attempts over `seconds`."""
        self.attempts, self.retried_for, self.gave_up = attempts, seconds, why

    def _what(self) -> str:
        """A few words on what went wrong; the message says the rest."""
        return self._summary or f"the server answered {self.code.name}"

    def __str__(self) -> str:
        summary = self._what()
        message = self.message or "(the server sent no message)"
        suffix = f" [{self.reason}]" if self.reason else ""
        if self.attempts > 1:
            suffix += (
                f" (gave up after {self.attempts} attempts over {self.retried_for:.1f}s, "
                f"the last answered {self.code.name}: {self.gave_up})"
            )
        return f"{summary}: {message}{suffix}"

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception pickles as cls(*args), and args holds only the message;
        # rebuild from the four constructor fields so workers can ship errors
        # across processes intact (subclass attributes derive from metadata),
        # then restore how the SDK retried it.
        retries = {"attempts": self.attempts, "retried_for": self.retried_for,
                   "gave_up": self.gave_up}  # fmt: skip
        return (type(self), (self.code, self.reason, self.message, self.metadata), retries)


class NotFoundError(RpcError):
    """The promise (or task) does not exist."""

    _summary = "not found"


class AlreadyExistsError(RpcError):
    """A create named an existing id but was not a repeat of the original create."""

    _summary = "already exists"


class FailedPreconditionError(RpcError):
    """The call was valid but the state on the server does not allow it."""

    _summary = "refused in the current state"


class AlreadySettledError(FailedPreconditionError):
    """A settle lost: the promise had already been settled by someone else.

    Attributes:
        promise_id: The promise's id, when the server sent it (metadata `promise_id`).
        state: The state it was settled in, when the server sent it (metadata `state`).
    """

    _summary = "already settled"

    def __init__(
        self,
        code: grpc.StatusCode,
        reason: str,
        message: str,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(code, reason, message, metadata)
        self.promise_id: str | None = self.metadata.get("promise_id")
        self.state: str | None = self.metadata.get("state")


class PromiseTimedOutError(FailedPreconditionError):
    """A settle came after the promise's `expire_time`: it is `REJECTED_TIMEDOUT`.

    Attributes:
        promise_id: The promise's id, when the server sent it (metadata `promise_id`).
    """

    _summary = "promise timed out"

    def __init__(
        self,
        code: grpc.StatusCode,
        reason: str,
        message: str,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(code, reason, message, metadata)
        self.promise_id: str | None = self.metadata.get("promise_id")


def timed_out(promise_id: str, message: str) -> PromiseTimedOutError:
    """The `PromiseTimedOutError` a workflow gets at a yield on a promise that timed out
    (what a late settle of it gets from the server)."""
    import grpc  # here, so that the replay engine's imports stay free of gRPC

    return PromiseTimedOutError(
        grpc.StatusCode.FAILED_PRECONDITION, Reason.TIMED_OUT, message, {"promise_id": promise_id}
    )


class LeaseLostError(FailedPreconditionError):
    """A worker's call carried a stale task counter: the task moved on without it."""

    _summary = "lease lost"


class InvalidArgumentError(RpcError):
    """The request itself was wrong (bad id, negative ttl, payload over the limit...).

    Attributes:
        field: The request field at fault, when the server named it (metadata `field`).
    """

    def __init__(
        self,
        code: grpc.StatusCode,
        reason: str,
        message: str,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(code, reason, message, metadata)
        self.field: str | None = self.metadata.get("field") or None

    def _what(self) -> str:
        return f"invalid argument {self.field!r}" if self.field else "invalid argument"


class UnauthenticatedError(RpcError):
    """The call carried no valid credentials."""

    _summary = "not authenticated"


class PermissionDeniedError(RpcError):
    """The caller's principal may not do this."""

    _summary = "permission denied"


class ResourceExhaustedError(RpcError):
    """A server limit (rate, size, quota) was hit."""

    _summary = "resource exhausted"


class OverloadedError(ResourceExhaustedError):
    """The server refused the call for now, having done nothing with it: too many
    concurrent calls, streams or queued writes (reason `OVERLOADED`).

    The SDK retries such refusals by itself, after the delay the server asks for
    (with jitter and backoff), within the call's timeout; this error means it
    gave up. Retrying later is safe for any call.

    Attributes:
        limit: The server flag of the limit that was hit, e.g. `max-concurrent-rpcs`
            (metadata `limit`), when the server sent it.

    .. versionadded:: 0.2.0
    """

    retryable = True
    _summary = "server overloaded"

    def __init__(
        self,
        code: grpc.StatusCode,
        reason: str,
        message: str,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(code, reason, message, metadata)
        self.limit: str | None = self.metadata.get("limit")


class UnavailableError(RpcError):
    """The server, or its store, cannot be reached right now. Retrying may help."""

    retryable = True
    _summary = "server unavailable"


class DeadlineExceededError(RpcError, TimeoutError):
    """The call did not finish within its timeout.

    Also a builtin `TimeoutError`, so `except TimeoutError` around
    `Client.wait(..., timeout=...)` works as expected.
    """

    _summary = "timed out"


class WorkflowError(TrothError):
    """Base class of the errors the replay engine raises into or out of workflow code.

    .. versionadded:: 0.1.0
    """


class NonDeterminismError(WorkflowError):
    """Replay met a workflow that yields something other than what the history recorded.

    The step promise at `position` was created by one command (kind and
    function, from its `troth:kind` / `troth:func` tags, and the digest of its
    arguments, from `troth:args`) and the code now yields another there (or
    the same function with other arguments), or none at all. A step whose
    arguments legitimately vary opts out with `check_args=False`. Replaying on
    would mix two versions of the workflow, so the engine stops instead.

    Attributes:
        position: The step's position n (its id is `<root>.<n>` unless explicit).
        recorded: What the history recorded there, e.g. `run(send_email)`, or
            `run(send_email) with arguments digest <16 hex>` when only the
            arguments differ;
            None when the code yielded a step the history never had at a
            position the history had already passed.
        yielded: What the code yielded there; None when it finished, blocked
            or raised without reaching a step the history recorded.
        step_id: The step promise's id, or "" when unknown.
        raised: The exception the code raised before reaching that step, as
            `Type: message` ("" if it did not raise); the exception itself is
            this error's `__cause__`, and a worker reports a bug's own
            traceback for it.

    .. versionadded:: 0.1.0
    .. versionchanged:: 0.2.0 `raised`.
    """

    def __init__(
        self,
        position: int,
        recorded: str | None,
        yielded: str | None,
        step_id: str = "",
        raised: str = "",
    ) -> None:
        super().__init__(position, recorded, yielded, step_id, raised)
        self.position = position
        self.recorded = recorded
        self.yielded = yielded
        self.step_id = step_id
        self.raised = raised

    def __str__(self) -> str:
        where = f"step {self.position}" + (f" ({self.step_id!r})" if self.step_id else "")
        recorded = self.recorded or "nothing"
        if self.yielded:
            yielded = self.yielded
        elif self.raised:
            yielded = f"nothing (it raised {self.raised} before reaching it)"
        else:
            yielded = "nothing (it returned or blocked before reaching it)"
        return (
            f"workflow is not deterministic at {where}: the history recorded {recorded} "
            f"but the code yielded {yielded}; a workflow's code must not change while "
            "executions of it are in flight: deploy the change under a new workflow name, "
            "or let the old executions finish first"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            type(self),
            (self.position, self.recorded, self.yielded, self.step_id, self.raised),
        )


class PromiseRejectedError(WorkflowError):
    """A promise the workflow awaited was rejected; raised at the `yield`.

    Catch it to compensate. For a `ctx.run` step that failed after its
    retries, `value` describes the function's exception
    (`{"type": ..., "message": ...}`).

    Attributes:
        promise_id: The rejected promise's id.
        value: Its settlement value, decoded with the codec.

    .. versionadded:: 0.1.0
    """

    def __init__(self, promise_id: str, value: Any = None) -> None:
        super().__init__(promise_id, value)
        self.promise_id = promise_id
        self.value = value

    @property
    def reason(self) -> Any:
        """Why it was rejected: `value["reason"]` when the value is an object
        with a reason (what `troth approvals reject --reason` sends), else `value`."""
        value = self.value
        if isinstance(value, Mapping) and "reason" in value:
            return value["reason"]
        return value

    def __str__(self) -> str:
        value = self.value
        if isinstance(value, Mapping) and "message" in value:
            kind = value.get("type")
            detail = f"{kind}: {value['message']}" if kind else str(value["message"])
        else:
            detail = repr(value)
        return f"promise {self.promise_id!r} was rejected: {detail}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.promise_id, self.value))


Rejected = PromiseRejectedError
"""Short name for `PromiseRejectedError`: a human (or a gateway) said no.

.. versionadded:: 0.2.0
"""

TimedOut = PromiseTimedOutError
"""Short name for `PromiseTimedOutError`: nobody settled the promise in time.

.. versionadded:: 0.2.0
"""


class Cancelled(BaseException):
    """The promise the workflow awaited, or the workflow itself, was cancelled.

    Raised at the workflow's next `yield` after a cancel (its pending
    approvals are rejected as cancelled in the same transaction). The workflow
    may catch it (`except Cancelled:`) and run compensation steps (`ctx.run`,
    checkpointed and never repeated, like any other step) before it returns or
    re-raises; a new wait on a promise raises `Cancelled` again. The root keeps
    its cancelled state whatever the workflow then returns. `Handle.result()`
    raises it too, for a cancelled workflow.

    A `BaseException`, like `asyncio.CancelledError` and for the same reason:
    `except Exception:` around a wait does not swallow a cancel. Catch it by
    name.

    Attributes:
        promise_id: The cancelled promise's id (the root's, if the workflow was cancelled).

    .. versionadded:: 0.1.0
    .. versionchanged:: 0.2.0 A `BaseException`, no longer a `WorkflowError`
       (nor a `TrothError`, nor an `Exception`).
    """

    def __init__(self, promise_id: str) -> None:
        super().__init__(promise_id)
        self.promise_id = promise_id

    def __str__(self) -> str:
        return f"promise {self.promise_id!r} was cancelled"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.promise_id,))


class WorkflowFailed(WorkflowError):
    """Raise it in workflow code to fail the workflow: its root is rejected for good.

    A bug pauses a workflow, it does not lose it: any other exception that
    leaves workflow code (a `NameError`, a `KeyError`...) fails only the
    worker's *task*, which is retried with backoff while the root stays
    PENDING, until fixed code is deployed (or an operator runs `troth
    workflows fail`). The workflow fails only on purpose: this exception, an
    exception type it declares with `@worker.workflow(fail_on=(...))`, or a
    troth outcome it did not catch (`PromiseRejectedError`, `Cancelled`,
    `PromiseTimedOutError`, a `ctx.run` step that failed after its retries).

    The root is rejected with `{"type": "troth.errors.WorkflowFailed",
    "message": message}`, plus `"details"` when given (any value the codec
    encodes).

    Attributes:
        message: Why the workflow failed, for whoever reads its result.
        details: More about it (optional).

    .. versionadded:: 0.2.0
    """

    def __init__(self, message: str, details: Any = None) -> None:
        super().__init__(message, details)
        self.message = message
        self.details = details

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message, self.details))


class ConfigurationError(TrothError):
    """The SDK was set up wrongly (e.g. a bad address or timeout); fix the arguments.

    Attributes:
        message: What was wrong and what to do.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message,))


class RegistrationError(TrothError):
    """A workflow could not be registered (duplicate name, not a generator function...).

    Attributes:
        name: The workflow name at fault.
        message: What was wrong and what to do.

    .. versionadded:: 0.1.0
    """

    def __init__(self, name: str, message: str) -> None:
        super().__init__(name, message)
        self.name = name
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.name, self.message))
