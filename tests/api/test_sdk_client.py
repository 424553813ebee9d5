"""The SDK Client and the `troth` CLI against a real server: the contract as a user meets it."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from troth import (
    AlreadyExistsError,
    AlreadySettledError,
    Client,
    DeadlineExceededError,
    InvalidArgumentError,
    NotFoundError,
    PromiseState,
    PromiseTimedOutError,
    UnavailableError,
    _events,
)
from troth._cli import main
from troth._transport import lacks_method
from troth.v1 import promises_pb2 as pb

if TYPE_CHECKING:
    from _support import ServerProcess


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.address, principal="tester") as c:
        yield c


def test_create_get_and_repeat(client: Client) -> None:
    before = datetime.now(UTC)
    result = client.create("sdk.a", {"post": 7}, tags={"team": "x"}, ttl=timedelta(hours=1))
    assert result.created
    promise = result.promise
    assert promise.state is PromiseState.PENDING
    assert client.decode(promise.param) == {"post": 7}
    assert promise.expire_time is not None
    assert promise.expire_time - before >= timedelta(minutes=59)
    assert client.get("sdk.a") == promise

    again = client.create("sdk.a", {"post": 7}, tags={"team": "x"}, ttl=timedelta(hours=1))
    assert not again.created
    assert again.promise.id == "sdk.a"
    with pytest.raises(AlreadyExistsError):
        client.create("sdk.a", {"post": 8})


def test_never_expires_and_expire_time(client: Client) -> None:
    assert client.create("sdk.never", never_expires=True).promise.expire_time is None
    at = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    assert client.create("sdk.at", expire_time=at).promise.expire_time == at


def test_settle_once_and_repeat_with_key(client: Client) -> None:
    client.create("sdk.s")
    won = client.resolve("sdk.s", {"approved": True}, idempotency_key="click-1")
    assert won.applied
    assert won.promise.state is PromiseState.RESOLVED
    assert client.decode(won.promise.value) == {"approved": True}
    assert won.promise.settled_by == "tester"
    assert won.promise.settle_time is not None

    repeat = client.resolve("sdk.s", {"approved": True}, idempotency_key="click-1")
    assert not repeat.applied
    with pytest.raises(AlreadySettledError) as caught:
        client.reject("sdk.s", "too late")
    assert caught.value.promise_id == "sdk.s"
    assert "resolved" in str(caught.value).lower()


def test_cancel_with_generated_key(client: Client) -> None:
    client.create("sdk.c")
    result = client.cancel("sdk.c")
    assert result.applied
    assert result.promise.state is PromiseState.REJECTED_CANCELED
    assert len(result.promise.idempotency_key_for_settle) == 32


def test_settling_an_expired_promise(client: Client) -> None:
    client.create("sdk.exp", ttl=timedelta(milliseconds=100))
    settled = client.wait("sdk.exp", timeout=10)
    assert settled.state is PromiseState.REJECTED_TIMEDOUT
    with pytest.raises(PromiseTimedOutError):
        client.resolve("sdk.exp")


def test_errors_name_what_was_wrong(client: Client) -> None:
    with pytest.raises(NotFoundError, match=r"sdk\.missing"):
        client.get("sdk.missing")
    with pytest.raises(InvalidArgumentError) as caught:
        client.create("bad id with spaces")
    assert caught.value.field == "id"
    with pytest.raises(InvalidArgumentError) as caught:
        client.create("sdk.neg", ttl=timedelta(seconds=-1))
    assert caught.value.field == "ttl"


def test_wait_returns_the_settled_promise(client: Client) -> None:
    client.create("sdk.w")
    seen: list[PromiseState] = []
    watcher = threading.Thread(
        target=lambda: seen.extend(p.state for p in client.watch("sdk.w", timeout=10))
    )
    watcher.start()
    settled_by_other = threading.Timer(0.2, lambda: client.resolve("sdk.w", [1, 2]))
    settled_by_other.start()
    try:
        promise = client.wait("sdk.w", timeout=10)
    finally:
        settled_by_other.join()
        watcher.join(10)
    assert promise.state is PromiseState.RESOLVED
    assert client.decode(promise.value) == [1, 2]
    assert seen[-1] is PromiseState.RESOLVED
    assert len(seen) in (1, 2)  # pending first, unless the resolve came before the watch


def test_wait_times_out(client: Client) -> None:
    client.create("sdk.slow")
    with pytest.raises(DeadlineExceededError, match=r"did not settle within 0\.3s"):
        client.wait("sdk.slow", timeout=0.3)
    with pytest.raises(TimeoutError):
        client.wait("sdk.slow", timeout=0.1)


def test_a_wait_longer_than_one_call_is_several_calls_on_the_stream(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each WaitPromise waits at most WAIT_CALL_S; made short here, a wait of a few
    # of them calls again, pending, until the settle comes.
    monkeypatch.setattr(_events, "WAIT_CALL_S", 0.2)
    client.create("sdk.several")
    settle = threading.Timer(1.0, lambda: client.resolve("sdk.several", "late"))
    settle.start()
    try:
        promise = client.wait("sdk.several", timeout=20)
    finally:
        settle.join()
    assert client.decode(promise.value) == "late"
    assert client._transport.calls is not None and not client._transport.calls.unsupported


def test_a_wait_on_a_client_the_server_answered_is_one_call(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client whose Calls stream the server has taken knows the server is there: its
    wait for a result is one long call, not a call answered at once and then another."""
    client.create("sdk.one-wait")  # the stream is open and answered
    transport = client._transport
    made: list[float] = []
    stub = transport.promises
    unwrapped = stub.WaitPromise

    def counted(request: pb.WaitPromiseRequest, **kwargs: Any) -> Any:
        made.append(request.wait.ToMilliseconds() / 1000)
        return unwrapped(request, **kwargs)

    monkeypatch.setattr(stub, "WaitPromise", counted, raising=False)
    settle = threading.Timer(0.3, lambda: client.resolve("sdk.one-wait", "done"))
    settle.start()
    try:
        promise = client.wait("sdk.one-wait", timeout=20)
    finally:
        settle.join()
    assert client.decode(promise.value) == "done"
    assert len(made) == 1, made
    assert made[0] > 1  # a long poll from the first call


class _Older:
    """A client's stub whose `WaitPromise` names a method the server does not have."""

    def __init__(self, stub: object, wait: Any) -> None:
        self._stub = stub
        self.WaitPromise = wait

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stub, name)


@pytest.mark.parametrize("multiplexed", [True, False], ids=["calls-stream", "unary"])
def test_a_wait_against_a_server_without_wait_promise_watches_instead(
    server: ServerProcess, multiplexed: bool
) -> None:
    """An older server answers a `WaitPromise` UNIMPLEMENTED (unary), or refuses its
    method by name on the `Calls` stream: the wait is then a watch, as before."""
    waited = f"sdk.older-server-{'calls' if multiplexed else 'unary'}"
    with Client(server.address, multiplex_calls=multiplexed) as older:
        older.create(waited)
        transport = older._transport
        wait: Any
        if transport.calls is not None:
            calls = transport.calls

            def wait(request: Any, timeout: float | None = None, metadata: Any = None) -> Any:
                data = request.SerializeToString()
                return calls.invoke("NoSuchWait", data, pb.WaitPromiseResponse, timeout)
        else:
            wait = transport.channel.unary_unary(
                "/troth.v1.PromiseService/NoSuchWait",
                request_serializer=pb.WaitPromiseRequest.SerializeToString,
                response_deserializer=pb.WaitPromiseResponse.FromString,
            )
        stub: Any = _Older(transport.promises, wait)
        with pytest.raises(grpc.RpcError) as caught:
            stub.WaitPromise(pb.WaitPromiseRequest(id=waited), timeout=5)
        assert lacks_method(caught.value)  # type: ignore[arg-type]
        settle = threading.Timer(0.3, lambda: older.resolve(waited, "watched"))
        settle.start()
        try:
            promise = _events.wait_promise(transport, stub, waited, 20)
        finally:
            settle.join()
        assert older.decode(promise.value) == "watched"


def test_search_follows_pages(client: Client) -> None:
    for i in range(5):
        client.create(f"sdk.page-{i}", i, tags={"batch": "p"})
    client.resolve("sdk.page-3")
    ids = [p.id for p in client.search_all("sdk.page-*", page_size=2)]
    assert ids == [f"sdk.page-{i}" for i in range(5)]
    page = client.search("sdk.page-*", page_size=2)
    assert len(page.promises) == 2 and page.next_page_token is not None
    resolved = list(client.search_all(tags={"batch": "p"}, states=[PromiseState.RESOLVED]))
    assert [p.id for p in resolved] == ["sdk.page-3"]


def test_unreachable_server_fails_fast_and_says_so() -> None:
    with (
        Client("127.0.0.1:1", timeout=1.0) as lost,
        pytest.raises(UnavailableError, match=r"cannot reach the troth server at 127\.0\.0\.1:1"),
    ):
        lost.get("x")


def test_cli_round_trip(server: ServerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--server", server.address, "--json"]
    assert main([*base, "promises", "create", "cli.a", "--param", '{"n": 1}', "--ttl", "5m"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert created["created"] is True
    assert created["promise"]["param"] == {"n": 1}

    assert main([*base, "promises", "resolve", "cli.a", "--value", '{"ok": true}']) == 0
    assert json.loads(capsys.readouterr().out)["applied"] is True

    assert main([*base, "promises", "watch", "cli.a"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["state"] for line in lines] == ["RESOLVED"]

    assert main(["--server", server.address, "promises", "search", "cli.*"]) == 0
    table = capsys.readouterr().out
    assert "cli.a" in table and '{"ok":true}' in table

    assert main(["--server", server.address, "promises", "reject", "cli.a"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("troth: error: already settled:")
    assert "Traceback" not in err


_NO_CALL_LEFT_FOR_THE_COLLECTOR = """
import gc, sys
import grpc._channel
from troth import Client
gc.disable()
with Client(sys.argv[1]) as client:
    client.create(sys.argv[2])
    client.get(sys.argv[2])
gc.set_debug(gc.DEBUG_SAVEALL)
gc.collect()
left = [type(o).__name__ for o in gc.garbage if isinstance(o, grpc._channel._Rendezvous)]
print(left)
"""


def test_a_closed_client_leaves_no_grpc_call_for_the_collector(server: ServerProcess) -> None:
    """A process that used a `Client` exits: no gRPC call object of its `Calls` stream is
    left in a reference cycle, for the collector to free at interpreter exit, when
    gRPC's `__del__` could wait forever on a lock a frozen daemon thread holds (seen:
    about one exit in a hundred printed its last line and hung)."""
    script = [sys.executable, "-c", _NO_CALL_LEFT_FOR_THE_COLLECTOR]
    done = subprocess.run(
        [*script, server.address, f"sdk.exit-{uuid.uuid4().hex[:8]}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
