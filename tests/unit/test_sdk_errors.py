"""map_rpc_errors: gRPC status + ErrorInfo -> the most specific TrothError; retries; pickling."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from troth import errors
from troth._transport import RetryPolicy, Transport, map_rpc_errors
from troth.errors import ERROR_DOMAIN, Reason

Code = grpc.StatusCode


class FakeCall(grpc.RpcError, grpc.Call):
    """What grpc raises for a failed call: an RpcError that is also a Call."""

    def __init__(
        self, code: grpc.StatusCode, details: str, trailing: tuple[tuple[str, Any], ...] = ()
    ) -> None:
        super().__init__(details)
        self._code = code
        self._details = details
        self._trailing = trailing

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def initial_metadata(self) -> tuple[tuple[str, Any], ...]:
        return ()

    # The grpc stubs give RpcError and Call different trailing_metadata types.
    def trailing_metadata(self) -> tuple[tuple[str, Any], ...]:  # type: ignore[override]
        return self._trailing

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False

    def cancel(self) -> bool:
        return False

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float:
        return 0.0


def rich_error(
    code: grpc.StatusCode,
    message: str,
    reason: str | None = None,
    metadata: dict[str, str] | None = None,
    *,
    domain: str = ERROR_DOMAIN,
    status_message: str | None = None,
) -> FakeCall:
    """A failed call carrying `grpc-status-details-bin`, as grpcio-status servers send it."""
    status = status_pb2.Status(
        code=code.value[0], message=message if status_message is None else status_message
    )
    if reason is not None:
        info = error_details_pb2.ErrorInfo(reason=reason, domain=domain, metadata=metadata or {})
        status.details.add().Pack(info)
    return FakeCall(code, message, (("grpc-status-details-bin", status.SerializeToString()),))


def mapped(exc: grpc.RpcError, address: str | None = "127.0.0.1:7070") -> errors.RpcError:
    with pytest.raises(errors.RpcError) as caught, map_rpc_errors(address):
        raise exc
    assert caught.value.__cause__ is exc
    return caught.value


@pytest.mark.parametrize(
    ("code", "reason", "expected"),
    [
        (Code.FAILED_PRECONDITION, Reason.ALREADY_SETTLED, errors.AlreadySettledError),
        (Code.FAILED_PRECONDITION, Reason.TIMED_OUT, errors.PromiseTimedOutError),
        (Code.FAILED_PRECONDITION, Reason.STALE_COUNTER, errors.LeaseLostError),
        (Code.FAILED_PRECONDITION, "SOMETHING_NEW", errors.FailedPreconditionError),
        (Code.NOT_FOUND, Reason.NOT_FOUND, errors.NotFoundError),
        (Code.ALREADY_EXISTS, Reason.ALREADY_EXISTS, errors.AlreadyExistsError),
        (Code.INVALID_ARGUMENT, Reason.INVALID_ARGUMENT, errors.InvalidArgumentError),
        (Code.INVALID_ARGUMENT, Reason.INVALID_PAGE_TOKEN, errors.InvalidArgumentError),
        (Code.UNAUTHENTICATED, Reason.UNAUTHENTICATED, errors.UnauthenticatedError),
        (Code.PERMISSION_DENIED, Reason.PERMISSION_DENIED, errors.PermissionDeniedError),
        (Code.RESOURCE_EXHAUSTED, Reason.RESOURCE_EXHAUSTED, errors.ResourceExhaustedError),
        (Code.UNAVAILABLE, Reason.STORE_UNAVAILABLE, errors.UnavailableError),
        (Code.UNAVAILABLE, Reason.SHUTTING_DOWN, errors.UnavailableError),
        (Code.DEADLINE_EXCEEDED, Reason.INTERNAL, errors.DeadlineExceededError),
        (Code.INTERNAL, Reason.INTERNAL, errors.RpcError),
    ],
)
def test_mapping_by_reason_then_code(
    code: grpc.StatusCode, reason: str, expected: type[errors.RpcError]
) -> None:
    error = mapped(rich_error(code, "what happened; what to do", reason, {"k": "v"}))
    assert type(error) is expected
    assert error.code is code
    assert error.reason == reason
    assert error.message == "what happened; what to do"
    assert error.metadata == {"k": "v"}
    assert "what happened; what to do" in str(error)
    assert f"[{reason}]" in str(error)


def test_reason_wins_over_code() -> None:
    # Mapping looks at the reason first, whatever code carried it.
    error = mapped(rich_error(Code.ABORTED, "moved on", Reason.STALE_COUNTER))
    assert isinstance(error, errors.LeaseLostError)


def test_error_classes_form_the_documented_tree() -> None:
    assert issubclass(errors.AlreadySettledError, errors.FailedPreconditionError)
    assert issubclass(errors.PromiseTimedOutError, errors.FailedPreconditionError)
    assert issubclass(errors.LeaseLostError, errors.FailedPreconditionError)
    assert issubclass(errors.RpcError, errors.TrothError)
    assert issubclass(errors.ConfigurationError, errors.TrothError)
    assert issubclass(errors.DeadlineExceededError, TimeoutError)
    assert errors.UnavailableError.retryable
    assert not errors.NotFoundError.retryable


def test_invalid_argument_field_comes_from_metadata() -> None:
    error = mapped(
        rich_error(
            Code.INVALID_ARGUMENT, "ttl: must be positive", "INVALID_ARGUMENT", {"field": "ttl"}
        )
    )
    assert isinstance(error, errors.InvalidArgumentError)
    assert error.field == "ttl"
    assert str(error).startswith("invalid argument 'ttl': ttl: must be positive")


def test_already_settled_carries_promise_id_and_state() -> None:
    error = mapped(
        rich_error(
            Code.FAILED_PRECONDITION,
            "promise 'a' was already resolved",
            Reason.ALREADY_SETTLED,
            {"promise_id": "a", "state": "RESOLVED"},
        )
    )
    assert isinstance(error, errors.AlreadySettledError)
    assert (error.promise_id, error.state) == ("a", "RESOLVED")


def test_without_error_info_maps_by_code() -> None:
    error = mapped(FakeCall(Code.NOT_FOUND, "no such promise"))
    assert type(error) is errors.NotFoundError
    assert error.reason == ""
    assert error.metadata == {}
    assert str(error) == "not found: no such promise"


def test_unreachable_server_message_names_address_and_fix() -> None:
    error = mapped(FakeCall(Code.UNAVAILABLE, "failed to connect to all addresses"), "db1:7070")
    assert isinstance(error, errors.UnavailableError)
    assert "cannot reach the troth server at db1:7070" in str(error)
    assert "failed to connect to all addresses" in str(error)
    assert "troth serve" in str(error)


def test_foreign_error_info_domain_is_not_mistaken_for_ours() -> None:
    error = mapped(
        rich_error(
            Code.FAILED_PRECONDITION, "mesh says no", "ALREADY_SETTLED", domain="mesh.example"
        )
    )
    assert type(error) is errors.FailedPreconditionError
    assert error.reason == ""


def test_inconsistent_rich_status_is_ignored() -> None:
    # grpcio-status refuses details whose message differs from the call's;
    # the call itself still maps by code rather than failing the mapping.
    exc = rich_error(
        Code.FAILED_PRECONDITION, "call message", "ALREADY_SETTLED", status_message="x"
    )
    error = mapped(exc)
    assert type(error) is errors.FailedPreconditionError
    assert error.message == "call message"


def test_bare_rpc_error_becomes_unknown() -> None:
    error = mapped(grpc.RpcError("interceptor failed"))
    assert type(error) is errors.RpcError
    assert error.code is Code.UNKNOWN
    assert "interceptor failed" in str(error)


def test_other_exceptions_pass_through() -> None:
    with pytest.raises(KeyError), map_rpc_errors():
        raise KeyError("x")


ALL_RPC_ERRORS = [
    errors.RpcError,
    errors.NotFoundError,
    errors.AlreadyExistsError,
    errors.FailedPreconditionError,
    errors.AlreadySettledError,
    errors.PromiseTimedOutError,
    errors.LeaseLostError,
    errors.InvalidArgumentError,
    errors.UnauthenticatedError,
    errors.PermissionDeniedError,
    errors.ResourceExhaustedError,
    errors.UnavailableError,
    errors.DeadlineExceededError,
]


@pytest.mark.parametrize("cls", ALL_RPC_ERRORS)
def test_rpc_errors_pickle_round_trip(cls: type[errors.RpcError]) -> None:
    original = cls(
        Code.FAILED_PRECONDITION,
        "ALREADY_SETTLED",
        "it was settled",
        {"field": "id", "promise_id": "p"},
    )
    copy = pickle.loads(pickle.dumps(original))
    assert type(copy) is cls
    assert (copy.code, copy.reason, copy.message, copy.metadata) == (
        original.code,
        original.reason,
        original.message,
        original.metadata,
    )
    assert str(copy) == str(original)
    assert vars(copy) == vars(original)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ({"reason": "off-topic", "by": "ed"}, "off-topic"),  # `troth approvals reject --reason`
        ({"message": "no"}, {"message": "no"}),
        ("too late", "too late"),
        (None, None),
    ],
)
def test_a_rejection_s_reason_is_the_reason_field_or_the_whole_value(
    value: Any, reason: Any
) -> None:
    assert errors.Rejected is errors.PromiseRejectedError
    assert errors.TimedOut is errors.PromiseTimedOutError
    assert errors.Rejected("approval-1", value).reason == reason


def test_configuration_error_pickles_and_reads_well() -> None:
    original = errors.ConfigurationError("timeout=-1 must be positive")
    copy = pickle.loads(pickle.dumps(original))
    assert type(copy) is errors.ConfigurationError
    assert str(copy) == "timeout=-1 must be positive" == copy.message


# --- retries ----------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def transport(clock: FakeClock) -> Iterator[Transport]:
    t = Transport("127.0.0.1:7070", sleep=clock.sleep, clock=clock)
    yield t
    t.close()


class Scripted:
    """A stand-in stub method: raises the scripted errors in turn, then answers."""

    def __init__(self, *failures: grpc.RpcError, answer: object = "ok") -> None:
        self.failures = list(failures)
        self.answer = answer
        self.calls: list[dict[str, Any]] = []

    def __call__(self, request: object, **kwargs: Any) -> object:
        self.calls.append(kwargs)
        if self.failures:
            raise self.failures.pop(0)
        return self.answer


def unavailable() -> FakeCall:
    return FakeCall(Code.UNAVAILABLE, "connection refused")


def test_retries_unavailable_with_growing_backoff(transport: Transport, clock: FakeClock) -> None:
    method = Scripted(unavailable(), unavailable(), unavailable())
    assert transport.call(method, object(), timeout=10.0) == "ok"  # type: ignore[arg-type]
    assert len(method.calls) == 4
    assert len(clock.sleeps) == 3
    policy = transport.retry
    for attempt, slept in enumerate(clock.sleeps, start=1):
        ceiling = min(
            policy.max_backoff, policy.initial_backoff * policy.multiplier ** (attempt - 1)
        )
        assert ceiling / 2 <= slept <= ceiling
    # Each attempt gets only what is left of the overall timeout.
    timeouts = [call["timeout"] for call in method.calls]
    assert timeouts == sorted(timeouts, reverse=True)
    assert timeouts[0] == pytest.approx(10.0)


def test_gives_up_after_max_attempts(transport: Transport) -> None:
    method = Scripted(*(unavailable() for _ in range(20)))
    with pytest.raises(errors.UnavailableError):
        transport.call(method, object(), timeout=60.0)  # type: ignore[arg-type]
    assert len(method.calls) == transport.retry.max_attempts


def test_a_broken_stream_reconnects_for_the_reconnect_window(
    transport: Transport, clock: FakeClock
) -> None:
    # What `Client.watch` and `Client.watch_promises` both go by.
    policy = transport.retry
    # Never in place (a wrong address...): as few attempts as any call.
    first = policy.max_attempts - 1
    assert transport.reconnect_delay(unavailable(), first, None, outage_start=None) is not None
    assert transport.reconnect_delay(unavailable(), first + 1, None, outage_start=None) is None
    # In place, then broken: attempts do not count; the time since it broke does.
    broke = clock.now
    many = policy.max_attempts * 10
    clock.now = broke + policy.reconnect_window - 1
    assert transport.reconnect_delay(unavailable(), many, None, outage_start=broke) is not None
    clock.now = broke + policy.reconnect_window
    assert transport.reconnect_delay(unavailable(), many, None, outage_start=broke) is None


def test_non_idempotent_calls_are_not_retried(transport: Transport) -> None:
    method = Scripted(unavailable())
    with pytest.raises(errors.UnavailableError):
        transport.call(method, object(), timeout=10.0, idempotent=False)  # type: ignore[arg-type]
    assert len(method.calls) == 1


@pytest.mark.parametrize("code", [Code.NOT_FOUND, Code.FAILED_PRECONDITION, Code.INVALID_ARGUMENT])
def test_definite_answers_are_not_retried(transport: Transport, code: grpc.StatusCode) -> None:
    method = Scripted(FakeCall(code, "no"))
    with pytest.raises(errors.RpcError):
        transport.call(method, object(), timeout=10.0)  # type: ignore[arg-type]
    assert len(method.calls) == 1


def test_retries_never_outlive_the_deadline(transport: Transport, clock: FakeClock) -> None:
    method = Scripted(*(unavailable() for _ in range(20)))
    with pytest.raises(errors.UnavailableError):
        transport.call(method, object(), timeout=0.25)  # type: ignore[arg-type]
    assert clock.now - 100.0 < 0.25


def test_deadline_spent_reconnecting_reads_as_unreachable(transport: Transport) -> None:
    # Seen in CI: the first attempt is refused, the retry is still connecting
    # when the deadline runs out. The user's problem is an unreachable server.
    method = Scripted(
        unavailable(), *(FakeCall(Code.DEADLINE_EXCEEDED, "Deadline Exceeded") for _ in range(20))
    )
    with pytest.raises(errors.UnavailableError, match="cannot reach the troth server"):
        transport.call(method, object(), timeout=10.0)  # type: ignore[arg-type]


def test_a_slow_server_still_reads_as_a_timeout(transport: Transport) -> None:
    method = Scripted(*(FakeCall(Code.DEADLINE_EXCEEDED, "Deadline Exceeded") for _ in range(20)))
    with pytest.raises(errors.DeadlineExceededError):
        transport.call(method, object(), timeout=10.0)  # type: ignore[arg-type]


def test_server_side_deadline_exceeded_is_retried(transport: Transport) -> None:
    method = Scripted(rich_error(Code.DEADLINE_EXCEEDED, "store slow", Reason.INTERNAL))
    assert transport.call(method, object(), timeout=10.0) == "ok"  # type: ignore[arg-type]


def test_principal_travels_as_metadata(clock: FakeClock) -> None:
    t = Transport("127.0.0.1:7070", principal="alice", sleep=clock.sleep, clock=clock)
    try:
        method = Scripted()
        t.call(method, object(), timeout=1.0)  # type: ignore[arg-type]
        assert method.calls[0]["metadata"] == (
            ("troth-principal", "alice"),
            ("troth-timeout-ms", "1000"),
        )
    finally:
        t.close()


def test_each_attempt_says_its_timeout_so_the_server_can_tell_how_long_it_waited(
    transport: Transport, clock: FakeClock
) -> None:
    method = Scripted(rich_error(Code.UNAVAILABLE, "restarting", Reason.STORE_UNAVAILABLE))
    assert transport.call(method, object(), timeout=10.0) == "ok"  # type: ignore[arg-type]
    sent = [dict(call["metadata"])["troth-timeout-ms"] for call in method.calls]
    timeouts = [call["timeout"] for call in method.calls]
    # What is left of the deadline, as gRPC is given it, attempt by attempt.
    assert sent == [str(round(t * 1000)) for t in timeouts] and timeouts[1] < timeouts[0]
    method = Scripted()
    transport.call(method, object(), timeout=None)  # type: ignore[arg-type]
    assert "troth-timeout-ms" not in dict(method.calls[0]["metadata"])  # no deadline, no wait known


def test_backoff_is_capped() -> None:
    policy = RetryPolicy(initial_backoff=1.0, max_backoff=2.0, multiplier=10.0)
    assert all(1.0 <= policy.backoff(n) <= 2.0 for n in range(2, 10))


@pytest.mark.parametrize("address", ["", " 127.0.0.1:7070"])
def test_bad_address_is_a_configuration_error(address: str) -> None:
    with pytest.raises(errors.ConfigurationError, match="host:port"):
        Transport(address)
