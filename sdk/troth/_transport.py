"""The gRPC channel to a troth server, its stubs, retries, and error mapping.

This module owns everything that knows about gRPC on the SDK side:

- one channel per `Client`, and the typed stubs of both services on it
  (`PromiseService`, and `TaskService` for the worker and `troth tasks`), with keepalive
  tuned for long `WatchPromise` streams and generous message limits (the
  server enforces its own payload limits); a client of several replicas
  has one channel to all of them, which fails over by itself (`troth._addresses`);
- the principal sent as `troth-principal` metadata, and the bearer token as
  `authorization: Bearer ...`, on every call, unary and streaming alike (the
  `metadata` every call site passes, built per call from the token source's
  current token, `troth._credentials.TokenSource`), and each call's timeout as
  `troth-timeout-ms` (the server's measure of how long calls wait); TLS or
  plaintext, and the rule that a token never goes in plaintext off this
  machine (`troth._credentials`);
- a token the server refuses (`UNAUTHENTICATED`; a stream ended with it or with
  `PERMISSION_DENIED`) while the source now gives another: the call is made again,
  once, with the new one (`renewed`), and so is a stream reopened;
- retries with capped, jittered exponential backoff (`troth._backoff`) of
  `UNAVAILABLE` and `DEADLINE_EXCEEDED`, for idempotent calls only, and of an
  overload refusal (`RESOURCE_EXHAUSTED`, reason `OVERLOADED`, after its
  `RetryInfo` delay), for any call: the server did nothing with it; all within
  the call's deadline, and an error that gives up says after how many attempts
  over how long;
- `map_rpc_errors()`, the one place where a `grpc.RpcError` and its
  `google.rpc.ErrorInfo` become the most specific `troth.errors.RpcError`
  (the shape of httpx's `map_httpcore_exceptions`).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from troth._addresses import Resolver, channel_target, parse_addresses
from troth._backoff import RetryPolicy, retry_delay
from troth._credentials import (
    TlsConfig,
    TokenSource,
    check_tls_target,
    check_token_channel,
)
from troth._grpc_args import (
    ARG_LB_POLICY_NAME,
    ARG_MAX_RECEIVE_MESSAGE_LENGTH,
    ARG_MAX_RECONNECT_BACKOFF_MS,
    ARG_MAX_SEND_MESSAGE_LENGTH,
    Options,
    client_keepalive,
)
from troth._mux import CallStream, MultiplexedStub
from troth._tracing import TRACEPARENT_METADATA, current_traceparent
from troth.errors import (
    ERROR_DOMAIN,
    AlreadyExistsError,
    AlreadySettledError,
    ConfigurationError,
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    OverloadedError,
    PermissionDeniedError,
    PromiseTimedOutError,
    Reason,
    ResourceExhaustedError,
    RpcError,
    UnauthenticatedError,
    UnavailableError,
)
from troth.v1 import promises_pb2_grpc, tasks_pb2_grpc

if TYPE_CHECKING:
    from troth.v1 import promises_pb2, schedules_pb2, tasks_pb2

_log = logging.getLogger("troth.client")

PRINCIPAL_METADATA_KEY = "troth-principal"
"""gRPC metadata key carrying the caller's principal (recorded as `settled_by`)."""

TIMEOUT_METADATA_KEY = "troth-timeout-ms"
"""gRPC metadata key carrying a call's timeout in milliseconds (see `metadata_for`)."""

_MiB = 1024 * 1024


def channel_options() -> Options:
    """The SDK channel's options, keys from `troth._grpc_args` (gRPC ignores a misspelt
    key without a word; a test checks every one against gRPC's own list)."""
    return (
        # Ping every minute while a call is open, so a watch waiting for days on a
        # half-open connection (NAT timeout, dead host) notices within ~80 s and
        # reconnects. The troth server permits pings this often
        # (`--keepalive-min-ping-interval`, derived from the same constants).
        *client_keepalive(),
        # gRPC's own reconnect backoff grows to 120 s by default, during which calls
        # fail at once; cap it at a second so that a restarted server is found again
        # within about one: a worker holding a finished step's result must heartbeat
        # within one lease length of the server's return to keep its task (and the
        # step from running again elsewhere; troth._leases). A connection attempt a
        # second to a server that is down costs next to nothing.
        (ARG_MAX_RECONNECT_BACKOFF_MS, 1_000),
        # Generous so that a search page of large payloads fits; the server's own
        # payload limit is what bounds a single promise.
        (ARG_MAX_RECEIVE_MESSAGE_LENGTH, 64 * _MiB),
        (ARG_MAX_SEND_MESSAGE_LENGTH, 64 * _MiB),
        # gRPC's default, stated because failover between replicas relies on it:
        # use the first address that answers; when it goes away, the next call
        # connects to the first that answers again (troth._addresses).
        (ARG_LB_POLICY_NAME, "pick_first"),
    )


_R = TypeVar("_R")

_RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

Metadata = tuple[tuple[str, str], ...]
"""gRPC metadata as the SDK sends it."""

__all__ = ["PRINCIPAL_METADATA_KEY", "RetryPolicy", "Transport", "as_call", "map_rpc_errors"]


class PromiseServiceStub(Protocol):
    """The typed shape of the generated `troth.v1.PromiseService` stub."""

    CreatePromise: grpc.UnaryUnaryMultiCallable[
        promises_pb2.CreatePromiseRequest, promises_pb2.CreatePromiseResponse
    ]
    GetPromise: grpc.UnaryUnaryMultiCallable[
        promises_pb2.GetPromiseRequest, promises_pb2.GetPromiseResponse
    ]
    SearchPromises: grpc.UnaryUnaryMultiCallable[
        promises_pb2.SearchPromisesRequest, promises_pb2.SearchPromisesResponse
    ]
    ResolvePromise: grpc.UnaryUnaryMultiCallable[
        promises_pb2.ResolvePromiseRequest, promises_pb2.ResolvePromiseResponse
    ]
    RejectPromise: grpc.UnaryUnaryMultiCallable[
        promises_pb2.RejectPromiseRequest, promises_pb2.RejectPromiseResponse
    ]
    CancelPromise: grpc.UnaryUnaryMultiCallable[
        promises_pb2.CancelPromiseRequest, promises_pb2.CancelPromiseResponse
    ]
    WatchPromise: grpc.UnaryStreamMultiCallable[
        promises_pb2.WatchPromiseRequest, promises_pb2.WatchPromiseResponse
    ]
    WaitPromise: grpc.UnaryUnaryMultiCallable[
        promises_pb2.WaitPromiseRequest, promises_pb2.WaitPromiseResponse
    ]
    WatchPromises: grpc.UnaryStreamMultiCallable[
        promises_pb2.WatchPromisesRequest, promises_pb2.WatchPromisesResponse
    ]
    PrunePromises: grpc.UnaryUnaryMultiCallable[
        promises_pb2.PrunePromisesRequest, promises_pb2.PrunePromisesResponse
    ]
    MintSettleToken: grpc.UnaryUnaryMultiCallable[
        promises_pb2.MintSettleTokenRequest, promises_pb2.MintSettleTokenResponse
    ]
    WhoAmI: grpc.UnaryUnaryMultiCallable[promises_pb2.WhoAmIRequest, promises_pb2.WhoAmIResponse]


class TaskServiceStub(Protocol):
    """The typed shape of the generated `troth.v1.TaskService` stub."""

    Poll: grpc.UnaryStreamMultiCallable[tasks_pb2.PollRequest, tasks_pb2.PollResponse]
    CompleteTask: grpc.UnaryUnaryMultiCallable[
        tasks_pb2.CompleteTaskRequest, tasks_pb2.CompleteTaskResponse
    ]
    Heartbeat: grpc.UnaryUnaryMultiCallable[tasks_pb2.HeartbeatRequest, tasks_pb2.HeartbeatResponse]
    ReleaseTask: grpc.UnaryUnaryMultiCallable[
        tasks_pb2.ReleaseTaskRequest, tasks_pb2.ReleaseTaskResponse
    ]
    RegisterCallbacks: grpc.UnaryUnaryMultiCallable[
        tasks_pb2.RegisterCallbacksRequest, tasks_pb2.RegisterCallbacksResponse
    ]
    SearchTasks: grpc.UnaryUnaryMultiCallable[
        tasks_pb2.SearchTasksRequest, tasks_pb2.SearchTasksResponse
    ]
    FailTask: grpc.UnaryUnaryMultiCallable[tasks_pb2.FailTaskRequest, tasks_pb2.FailTaskResponse]
    FailWorkflow: grpc.UnaryUnaryMultiCallable[
        tasks_pb2.FailWorkflowRequest, tasks_pb2.FailWorkflowResponse
    ]
    MoveWorkflow: grpc.UnaryUnaryMultiCallable[
        tasks_pb2.MoveWorkflowRequest, tasks_pb2.MoveWorkflowResponse
    ]
    SearchWorkers: grpc.UnaryUnaryMultiCallable[
        tasks_pb2.SearchWorkersRequest, tasks_pb2.SearchWorkersResponse
    ]
    SearchWorkflows: grpc.UnaryUnaryMultiCallable[
        tasks_pb2.SearchWorkflowsRequest, tasks_pb2.SearchWorkflowsResponse
    ]
    RetryWorkflowNow: grpc.UnaryUnaryMultiCallable[
        tasks_pb2.RetryWorkflowNowRequest, tasks_pb2.RetryWorkflowNowResponse
    ]
    GetWorkflowState: grpc.UnaryUnaryMultiCallable[
        tasks_pb2.GetWorkflowStateRequest, tasks_pb2.GetWorkflowStateResponse
    ]
    ReplaceWorkflowState: grpc.UnaryUnaryMultiCallable[
        tasks_pb2.ReplaceWorkflowStateRequest, tasks_pb2.ReplaceWorkflowStateResponse
    ]
    CreateSchedule: grpc.UnaryUnaryMultiCallable[
        schedules_pb2.CreateScheduleRequest, schedules_pb2.CreateScheduleResponse
    ]
    UpdateSchedule: grpc.UnaryUnaryMultiCallable[
        schedules_pb2.UpdateScheduleRequest, schedules_pb2.UpdateScheduleResponse
    ]
    GetSchedule: grpc.UnaryUnaryMultiCallable[
        schedules_pb2.GetScheduleRequest, schedules_pb2.GetScheduleResponse
    ]
    SearchSchedules: grpc.UnaryUnaryMultiCallable[
        schedules_pb2.SearchSchedulesRequest, schedules_pb2.SearchSchedulesResponse
    ]
    PauseSchedule: grpc.UnaryUnaryMultiCallable[
        schedules_pb2.PauseScheduleRequest, schedules_pb2.PauseScheduleResponse
    ]
    ResumeSchedule: grpc.UnaryUnaryMultiCallable[
        schedules_pb2.ResumeScheduleRequest, schedules_pb2.ResumeScheduleResponse
    ]
    DeleteSchedule: grpc.UnaryUnaryMultiCallable[
        schedules_pb2.DeleteScheduleRequest, schedules_pb2.DeleteScheduleResponse
    ]


class Transport:
    """One channel to a troth server (or its replicas), its stubs, and the retry loop.

    Thread-safe, as the underlying gRPC channel is. Connecting is lazy: nothing
    touches the network until the first call (but the host names of several
    addresses are resolved here, once).

    Args:
        address: `host:port` of the server (any gRPC target string); or
            several replicas' `host:port`, as a sequence or comma-separated.
        principal: Sent as `troth-principal` metadata on every call, if given.
        tls: Connect over TLS with these settings; None is plaintext.
        token: Sent as `authorization: Bearer <token>` metadata on every call, if
            given: a checked token, or the source of the current one
            (`troth._credentials.token_source`).
        allow_plaintext_token: Send the token in plaintext to a non-loopback
            address (something else encrypts the path); refused otherwise.
        retry: How idempotent calls are retried.
        sleep: Replaced in tests, so retries take no time.
        clock: Monotonic clock for deadlines; replaced in tests.
        resolve: Host name and port to IP addresses, for several addresses;
            replaced in tests.
    """

    def __init__(
        self,
        address: str | Sequence[str],
        *,
        principal: str | None = None,
        tls: TlsConfig | None = None,
        token: str | TokenSource | None = None,
        allow_plaintext_token: bool = False,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        resolve: Resolver | None = None,
    ) -> None:
        self.addresses = parse_addresses(address)
        if principal is not None and (not principal or not principal.isprintable()):
            raise ConfigurationError(
                f"principal {principal!r} must be a non-empty printable string "
                "(it travels as gRPC metadata); pass None to send none"
            )
        check_tls_target(self.addresses, tls)
        check_token_channel(self.addresses, tls=tls, token=token, allowed=allow_plaintext_token)
        target = channel_target(self.addresses, resolve=resolve)
        self.address = ",".join(self.addresses)
        """The addresses, comma-separated: what the user gave, and error messages name."""
        self.retry = retry or RetryPolicy()
        self.tls = tls
        """The TLS settings of the channel, or None for plaintext."""
        self._fixed: Metadata = () if principal is None else ((PRINCIPAL_METADATA_KEY, principal),)
        self._token = TokenSource.fixed(token) if isinstance(token, str) else token
        self._sent: tuple[tuple[str, str] | None, Metadata] = (None, self._fixed)
        """The last token pair and the metadata made with it (`metadata`)."""
        self._sleep = sleep
        self._clock = clock
        if tls is None:
            self._channel = grpc.insecure_channel(target, options=channel_options())
        else:
            self._channel = grpc.secure_channel(
                target, tls.channel_credentials(), options=channel_options() + tls.channel_options()
            )
        # The generated stub is unannotated; PromiseServiceStub gives its methods their types.
        stub = promises_pb2_grpc.PromiseServiceStub(self._channel)  # type: ignore[no-untyped-call,unused-ignore]
        self.promises: PromiseServiceStub = stub
        tasks = tasks_pb2_grpc.TaskServiceStub(self._channel)  # type: ignore[no-untyped-call,unused-ignore]
        self.tasks: TaskServiceStub = tasks
        self.unary_promises: PromiseServiceStub = stub
        """The generated stubs themselves: every call a unary RPC, multiplexed or not."""
        self.unary_tasks: TaskServiceStub = tasks
        self.calls: CallStream | None = None
        """The stream a `multiplexed()` transport sends its unary calls on."""

    @property
    def metadata(self) -> Metadata:
        """Sent with every call and stream: the principal and the token source's current
        token, if any (which shows as `<redacted>` in a repr). The same tuple until the
        token changes, so a stream can tell whether it was opened with the current one."""
        source = self._token
        if source is None:
            return self._fixed
        pair = source.current()
        sent = self._sent
        if sent[0] is pair:
            return sent[1]
        metadata = (*self._fixed, pair)
        self._sent = (pair, metadata)
        return metadata

    def renewed(self, exc: grpc.RpcError, sent: Metadata, *, stream: bool = False) -> bool:
        """Whether to make again, at once, a call (or reopen a stream) that `exc` ended
        after it sent `sent`: the server refused the credential (`UNAUTHENTICATED`; for a
        stream, or a call on the `Calls` stream that ended with it, `PERMISSION_DENIED`
        too), and the token source, asked again now, gives another token. With the same
        token, the answer would be the same: False."""
        source = self._token
        code = _code(exc)
        if source is None or code is None:
            return False
        stream = stream or bool(getattr(exc, "stream_failed", False))
        if code is not grpc.StatusCode.UNAUTHENTICATED and not (
            stream and code is grpc.StatusCode.PERMISSION_DENIED
        ):
            return False
        pair = source.refresh()
        if pair in sent:
            return False
        _log.info(
            "the server refused the token (%s); trying again with the new one %s gave",
            code.name,
            source.label,
            extra={"address": self.address},
        )
        return True

    @property
    def token_label(self) -> str | None:
        """Where the token comes from (never the token): None when no token is sent."""
        return None if self._token is None else self._token.label

    @property
    def token_renewable(self) -> bool:
        """Whether the token source may give another token later (a callable, a file)."""
        return self._token is not None and self._token.renewable

    def error(self, exc: grpc.RpcError) -> RpcError:
        """`exc` as the `troth.errors` exception a call would have raised."""
        return _to_troth_error(exc, self.address, self.tls)

    @property
    def channel(self) -> grpc.Channel:
        """The gRPC channel itself."""
        return self._channel

    def multiplexed(self) -> Transport:
        """This transport (its channel, retries, metadata), with the unary calls the
        stream carries (`troth._mux.MULTIPLEXED`) sent as messages on a
        `TaskService.Calls` stream of its own; close that stream with `close_calls()`."""
        twin = copy.copy(self)
        twin.calls = CallStream(self._channel, lambda: twin.metadata)
        twin.promises = cast("PromiseServiceStub", MultiplexedStub(self.unary_promises, twin.calls))
        twin.tasks = cast("TaskServiceStub", MultiplexedStub(self.unary_tasks, twin.calls))
        return twin

    def reached(self) -> bool:
        """Whether this transport's `Calls` stream is open and the server took it (the
        server is there now: a wait may start with a long call, see `wait_promise`)."""
        return self.calls is not None and self.calls.reached()

    def close_calls(self) -> None:
        """End the `Calls` stream of a `multiplexed()` transport (nothing otherwise)."""
        if self.calls is not None:
            self.calls.close()

    def close(self) -> None:
        """Close the channel; calls still open fail with `CANCELLED`. Safe to repeat."""
        self._channel.close()

    def deadline(self, timeout: float | None) -> float | None:
        """The monotonic instant a call given `timeout` seconds must end by."""
        return None if timeout is None else self._clock() + timeout

    def remaining(self, deadline: float | None) -> float | None:
        """Seconds left until `deadline` (never negative), or None for no deadline."""
        return None if deadline is None else max(0.0, deadline - self._clock())

    def metadata_for(self, timeout: float | None, base: Metadata | None = None) -> Metadata:
        """`metadata` (or `base`, taken from it) plus the call's timeout
        (`troth-timeout-ms`), from which the server tells how long the call waited before
        it could start it, and sheds load before calls wait too long (RESOURCE_EXHAUSTED,
        reason OVERLOADED); and the caller's span (`traceparent`), when it traces."""
        metadata = self.metadata if base is None else base
        traceparent = current_traceparent()
        if traceparent is not None:  # the server's span of this call continues the caller's
            metadata = (*metadata, (TRACEPARENT_METADATA, traceparent))
        if timeout is None:
            return metadata
        return (*metadata, (TIMEOUT_METADATA_KEY, str(max(1, round(timeout * 1000)))))

    def now(self) -> float:
        """The monotonic clock deadlines are measured on."""
        return self._clock()

    def retry_delay(
        self,
        exc: grpc.RpcError,
        attempt: int,
        deadline: float | None,
        *,
        idempotent: bool,
        limit_attempts: bool = True,
    ) -> float | None:
        """How long to wait before retrying after `exc`, or None to give up.

        An overload refusal is retried for any call: the server did nothing with
        it. Otherwise only idempotent calls are retried: a non-idempotent call
        that failed with `UNAVAILABLE` may still have been applied.
        `INVALID_ARGUMENT` and every other definite answer are never retried.

        Args:
            exc: The failure of attempt number `attempt` (1-based).
            attempt: How many attempts have failed in a row.
            deadline: The call's deadline (from `deadline()`), or None.
            idempotent: Whether repeating the call is harmless.
            limit_attempts: False when the caller bounds retries itself (by time).
        """
        call = as_call(exc)
        if call is None:
            return None
        server_delay = overload_delay(call)
        overloaded = server_delay is not None
        if not overloaded and (not idempotent or call.code() not in _RETRYABLE_CODES):
            return None
        return retry_delay(
            self.retry,
            attempt,
            overloaded=overloaded,
            server_delay=server_delay or None,
            remaining=self.remaining(deadline),
            limit_attempts=limit_attempts,
        )

    def reconnect_delay(
        self,
        exc: grpc.RpcError,
        failures: int,
        deadline: float | None,
        *,
        outage_start: float | None,
    ) -> float | None:
        """How long to wait before reopening a stream after `exc`, or None to give up.

        A stream never established (`outage_start` None) fails as fast as any
        call would (a wrong address...). One that was in place, perhaps for
        days, rides out a restart or failover: it keeps trying for up to
        `reconnect_window` seconds after `outage_start`, when it broke.
        """
        if outage_start is None:
            return self.retry_delay(exc, failures, deadline, idempotent=True)
        if self.now() - outage_start >= self.retry.reconnect_window:
            return None
        return self.retry_delay(exc, failures, deadline, idempotent=True, limit_attempts=False)

    def sleep(self, seconds: float) -> None:
        """Sleep between attempts (through the injectable `sleep`, so tests take no time)."""
        self._sleep(seconds)

    def call(
        self,
        method: grpc.UnaryUnaryMultiCallable[Any, _R],
        request: object,
        *,
        timeout: float | None,
        idempotent: bool = True,
    ) -> _R:
        """Make a unary call, retrying per the policy, and map any error.

        Args:
            method: A stub method, e.g. `transport.promises.GetPromise`.
            request: Its request message.
            timeout: Overall seconds for the call including retries, or None.
            idempotent: Whether repeating the call is harmless.

        Raises:
            troth.errors.RpcError: The most specific subclass for the failure.
        """
        deadline = self.deadline(timeout)
        started = self._clock()
        attempt = 0
        unreachable: grpc.RpcError | None = None
        renewed = False
        try:
            with map_rpc_errors(self.address, tls=self.tls):
                while True:
                    attempt += 1
                    sent = self.metadata
                    try:
                        remaining = self.remaining(deadline)
                        return method(
                            request, timeout=remaining, metadata=self.metadata_for(remaining, sent)
                        )
                    except grpc.RpcError as exc:
                        if (
                            not renewed
                            and (idempotent or not getattr(exc, "stream_failed", False))
                            and self.renewed(exc, sent)
                        ):
                            # Refused before it was made (or, on a stream that ended,
                            # perhaps made: an idempotent call only): once more, at once.
                            renewed = True
                            attempt -= 1
                            continue
                        delay = self.retry_delay(exc, attempt, deadline, idempotent=idempotent)
                        if delay is None:
                            if (
                                unreachable is not None
                                and _code(exc) is grpc.StatusCode.DEADLINE_EXCEEDED
                            ):
                                # The deadline ran out while still trying to connect:
                                # "cannot reach the server" says what is wrong; a
                                # bare timeout would point at a slow server.
                                raise unreachable from exc
                            raise
                        if _code(exc) is grpc.StatusCode.UNAVAILABLE:
                            unreachable = exc
                        _log.debug(
                            "retrying after %s (attempt %d)",
                            exc.code().name,
                            attempt,
                            extra={"address": self.address, "delay": delay},
                        )
                        self._sleep(delay)
        except RpcError as error:
            if attempt > 1 and error.__cause__ is not None:
                cause: Any = error.__cause__
                why = self._why_stopped(cause, attempt, idempotent=idempotent)
                error.retried(attempt, self._clock() - started, why)
            raise

    def _why_stopped(self, exc: grpc.RpcError, attempt: int, *, idempotent: bool) -> str:
        """Why the retries of a call stopped after `exc` (for its error's message)."""
        call = as_call(exc)
        overloaded = call is not None and overload_delay(call) is not None
        if call is None or (
            not overloaded and (not idempotent or call.code() not in _RETRYABLE_CODES)
        ):
            return "that answer is not retried"
        cap = self.retry.overload_attempts if overloaded else self.retry.max_attempts
        if attempt >= cap:
            return f"{cap} attempts is the retry policy's limit"
        return "another retry would not have finished before the call's deadline"


def overload_delay(call: grpc.Call) -> float | None:
    """For an overload refusal (`RESOURCE_EXHAUSTED` carrying reason `OVERLOADED` or a
    `google.rpc.RetryInfo`), the seconds the server asked to wait (0.0 when it named
    none); None for any other answer.

    A `RESOURCE_EXHAUSTED` without either (a message over gRPC's size limit, say)
    would fail the same way again: it is not retried.
    """
    if call.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    status = _rich_status(call)
    if status is None:
        return None
    overloaded = False
    delay = 0.0
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            delay = info.retry_delay.ToMilliseconds() / 1000
            overloaded = True
        elif detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            reason = error_details_pb2.ErrorInfo()
            detail.Unpack(reason)
            overloaded = overloaded or (
                reason.reason == Reason.OVERLOADED and reason.domain in ("", ERROR_DOMAIN)
            )
    return delay if overloaded else None


def lacks_method(call: grpc.Call) -> bool:
    """Whether the server does not have the RPC called: UNIMPLEMENTED, or, for a call
    on a `Calls` stream, an older server's refusal of the method by name."""
    code = call.code()
    if code is grpc.StatusCode.UNIMPLEMENTED:
        return True
    return code is grpc.StatusCode.INVALID_ARGUMENT and _error_info(call)[1].get("field") == (
        "method"
    )


_BY_REASON: Mapping[str, type[RpcError]] = {
    Reason.ALREADY_SETTLED: AlreadySettledError,
    Reason.TIMED_OUT: PromiseTimedOutError,
    Reason.STALE_COUNTER: LeaseLostError,
    Reason.OVERLOADED: OverloadedError,
}

_BY_CODE: Mapping[grpc.StatusCode, type[RpcError]] = {
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgumentError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
}


@contextlib.contextmanager
def map_rpc_errors(address: str | None = None, *, tls: TlsConfig | None = None) -> Iterator[None]:
    """Turn any `grpc.RpcError` raised inside the block into the most specific `RpcError`.

    The `ErrorInfo.reason` decides first (`ALREADY_SETTLED`, `TIMED_OUT`,
    `STALE_COUNTER`), then the status code; anything else is a plain
    `RpcError`. The original gRPC error is chained as `__cause__`.

    Args:
        address: The server's address, named in the message when it cannot be reached.
        tls: The channel's TLS settings (None: plaintext), for the hint a failed
            handshake gets.
    """
    try:
        yield
    except grpc.RpcError as exc:
        raise _to_troth_error(exc, address, tls) from exc


def as_call(exc: grpc.RpcError) -> grpc.Call | None:
    """The error as a `grpc.Call` (its code, details and trailers), if it is one.

    Errors raised by gRPC for a call are both; a bare `grpc.RpcError` (e.g.
    from an interceptor) carries no status at all.
    """
    # Through `object`: the grpc stubs declare RpcError and Call with
    # conflicting signatures, so mypy would call the intersection impossible.
    error: object = exc
    return error if isinstance(error, grpc.Call) else None


def _rich_status(call: grpc.Call) -> Any:
    """The call's `google.rpc.Status` (from `grpc-status-details-bin`), or None."""
    try:
        return rpc_status.from_call(call)
    except ValueError:
        # The rich status disagrees with the call's own code or message (an
        # intermediary rewrote one of them): trust the call and skip the details.
        return None


def _error_info(call: grpc.Call) -> tuple[str, dict[str, str]]:
    """The reason and metadata of the troth `ErrorInfo` in a call's status details."""
    status = _rich_status(call)
    if status is None:
        return "", {}
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            # Reasons are only meaningful in troth's domain; another domain's
            # ErrorInfo (a proxy, a mesh) must not be mistaken for one of ours.
            if info.domain in ("", ERROR_DOMAIN):
                return str(info.reason), {str(k): str(v) for k, v in info.metadata.items()}
    return "", {}


def _tls_hint(details: str, where: str, tls: TlsConfig | None) -> str | None:
    """For a connection that failed on TLS (gRPC says so only in its details), a
    message that names the likely mismatch and the setting that fixes it."""
    if tls is not None and "CERTIFICATE_VERIFY_FAILED" in details:
        trusted = "the system's root certificates" if tls.ca_file is None else str(tls.ca_file)
        return (
            f"the troth server{where} presented a certificate this client does not trust "
            f"(checked against {trusted}): {details}. Give the CA that signed the server's "
            "certificate (TlsConfig(ca_file=...), TROTH_TLS_CA, --tls-ca), and dial a name "
            "the certificate holds (or set TlsConfig(server_name=...))"
        )
    if tls is not None and "Hostname Verification" in details:
        checked = f" {tls.server_name!r}" if tls.server_name else " dialled"
        return (
            f"the troth server{where} presented a certificate that does not name the "
            f"host{checked} ({details}); dial a name the certificate holds, or say which "
            "one to expect with TlsConfig(server_name=...)"
        )
    if tls is not None and "WRONG_VERSION_NUMBER" in details:
        return (
            f"the troth server{where} does not speak TLS ({details}); it serves plaintext "
            "(started without --tls-cert): connect without TLS, or serve TLS"
        )
    if tls is not None and "Socket closed" in details:
        why = (
            "a client certificate its client CA did not sign"
            if tls.mutual
            else "no client certificate"
        )
        return (
            f"the troth server{where} closed the TLS connection ({details}); a server "
            f"serving mTLS (--tls-client-ca) does so when a client presents {why}: "
            "present a certificate its client CA signed (TlsConfig(cert_file=..., "
            "key_file=...), TROTH_TLS_CERT/TROTH_TLS_KEY, --tls-cert/--tls-key)"
        )
    if tls is None and "Socket closed" in details:
        return (
            f"the troth server{where} closed the connection ({details}); if it serves TLS "
            "(started with --tls-cert), connect with TLS: tls=True or "
            "TlsConfig(ca_file=...), TROTH_TLS_CA, --tls-ca for the CLI; else check that "
            "the server is running"
        )
    return None


def _code(exc: grpc.RpcError) -> grpc.StatusCode | None:
    call = as_call(exc)
    return None if call is None else call.code()


def _to_troth_error(exc: grpc.RpcError, address: str | None, tls: TlsConfig | None) -> RpcError:
    call = as_call(exc)
    reason: str = ""
    metadata: dict[str, str] = {}
    if call is not None:
        code = call.code()
        message = call.details() or ""
        reason, metadata = _error_info(call)
    else:
        code, message = grpc.StatusCode.UNKNOWN, str(exc)
    cls = _BY_REASON.get(reason) or _BY_CODE.get(code, RpcError)
    if not reason:
        # No troth ErrorInfo: the answer came from gRPC itself, not the server's
        # code, so its message rarely says what to do. Say it.
        where = (f" at any of {address}" if "," in address else f" at {address}") if address else ""
        if code is grpc.StatusCode.UNAVAILABLE:
            message = _tls_hint(message, where, tls) or (
                f"cannot reach the troth server{where} ({message or 'no details'}); check the "
                "address (--server or TROTH_SERVER for the CLI) and that the server is "
                "running, e.g. `troth serve`"
            )
        elif code is grpc.StatusCode.DEADLINE_EXCEEDED:
            message = (
                f"no answer from the troth server{where} within the timeout "
                f"({message or 'no details'}); check the server's health or allow more time"
            )
    return cls(code, reason, message, metadata)
