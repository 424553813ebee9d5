"""The SDK's retry policy as pure functions (`troth._backoff`), and the transport applying
it to overload refusals: RetryInfo honoured, jitter bounded, deadline respected, and an
error that says how long it tried when it gives up."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from hypothesis import given
from hypothesis import strategies as st
from test_sdk_errors import Code, FakeCall, FakeClock, Scripted, mapped, rich_error

from troth import errors
from troth._backoff import SERVER_JITTER, RetryPolicy, backoff, retry_delay
from troth._transport import Transport, overload_delay
from troth.errors import ERROR_DOMAIN, Reason

policies = st.builds(
    RetryPolicy,
    max_attempts=st.integers(1, 20),
    initial_backoff=st.floats(0.001, 2.0),
    max_backoff=st.floats(0.01, 30.0),
    multiplier=st.floats(1.0, 4.0),
    overload_attempts=st.integers(1, 100),
)
attempts = st.integers(1, 60)
server_delays = st.none() | st.floats(0.0, 20.0)
unit = st.floats(0.0, 1.0)


def fixed(u: float) -> Any:
    """A `uniform` that always picks the point `u` (0..1) of its interval."""
    return lambda low, high: low + (high - low) * u


def ceiling(policy: RetryPolicy, attempt: int) -> float:
    return min(policy.max_backoff, policy.initial_backoff * policy.multiplier ** (attempt - 1))


@given(policies, attempts, unit)
def test_backoff_is_the_exponential_ceiling_jittered_down_by_at_most_half(
    policy: RetryPolicy, attempt: int, u: float
) -> None:
    delay = backoff(policy, attempt, uniform=fixed(u))
    top = ceiling(policy, attempt)
    assert top / 2 - 1e-9 <= delay <= top + 1e-9


@given(policies, attempts)
def test_the_ceiling_grows_with_attempts_up_to_max_backoff(
    policy: RetryPolicy, attempt: int
) -> None:
    at_top = fixed(1.0)
    assert backoff(policy, attempt, uniform=at_top) <= (
        backoff(policy, attempt + 1, uniform=at_top) + 1e-9
    )
    assert backoff(policy, attempt, uniform=at_top) <= policy.max_backoff + 1e-9


@given(policies, attempts, st.floats(0.001, 20.0), unit)
def test_a_server_delay_is_never_shortened_and_jittered_up_by_at_most_half(
    policy: RetryPolicy, attempt: int, asked: float, u: float
) -> None:
    delay = backoff(policy, attempt, server_delay=asked, uniform=fixed(u))
    assert delay >= asked - 1e-9
    assert delay <= max(ceiling(policy, attempt), asked * (1 + SERVER_JITTER)) + 1e-9


@given(policies, attempts, st.booleans(), server_delays, st.none() | st.floats(0.0, 60.0), unit)
def test_no_retry_starts_that_would_not_finish_before_the_deadline(
    policy: RetryPolicy,
    attempt: int,
    overloaded: bool,
    asked: float | None,
    remaining: float | None,
    u: float,
) -> None:
    delay = retry_delay(
        policy, attempt, overloaded=overloaded, server_delay=asked, remaining=remaining,
        uniform=fixed(u),
    )  # fmt: skip
    if delay is not None and remaining is not None:
        assert delay < remaining
    cap = policy.overload_attempts if overloaded else policy.max_attempts
    if attempt >= cap:
        assert delay is None
    elif remaining is None:
        assert delay == backoff(policy, attempt, server_delay=asked, uniform=fixed(u))


@given(policies, attempts, st.booleans())
def test_limit_attempts_false_leaves_only_the_deadline(
    policy: RetryPolicy, attempt: int, overloaded: bool
) -> None:
    delay = retry_delay(policy, attempt, overloaded=overloaded, limit_attempts=False)
    assert delay is not None


def test_overload_refusals_get_more_attempts_than_an_unreachable_server() -> None:
    policy = RetryPolicy()
    assert policy.overload_attempts > policy.max_attempts
    attempt = policy.max_attempts
    assert retry_delay(policy, attempt, overloaded=False) is None
    assert retry_delay(policy, attempt, overloaded=True) is not None


# -- the transport applies it ---------------------------------------------------------------


def overloaded(delay_ms: int | None = 300, *, reason: str | None = Reason.OVERLOADED) -> FakeCall:
    """RESOURCE_EXHAUSTED as the server sends it for a refusal: ErrorInfo + RetryInfo."""
    status = status_pb2.Status(code=Code.RESOURCE_EXHAUSTED.value[0], message="overloaded")
    if reason is not None:
        info = error_details_pb2.ErrorInfo(
            reason=reason, domain=ERROR_DOMAIN, metadata={"limit": "max-concurrent-rpcs"}
        )
        status.details.add().Pack(info)
    if delay_ms is not None:
        retry = error_details_pb2.RetryInfo()
        retry.retry_delay.FromMilliseconds(delay_ms)
        status.details.add().Pack(retry)
    trailing = (("grpc-status-details-bin", status.SerializeToString()),)
    return FakeCall(Code.RESOURCE_EXHAUSTED, "overloaded", trailing)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def transport(clock: FakeClock) -> Iterator[Transport]:
    t = Transport("127.0.0.1:7070", sleep=clock.sleep, clock=clock)
    yield t
    t.close()


def test_the_retry_info_delay_is_read() -> None:
    assert overload_delay(overloaded(300)) == pytest.approx(0.3)
    assert overload_delay(overloaded(None)) == 0.0  # OVERLOADED without a delay
    assert overload_delay(overloaded(250, reason=None)) == pytest.approx(0.25)
    # gRPC's own RESOURCE_EXHAUSTED (a message over its size limit) would repeat: not ours.
    assert overload_delay(FakeCall(Code.RESOURCE_EXHAUSTED, "message too large")) is None
    assert overload_delay(FakeCall(Code.UNAVAILABLE, "down")) is None


def test_an_overload_refusal_is_retried_after_the_servers_delay(
    transport: Transport, clock: FakeClock
) -> None:
    method = Scripted(*(overloaded(400) for _ in range(10)))
    assert transport.call(method, object(), timeout=60.0) == "ok"  # type: ignore[arg-type]
    assert len(method.calls) == 11
    assert all(0.4 <= slept <= max(0.6, transport.retry.max_backoff) for slept in clock.sleeps)
    # More attempts than an unreachable server gets: the server is there, and asks.
    assert len(method.calls) > transport.retry.max_attempts


def test_an_overload_refusal_is_retried_even_for_a_call_that_is_not_idempotent(
    transport: Transport,
) -> None:
    # The server refused before doing anything: repeating cannot apply it twice.
    method = Scripted(overloaded(100), overloaded(100))
    assert transport.call(method, object(), timeout=10.0, idempotent=False) == "ok"  # type: ignore[arg-type]
    assert len(method.calls) == 3


@pytest.mark.parametrize(
    "failure",
    [
        FakeCall(Code.RESOURCE_EXHAUSTED, "Received message larger than max"),
        rich_error(Code.RESOURCE_EXHAUSTED, "watch fell behind", Reason.RESOURCE_EXHAUSTED),
        rich_error(Code.INVALID_ARGUMENT, "id: bad", Reason.INVALID_ARGUMENT, {"field": "id"}),
    ],
)
def test_client_mistakes_and_other_exhaustion_are_not_retried(
    transport: Transport, failure: FakeCall
) -> None:
    method = Scripted(failure)
    with pytest.raises(errors.RpcError) as caught:
        transport.call(method, object(), timeout=10.0)  # type: ignore[arg-type]
    assert len(method.calls) == 1
    assert caught.value.attempts == 1
    assert "gave up" not in str(caught.value)


def test_giving_up_at_the_deadline_says_how_many_attempts_over_how_long(
    transport: Transport, clock: FakeClock
) -> None:
    method = Scripted(*(overloaded(1000) for _ in range(100)))
    with pytest.raises(errors.OverloadedError) as caught:
        transport.call(method, object(), timeout=5.0)  # type: ignore[arg-type]
    error = caught.value
    assert error.attempts == len(method.calls) > 1
    assert 0 < error.retried_for < 5.0
    assert clock.now - 100.0 < 5.0  # never slept past the deadline
    assert error.limit == "max-concurrent-rpcs"
    assert error.retryable
    text = str(error)
    assert f"gave up after {error.attempts} attempts over {error.retried_for:.1f}s" in text
    assert "RESOURCE_EXHAUSTED" in text and "deadline" in text and "[OVERLOADED]" in text


def test_giving_up_after_the_attempts_says_so(transport: Transport) -> None:
    method = Scripted(*(FakeCall(Code.UNAVAILABLE, "connection refused") for _ in range(20)))
    with pytest.raises(errors.UnavailableError) as caught:
        transport.call(method, object(), timeout=600.0)  # type: ignore[arg-type]
    assert caught.value.attempts == transport.retry.max_attempts
    assert "attempts is the retry policy's limit" in str(caught.value)
    assert "UNAVAILABLE" in str(caught.value)


def test_how_it_retried_survives_pickling(transport: Transport) -> None:
    method = Scripted(*(overloaded(1000) for _ in range(100)))
    with pytest.raises(errors.OverloadedError) as caught:
        transport.call(method, object(), timeout=3.0)  # type: ignore[arg-type]
    again = pickle.loads(pickle.dumps(caught.value))
    assert type(again) is errors.OverloadedError
    assert (again.attempts, again.retried_for, again.gave_up, again.limit) == (
        caught.value.attempts, caught.value.retried_for, caught.value.gave_up, "max-concurrent-rpcs"
    )  # fmt: skip
    assert str(again) == str(caught.value)


def test_overloaded_maps_to_its_own_class() -> None:
    error = mapped(overloaded(200))
    assert type(error) is errors.OverloadedError
    assert isinstance(error, errors.ResourceExhaustedError)
    assert error.code is grpc.StatusCode.RESOURCE_EXHAUSTED
