"""The server's `Calls` stream (`api/_mux.CallMux`) in process, without a network: its
calls' `--max-concurrent-rpcs` slots come back however the stream ends, and it serves
exactly the calls the SDK sends on it."""

from __future__ import annotations

import asyncio
import time
import types
from typing import Any

import grpc

from troth._mux import MULTIPLEXED
from troth.v1 import tasks_pb2
from troth_server.api._admission import STREAM_FLAG, UNARY_FLAG, Admission, Gate, QueueDelay
from troth_server.api._door import Door
from troth_server.api._mux import STREAM_CALLS, CallMux
from troth_server.app import PROMISES, TASKS
from troth_server.config import Limits


class _StreamContext:
    """What `CallMux.serve` asks of its stream's context (no handler runs here)."""

    def __init__(self, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self.metadata = metadata
        self.sent: list[Any] = []

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    async def send_initial_metadata(self, metadata: Any) -> None:
        self.sent.append(metadata)


def test_the_sdk_sends_on_the_stream_exactly_what_the_server_serves_there() -> None:
    assert set(MULTIPLEXED) == set(STREAM_CALLS)


def test_calls_cancelled_before_they_ran_give_their_slots_back() -> None:
    """A stream that ends (its caller gone) while its calls are created but not yet
    started: each call's slot must come back, though its task never ran."""
    admission = Admission.with_limits(8, 8)
    servicer = types.SimpleNamespace(**{name: None for name in STREAM_CALLS})
    mux = CallMux(((PROMISES, servicer), (TASKS, servicer)), Limits(), Door(None, admission))

    async def requests() -> Any:
        for n in range(5):
            yield tasks_pb2.CallsRequest(id=n, method="Heartbeat", request=b"")
        await asyncio.Event().wait()  # the stream stays open: no more calls

    async def scenario() -> int:
        answers = mux.serve(requests(), context=_StreamContext())  # type: ignore[arg-type]
        first = asyncio.ensure_future(answers.__anext__())
        await asyncio.sleep(0)  # the stream is open: its reader is about to run
        # The caller goes away in the loop iteration where the reader takes the five
        # calls: the stream ends before any of their tasks has run a line.
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        await answers.aclose()
        for _ in range(3):
            await asyncio.sleep(0)
        return admission.unary.in_use

    assert asyncio.run(scenario()) == 0


def test_a_call_on_the_stream_is_refused_while_calls_wait_too_long_to_start() -> None:
    """A client's calls come on the stream too: while unary calls show a standing queue
    (`--max-queue-delay`), a new call on it is refused as its unary RPC would be."""
    queue = QueueDelay(0.5, interval_s=60.0)
    started = time.monotonic() - 61.0  # a whole interval ago: that interval decides now
    for _ in range(queue.min_calls):
        queue.sample(2.0, started)  # every call started then had waited 2 s
    admission = Admission(
        unary=Gate(UNARY_FLAG, 8, "unary calls are in progress", 50),
        streams=Gate(STREAM_FLAG, 8, "streams are open", 1000),
        queue=queue,
    )
    servicer = types.SimpleNamespace(**{name: None for name in STREAM_CALLS})
    mux = CallMux(((PROMISES, servicer), (TASKS, servicer)), Limits(), Door(None, admission))

    async def requests() -> Any:
        yield tasks_pb2.CallsRequest(id=7, method="CreatePromise", request=b"")

    async def scenario() -> list[tasks_pb2.CallsResponse]:
        return [a async for a in mux.serve(requests(), context=_StreamContext())]  # type: ignore[arg-type]

    (answer,) = asyncio.run(scenario())
    assert answer.id == 7
    assert answer.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert "have waited 2.0 s" in answer.message
    assert b"OVERLOADED" in answer.status_details
    assert admission.refused_total == {"CreatePromise": 1}
    assert admission.unary.in_use == 0


def test_a_broken_streams_status_is_restated_with_its_calls_message() -> None:
    """Every call waiting on a stream the server ended fails with the stream's status
    details (its ErrorInfo reason), told with the call's message so the status is
    believed; details that are not a status are dropped, not raised."""
    from google.rpc import error_details_pb2, status_pb2

    from troth._mux import _restated

    status = status_pb2.Status(code=16, message="no token with key id 'k'")
    status.details.add().Pack(error_details_pb2.ErrorInfo(reason="TOKEN_UNKNOWN"))
    told = status_pb2.Status.FromString(_restated(status.SerializeToString(), "broke: no token"))
    assert (told.code, told.message) == (16, "broke: no token")
    assert told.details == status.details
    assert _restated(b"\xff\xff not a status", "x") == b""
    assert _restated(None, "x") == b""
