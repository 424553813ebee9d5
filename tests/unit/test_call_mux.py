"""The server's `Calls` stream (`api/_mux.CallMux`) in process, without a network: its
calls' `--max-concurrent-rpcs` slots come back however the stream ends, and it serves
exactly the calls the SDK sends on it."""

from __future__ import annotations

import asyncio
import types
from typing import Any

from troth._mux import MULTIPLEXED
from troth.v1 import tasks_pb2
from troth_server.api._admission import Admission
from troth_server.api._mux import WORKER_CALLS, CallMux
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
    assert set(MULTIPLEXED) == set(WORKER_CALLS)


def test_calls_cancelled_before_they_ran_give_their_slots_back() -> None:
    """A stream that ends (its caller gone) while its calls are created but not yet
    started: each call's slot must come back, though its task never ran."""
    admission = Admission.with_limits(8, 8)
    servicer = types.SimpleNamespace(**{name: None for name in WORKER_CALLS})
    mux = CallMux(((PROMISES, servicer), (TASKS, servicer)), Limits(), admission)

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
