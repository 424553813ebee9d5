"""Worker registry, configuration and Handle outcomes: no server needed (connecting is lazy)."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest

from troth import (
    Cancelled,
    Client,
    Context,
    Handle,
    Payload,
    Promise,
    PromiseRejectedError,
    PromiseState,
    PromiseTimedOutError,
    RegistrationError,
    TrothError,
    Worker,
)
from troth._handle import outcome


@pytest.fixture
def client() -> Iterator[Client]:
    with Client("127.0.0.1:1") as c:  # never contacted
        yield c


def hello(ctx: Context, name: str) -> Generator[Any, Any, str]:
    yield ctx.now()
    return f"hello {name}"


def test_registers_under_the_function_name(client: Client) -> None:
    worker = Worker(client)
    assert worker.workflow(hello) is hello
    assert worker.workflows == {"hello": hello}


def test_registers_under_an_explicit_name(client: Client) -> None:
    worker = Worker(client)

    @worker.workflow(name="greet")
    def anything(ctx: Context) -> Generator[Any, Any, None]:
        yield ctx.now()

    assert worker.workflows == {"greet": anything}


def test_duplicate_name_is_refused_and_names_both(client: Client) -> None:
    worker = Worker(client)
    worker.workflow(hello)

    def other(ctx: Context) -> Generator[Any, Any, None]:
        yield ctx.now()

    with pytest.raises(RegistrationError) as caught:
        worker.workflow(name="hello")(other)
    assert caught.value.name == "hello"
    assert "already registered" in str(caught.value)
    assert "other" in str(caught.value)
    assert isinstance(caught.value, TrothError)
    # Registering the same function again under its name is harmless.
    worker.workflow(hello)


def test_a_plain_function_is_refused(client: Client) -> None:
    worker = Worker(client)

    def not_a_generator(ctx: Context) -> int:
        return 1

    with pytest.raises(RegistrationError, match="not a generator"):
        worker.workflow(not_a_generator)


def test_registration_error_pickles() -> None:
    import pickle

    error = RegistrationError("x", "bad x")
    again = pickle.loads(pickle.dumps(error))
    assert (again.name, again.message, str(again)) == ("x", "bad x", "bad x")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"group": ""},
        {"concurrency": 0},
        {"lease": timedelta(milliseconds=10)},
        {"cache_size": -1},
        {"max_reconnect_backoff": 0.0},
    ],
)
def test_bad_configuration_is_refused(client: Client, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Worker(client, **kwargs)


def test_stop_before_start_and_twice_is_harmless(client: Client) -> None:
    worker = Worker(client)
    worker.stop()
    worker.stop()
    with pytest.raises(RuntimeError, match="starts once"):
        worker.start()


def test_worker_ids_are_unique_by_default(client: Client) -> None:
    assert Worker(client).worker_id != Worker(client).worker_id
    assert Worker(client, worker_id="w-1").worker_id == "w-1"


def _settled(client: Client, state: PromiseState, value: Any) -> Promise:
    now = datetime.now(UTC)
    return Promise(
        id="wf-1",
        state=state,
        param=Payload(),
        value=client.encode(value),
        tags={},
        create_time=now,
        settle_time=now,
    )


def test_handle_outcome_resolved(client: Client) -> None:
    assert outcome(client, _settled(client, PromiseState.RESOLVED, {"a": 1})) == {"a": 1}


def test_handle_outcome_rejected_carries_the_decoded_error(client: Client) -> None:
    error = {"type": "ValueError", "message": "boom"}
    with pytest.raises(PromiseRejectedError) as caught:
        outcome(client, _settled(client, PromiseState.REJECTED, error))
    assert caught.value.promise_id == "wf-1"
    assert caught.value.value == error
    assert "ValueError: boom" in str(caught.value)


def test_handle_outcome_cancelled_and_timed_out(client: Client) -> None:
    with pytest.raises(Cancelled):
        outcome(client, _settled(client, PromiseState.REJECTED_CANCELED, None))
    with pytest.raises(PromiseTimedOutError) as caught:
        outcome(client, _settled(client, PromiseState.REJECTED_TIMEDOUT, None))
    assert caught.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.promise_id == "wf-1"


def test_handle_is_cheap_and_compares_by_id(client: Client) -> None:
    assert client.handle("a") == client.handle("a")
    assert client.handle("a") != client.handle("b")
    assert isinstance(client.handle("a"), Handle)
    assert repr(client.handle("a")) == "Handle('a')"
