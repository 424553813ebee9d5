"""Overload is an answer (issue 10, "Drops load silently"): a burst beyond what the
server takes is answered RESOURCE_EXHAUSTED with an ErrorInfo reason and a RetryInfo
delay, never CANCELLED; refusals are counted per RPC and logged once a second; health
answers throughout; and the SDK's retries get every call through.

The root cause of the CANCELLED answers: gRPC core keeps the calls that arrived but
that grpc.aio has not yet asked for in a backlog it caps (`grpc.server.max_pending_requests`,
default 1000, hard limit 3000) and cancels what is over the cap, silently. A burst of a
few thousand calls arrives faster than the event loop picks them up.
"""

from __future__ import annotations

import asyncio
import collections
import json
import queue
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio
import pytest
from _pg import fresh_schema
from _support import ServerProcess, error_info, start_server
from google.protobuf.duration_pb2 import Duration
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from troth import Client
from troth._grpc_args import ARG_USE_LOCAL_SUBCHANNEL_POOL
from troth.errors import ERROR_DOMAIN, Reason
from troth.v1 import promises_pb2 as pb
from troth.v1 import promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc, types_pb2

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.slow

CHANNELS = 6
BURST = 3000


def _server(factory: pytest.TempPathFactory, backend: str, *args: str) -> Iterator[ServerProcess]:
    with ExitStack() as stack:
        db_url = stack.enter_context(fresh_schema()) if backend == "postgres" else None
        proc = start_server(factory.mktemp("overload"), *args, db_url=db_url)
        yield proc
        assert proc.stop() == 0, f"unclean shutdown:\n{proc.log()[-3000:]}"


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def default_server(
    tmp_path_factory: pytest.TempPathFactory, backend: str
) -> Iterator[ServerProcess]:
    """A server with the default limits, as `troth serve` starts."""
    yield from _server(tmp_path_factory, backend)


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory, backend: str) -> Iterator[ServerProcess]:
    """A server whose limits a test can fill: 8 unary calls, 4 streams at a time."""
    yield from _server(
        tmp_path_factory, backend, "--max-concurrent-rpcs", "8", "--max-streams", "4"
    )


@pytest.fixture(scope="module")
def write_queue_server(
    tmp_path_factory: pytest.TempPathFactory, backend: str
) -> Iterator[ServerProcess]:
    """A server that takes many concurrent calls but queues at most 4 writes."""
    yield from _server(tmp_path_factory, backend, "--max-queued-writes", "4")


def log_records(server: ServerProcess) -> list[dict[str, Any]]:
    return [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]


def refused_counts(server: ServerProcess) -> dict[str, int]:
    """The per-RPC refusal counters, as the server's latest `overload` line gives them."""
    lines = [r for r in log_records(server) if r["event"] == "overload"]
    return dict(lines[-1]["refused_total"]) if lines else {}


def wait_for(predicate: Any, timeout: float = 15, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def retry_info(error: grpc.aio.AioRpcError | grpc.RpcError) -> error_details_pb2.RetryInfo | None:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None
    for detail in status.details:
        info = error_details_pb2.RetryInfo()
        if detail.Unpack(info):
            return info
    return None


def assert_overloaded(error: grpc.aio.AioRpcError | grpc.RpcError, flag: str) -> None:
    """RESOURCE_EXHAUSTED, reason OVERLOADED naming the limit, and a RetryInfo delay."""
    assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, error
    info = error_info(error)  # type: ignore[arg-type]
    assert (info.reason, info.domain) == (Reason.OVERLOADED, ERROR_DOMAIN), info
    assert info.metadata["limit"] == flag, info
    assert flag in (error.details() or ""), error.details()
    delay = retry_info(error)
    assert delay is not None, "no RetryInfo"
    assert 0 < delay.retry_delay.ToMilliseconds() <= 10_000, delay


async def _burst(
    address: str, count: int, make: Any, *, health_checks: int = 0
) -> tuple[collections.Counter[str], list[grpc.aio.AioRpcError], list[float]]:
    """`count` concurrent calls over CHANNELS channels (each its own connection)."""
    options = [(ARG_USE_LOCAL_SUBCHANNEL_POOL, 1)]
    channels = [grpc.aio.insecure_channel(address, options=options) for _ in range(CHANNELS)]
    health = grpc.aio.insecure_channel(address, options=options)
    codes: collections.Counter[str] = collections.Counter()
    refused: list[grpc.aio.AioRpcError] = []
    health_ms: list[float] = []

    async def one(i: int) -> None:
        try:
            await make(channels[i % CHANNELS], i)
            codes["OK"] += 1
        except grpc.aio.AioRpcError as exc:
            codes[exc.code().name] += 1
            if exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED:
                refused.append(exc)

    async def check_health() -> None:
        stub = health_pb2_grpc.HealthStub(health)
        await stub.Check(health_pb2.HealthCheckRequest(), timeout=30)  # warm the channel
        for _ in range(health_checks):
            started = time.perf_counter()
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=30)
            health_ms.append((time.perf_counter() - started) * 1000)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            await asyncio.sleep(0.01)

    try:
        await asyncio.gather(check_health(), *(one(i) for i in range(count)))
    finally:
        for channel in (*channels, health):
            await channel.close()
    return codes, refused, health_ms


def _create(prefix: str) -> Any:
    async def make(channel: grpc.aio.Channel, i: int) -> None:
        stub = promises_pb2_grpc.PromiseServiceStub(channel)
        await stub.CreatePromise(pb.CreatePromiseRequest(id=f"{prefix}-{i}"), timeout=60)

    return make


def _create_or_get(prefix: str) -> Any:
    async def make(channel: grpc.aio.Channel, i: int) -> None:
        stub = promises_pb2_grpc.PromiseServiceStub(channel)
        if i % 2:
            await stub.CreatePromise(pb.CreatePromiseRequest(id=f"{prefix}-{i}"), timeout=60)
        else:
            await stub.GetPromise(pb.GetPromiseRequest(id="overload-known"), timeout=60)

    return make


def test_a_burst_of_3000_calls_is_answered_never_cancelled(default_server: ServerProcess) -> None:
    with default_server.channel() as channel:
        promises_pb2_grpc.PromiseServiceStub(channel).CreatePromise(
            pb.CreatePromiseRequest(id="overload-known")
        )
    codes, refused, health_ms = asyncio.run(
        _burst(default_server.address, BURST, _create_or_get("burst"), health_checks=5)
    )
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}, codes
    assert sum(codes.values()) == BURST
    for error in refused:
        assert_overloaded(error, "max-concurrent-rpcs")
    assert len(health_ms) == 5  # health was answered SERVING during the burst


def test_a_malformed_call_timeout_is_invalid_argument_naming_it(
    default_server: ServerProcess,
) -> None:
    with default_server.channel() as channel:
        stub = promises_pb2_grpc.PromiseServiceStub(channel)
        for bad in ("soon", "-5", "0", "9" * 14):
            with pytest.raises(grpc.RpcError) as info:
                stub.GetPromise(
                    pb.GetPromiseRequest(id="overload-known"),
                    metadata=(("troth-timeout-ms", bad),),
                    timeout=10,
                )
            assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
            assert error_info(info.value).metadata["field"] == "troth-timeout-ms"
        # Well-formed, it is only a measurement: the call is answered as usual.
        stub.CreatePromise(
            pb.CreatePromiseRequest(id="overload-timed"),
            metadata=(("troth-timeout-ms", "10000"),),
            timeout=10,
        )


def test_refusals_carry_retry_info_and_are_counted_and_logged_once_a_second(
    small_server: ServerProcess,
) -> None:
    before = refused_counts(small_server).get("CreatePromise", 0)
    started = time.monotonic()
    codes, refused, health_ms = asyncio.run(
        _burst(small_server.address, 600, _create("small"), health_checks=20)
    )
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}, codes
    assert codes["RESOURCE_EXHAUSTED"] > 0, codes  # 600 at once against a limit of 8
    for error in refused:
        assert_overloaded(error, "max-concurrent-rpcs")
    assert len(health_ms) == 20  # health is never refused by the limit

    # The counters the server keeps per RPC reach its log within a second or so.
    wait_for(
        lambda: (
            refused_counts(small_server).get("CreatePromise", 0) - before
            == codes["RESOURCE_EXHAUSTED"]
        ),
        what="the overload line to count every refusal",
    )
    elapsed = time.monotonic() - started
    records = log_records(small_server)
    overload_lines = [r for r in records if r["event"] == "overload"]
    # Rate-limited: about one line per second, not one per refused call.
    assert len(overload_lines) <= elapsed + 2, (len(overload_lines), elapsed)
    assert overload_lines[-1]["limits"]["max-concurrent-rpcs"] == 8
    refused_rpc_lines = [
        r for r in records if r["event"] == "rpc" and r.get("code") == "RESOURCE_EXHAUSTED"
    ]
    assert refused_rpc_lines == []


def test_streams_have_their_own_limit(small_server: ServerProcess) -> None:
    with small_server.channel() as channel, ExitStack() as stack:
        promises = promises_pb2_grpc.PromiseServiceStub(channel)
        tasks = tasks_pb2_grpc.TaskServiceStub(channel)
        watches = []
        for i in range(4):
            promises.CreatePromise(pb.CreatePromiseRequest(id=f"streamed-{i}"))
            watch = promises.WatchPromise(pb.WatchPromiseRequest(id=f"streamed-{i}"))
            stack.callback(watch.cancel)
            next(watch)  # the promise as it is now: the stream is in place
            watches.append(watch)
        # Every stream slot is taken: a fifth stream is refused, whatever its RPC...
        poll = tasks.Poll(tasks_pb2.PollRequest(group="g", worker_id="w"))
        stack.callback(poll.cancel)
        with pytest.raises(grpc.RpcError) as caught:
            next(poll)
        assert_overloaded(caught.value, "max-streams")
        # ...while unary calls, which have a limit of their own, still go through.
        for i in range(20):
            promises.GetPromise(pb.GetPromiseRequest(id=f"streamed-{i % 4}"))
        # A stream that ends gives its slot back.
        watches[0].cancel()

        def opens() -> bool:
            again = promises.WatchPromise(pb.WatchPromiseRequest(id="streamed-1"))
            try:
                next(again)
                return True
            except grpc.RpcError as exc:
                assert exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                return False
            finally:
                again.cancel()

        wait_for(opens, what="the ended stream's slot to be given back")


def _call(n: int, method: str, request: Any) -> tasks_pb2.CallsRequest:
    return tasks_pb2.CallsRequest(id=n, method=method, request=request.SerializeToString())


def test_waits_take_stream_slots_not_unary_ones(small_server: ServerProcess) -> None:
    """A `WaitPromise` waits as long as a watch: it takes one of the 4 stream slots,
    on the `Calls` stream or as its own RPC, and none of the 8 unary ones."""
    with small_server.channel() as channel, ExitStack() as stack:
        promises = promises_pb2_grpc.PromiseServiceStub(channel)
        tasks = tasks_pb2_grpc.TaskServiceStub(channel)
        promises.CreatePromise(pb.CreatePromiseRequest(id="polled"), timeout=10)
        outgoing: queue.SimpleQueue[tasks_pb2.CallsRequest | None] = queue.SimpleQueue()
        stream = tasks.Calls(iter(outgoing.get, None), timeout=60)
        stack.callback(stream.cancel)
        answers = iter(stream)
        # The stream holds a slot; three waits on it hold the three others.
        long_wait = pb.WaitPromiseRequest(id="polled", wait=Duration(seconds=60))
        waits = _call(1, "WaitPromise", long_wait)
        waits.more.extend(_call(n, "WaitPromise", long_wait) for n in (2, 3))
        outgoing.put(waits)
        # One more wait is refused for the streams' limit, on the stream...
        outgoing.put(_call(4, "WaitPromise", long_wait))
        refused = next(answers)
        assert refused.id == 4 and refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        assert b"max-streams" in refused.status_details
        # ...and as its own RPC.
        with pytest.raises(grpc.RpcError) as caught:
            promises.WaitPromise(long_wait, timeout=10)
        assert_overloaded(caught.value, "max-streams")
        # Eight reads started at once (one message) all pass: the waits hold no
        # unary slot (with them, 3 + 8 would be over the limit of 8).
        reads = _call(10, "GetPromise", pb.GetPromiseRequest(id="polled"))
        reads.more.extend(
            _call(n, "GetPromise", pb.GetPromiseRequest(id="polled")) for n in range(11, 18)
        )
        outgoing.put(reads)
        read_answers = [next(answers) for _ in range(8)]
        for answer in read_answers:
            assert answer.code == 0, answer.message
        assert sorted(a.id for a in read_answers) == list(range(10, 18))
        # The settle answers the three waits.
        promises.ResolvePromise(pb.ResolvePromiseRequest(id="polled"), timeout=10)
        settled = [next(answers) for _ in range(3)]
        assert sorted(a.id for a in settled) == [1, 2, 3]
        for answer in settled:
            reply = pb.WaitPromiseResponse.FromString(answer.response)
            assert reply.promise.state == types_pb2.PROMISE_STATE_RESOLVED
        # Answered, they gave their slots back: a watch opens.
        watch = promises.WatchPromise(pb.WatchPromiseRequest(id="polled"), timeout=10)
        stack.callback(watch.cancel)
        assert next(watch).promise.state == types_pb2.PROMISE_STATE_RESOLVED


def test_unary_calls_cannot_starve_streams(small_server: ServerProcess) -> None:
    async def run() -> None:
        async with grpc.aio.insecure_channel(small_server.address) as channel:
            stub = promises_pb2_grpc.PromiseServiceStub(channel)
            # Made before the flood: on a busy machine a create during it may meet the
            # unary limit, which is the flood's point, not this test's.
            await stub.CreatePromise(pb.CreatePromiseRequest(id="watched-during-flood"))
            flood = asyncio.ensure_future(_burst(small_server.address, 600, _create("starve")))
            await asyncio.sleep(0)
            # Refusals of the flood do not touch the stream slots: the watch opens.
            watch = stub.WatchPromise(pb.WatchPromiseRequest(id="watched-during-flood"))
            first = await watch.read()
            assert first.promise.id == "watched-during-flood"
            watch.cancel()
            await flood

    asyncio.run(run())


def test_queued_writes_have_a_limit(write_queue_server: ServerProcess) -> None:
    codes, refused, _ = asyncio.run(_burst(write_queue_server.address, 1500, _create("queued")))
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}, codes
    assert codes["RESOURCE_EXHAUSTED"] > 0, codes
    for error in refused:
        assert_overloaded(error, "max-queued-writes")
    wait_for(
        lambda: refused_counts(write_queue_server).get("CreatePromise", 0) > 0,
        what="the write refusals to be counted",
    )


def test_the_sdk_retries_until_every_call_succeeds(small_server: ServerProcess) -> None:
    # The SDK's own retry policy, with a generous deadline: the server refuses for
    # as long as the flood lasts, and every call must get through in the end.
    clients = [Client(small_server.address, timeout=60) for _ in range(4)]
    before = refused_counts(small_server).get("CreatePromise", 0)

    def one(i: int) -> str:
        client = clients[i % len(clients)]
        promise = client.create(f"sdk-{i}", {"i": i}).promise
        client.resolve(promise.id, {"done": i})
        return client.get(promise.id).state.value

    try:
        with ThreadPoolExecutor(max_workers=64) as pool:
            states = list(pool.map(one, range(640)))
    finally:
        for client in clients:
            client.close()
    assert states == ["RESOLVED"] * 640
    # The server did refuse calls meanwhile: the retries were needed.
    wait_for(
        lambda: refused_counts(small_server).get("CreatePromise", 0) > before,
        what="refusals of the SDK's creates",
    )
