"""Idle streams outlive the server's ping-strike window: an idle worker, an idle
`WatchPromises` stream and an idle console-like `Client.watch_promises` stream are
held well past it, and none is cut off (issue 27: the server set a key gRPC does not
know, kept gRPC's 5-minute minimum between pings, and answered the SDK's pings every
minute with `GOAWAY ... too_many_pings`; each idle stream broke every ~5 minutes).

The windows are shortened so that this takes seconds: the SDK pings every `PING_MS`
(a private knob, `troth._grpc_args.PING_INTERVAL_MS`), the server permits pings every
`WINDOW` (`--keepalive-min-ping-interval`). Were the server's setting lost (a misspelt
key, as before), gRPC's 5-minute minimum would strike every ping after the first and
send GOAWAY on the fourth, some 4 s in: `HOLD_S` is twice that.

The worker is a real subprocess: this file, run as a script
(`python test_keepalive.py ADDRESS`).
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
import uuid
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from troth import Client, Context, PromiseEvent, Worker, _grpc_args
from troth._transport import channel_options
from troth.v1 import promises_pb2, promises_pb2_grpc

sys.path.insert(0, str(Path(__file__).parent.parent))

from _support import start_server
from _workers import WorkerFleet

if TYPE_CHECKING:
    import pytest

GROUP = "keepalive"
PING_MS = 1000
WINDOW = "500ms"
HOLD_S = 8.0


def still_here(ctx: Context, name: str) -> Generator[Any, Any, str]:
    """A workflow the idle worker runs after the hold: its task stream still delivers."""
    now = yield ctx.now()
    return f"{name} at {now:%H:%M}"


# -- the worker process (run as a script) ------------------------------------------------


def main(address: str) -> None:
    _grpc_args.PING_INTERVAL_MS = PING_MS
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with Client(address, timeout=5) as client:
        worker = Worker(client, group=GROUP)
        worker.workflow(still_here)
        worker.run()


if __name__ == "__main__":
    main(sys.argv[1])


# -- the test ------------------------------------------------------------------------------


class Reader:
    """Reads a stream on a thread: what it gave, and how it ended (if it did)."""

    def __init__(self, stream: Any) -> None:
        self.items: queue.Queue[Any] = queue.Queue()
        self.ended: BaseException | str | None = None
        self._stream = stream
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for item in self._stream:
                self.items.put(item)
            self.ended = "the stream ended"
        except BaseException as exc:  # what broke it, for the assertion's message
            self.ended = exc

    def next_within(self, seconds: float) -> Any:
        try:
            return self.items.get(timeout=seconds)
        except queue.Empty:
            raise AssertionError(f"nothing within {seconds:g} s (ended: {self.ended})") from None


def test_an_idle_worker_watch_and_console_stream_outlive_the_strike_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    server = start_server(tmp_path / "server", "--keepalive-min-ping-interval", WINDOW)
    # This process's channels ping as often as the worker's.
    monkeypatch.setattr(_grpc_args, "PING_INTERVAL_MS", PING_MS)
    assert dict(channel_options())[_grpc_args.ARG_KEEPALIVE_TIME_MS] == PING_MS
    fleet = WorkerFleet(tmp_path, __file__, server.address)
    prefix = f"kept-{uuid.uuid4().hex[:6]}-"
    try:
        worker = fleet.start()
        fleet.eventually(lambda: "polling group" in fleet.log(worker), 30, "the worker to poll")

        # A raw WatchPromises stream (what `troth promises watch` reads), on a channel
        # with the SDK's options.
        channel = grpc.insecure_channel(server.address, options=channel_options())
        stub = promises_pb2_grpc.PromiseServiceStub(channel)  # type: ignore[no-untyped-call]
        raw = Reader(stub.WatchPromises(promises_pb2.WatchPromisesRequest(id=f"{prefix}*")))
        # The console's live pages: Client.watch_promises, which reconnects by itself.
        reconnects: list[float] = []
        client = Client(server.address, timeout=10)
        caplog.set_level(logging.WARNING, logger="troth.client")
        console = client.watch_promises(
            f"{prefix}*", on_reconnect=lambda: reconnects.append(time.monotonic())
        )
        events = Reader(console)

        time.sleep(HOLD_S)  # idle: no data either way, only pings

        client.create(f"{prefix}1")
        created = raw.next_within(10)
        assert created.promise.id == f"{prefix}1", created
        event: PromiseEvent = events.next_within(10)
        assert event.promise.id == f"{prefix}1"
        handle = client.start("still_here", "idle", id=f"{prefix}wf", group=GROUP)
        assert handle.result(timeout=30).startswith("idle at ")

        assert raw.ended is None, f"the raw watch broke: {raw.ended}"
        assert events.ended is None, f"the console's watch broke: {events.ended}"
        assert reconnects == [], "the console's watch reconnected"
        broke = [r.getMessage() for r in caplog.records if "broke" in r.getMessage()]
        assert broke == [], broke
        log = fleet.log(worker)
        assert "lost its task stream" not in log, log[-4000:]
        assert "too_many_pings" not in log, log[-4000:]
        console.close()
        channel.close()
        client.close()
    finally:
        fleet.stop_all()
        server.stop()
