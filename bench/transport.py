"""What a call on one multiplexed stream costs the calling process, by transport.

troth's SDK sends its calls on one `Calls` stream (`troth._mux.CallStream`): a caller
thread queues its request, grpcio's synchronous stream sends it from a thread of its
own, a reader thread matches the answer to a lock the caller waits on. A call so
crosses four threads, and profiles of the worker and the load client put about a third
of their interpreter-lock samples in those hand-offs. The alternative measured here:
the stream on `grpc.aio`, driven by one event-loop thread (the caller hands its request
to the loop, the loop writes it and reads the answer, the caller's lock is released).

Both variants talk to the same echo server (a `grpc.aio` stream that answers each
message with itself, in a process of its own) with `--threads` caller threads calling
in a loop; printed per variant and round: calls per second and the client process's
CPU per call. Rounds alternate the variants.

Usage::

    .venv/bin/python bench/transport.py [--threads 64] [--seconds 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio
from _echo import SERVER_OPTIONS, write_port_file

from troth._transport import channel_options

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

METHOD = "/bench.Echo/Stream"
PAYLOAD = b"x" * 200
"""About a `CallsRequest` carrying a small `CreatePromise`."""


def _same(data: bytes) -> bytes:
    return data


async def _serve(port_file: Path) -> None:
    async def echo(requests: AsyncIterator[bytes], _context: Any) -> AsyncIterator[bytes]:
        async for message in requests:
            yield message

    await serve_on_free_port(
        grpc.method_handlers_generic_handler(
            "bench.Echo", {"Stream": grpc.stream_stream_rpc_method_handler(echo, _same, _same)}
        ),
        port_file,
    )


async def serve_on_free_port(handler: grpc.GenericRpcHandler, port_file: Path) -> None:
    """Serve `handler` with `grpc.aio`, with the troth server's gRPC options, on a free
    local port, written to `port_file`."""
    server = grpc.aio.server(options=SERVER_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    write_port_file(port_file, port)
    await server.wait_for_termination()


def start_server(command: list[str], port_file: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start a process that serves on a free port and writes it to `port_file` (as
    `serve_on_free_port` does); its address once it is written."""
    server = subprocess.Popen(command)
    while not port_file.exists():
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode} before serving")
        time.sleep(0.05)
    return server, f"127.0.0.1:{port_file.read_text().strip()}"


class _Waiter:
    __slots__ = ("answer", "pending")

    def __init__(self) -> None:
        self.pending = threading.Lock()
        self.pending.acquire()
        self.answer = b""


class _Mux:
    """Calls on one stream, answers matched by an 8-byte id."""

    def __init__(self) -> None:
        self.waiting: dict[int, _Waiter] = {}
        self.lock = threading.Lock()
        self.ids = itertools.count(1)

    def answered(self, message: bytes) -> None:
        with self.lock:
            waiter = self.waiting.pop(int.from_bytes(message[:8], "little"))
        waiter.answer = message
        waiter.pending.release()

    def call(self, data: bytes) -> bytes:
        waiter = self.begin(data)
        waiter.pending.acquire()
        return waiter.answer

    def begin(self, data: bytes) -> _Waiter:
        """Send a call; its answer is the waiter's once its `pending` lock is free."""
        call_id = next(self.ids)
        waiter = _Waiter()
        with self.lock:
            self.waiting[call_id] = waiter
        self.send(call_id.to_bytes(8, "little") + data)
        return waiter

    def send(self, message: bytes) -> None:
        raise NotImplementedError


class SyncStream(_Mux):
    """As `CallStream` does it: grpcio's synchronous stream fed from a queue."""

    def __init__(self, address: str, path: str = METHOD) -> None:
        super().__init__()
        self.channel = grpc.insecure_channel(address, options=channel_options())
        method = self.channel.stream_stream(
            path, request_serializer=_same, response_deserializer=_same
        )
        self.outgoing: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self.stream = method(self._requests())
        threading.Thread(target=self._read, daemon=True).start()

    def _requests(self) -> Iterator[bytes]:
        while True:
            yield self.outgoing.get()

    def _read(self) -> None:
        for message in self.stream:
            self.answered(message)

    def send(self, message: bytes) -> None:
        self.outgoing.put(message)


class AioStream(_Mux):
    """The same stream on `grpc.aio`, driven by one event-loop thread."""

    def __init__(self, address: str) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(address, ready), daemon=True).start()
        ready.wait()

    def _run(self, address: str, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._open(address))
        ready.set()
        self.loop.run_forever()

    async def _open(self, address: str) -> None:
        channel = grpc.aio.insecure_channel(address, options=channel_options())
        method = channel.stream_stream(
            METHOD, request_serializer=_same, response_deserializer=_same
        )
        self.stream = method()
        self.outgoing: asyncio.Queue[bytes] = asyncio.Queue()
        # Held: the loop keeps only weak references to its tasks.
        self.tasks = [asyncio.ensure_future(self._write()), asyncio.ensure_future(self._read())]

    async def _write(self) -> None:
        while True:
            await self.stream.write(await self.outgoing.get())

    async def _read(self) -> None:
        while True:
            message = await self.stream.read()
            assert isinstance(message, bytes)
            self.answered(message)

    def send(self, message: bytes) -> None:
        self.loop.call_soon_threadsafe(self.outgoing.put_nowait, message)


VARIANTS = {"sync": SyncStream, "aio": AioStream}


def _client(variant: str, address: str, threads: int, seconds: float) -> None:
    """One round in this process (a fresh one per round): prints `calls/s cpu_us`."""
    mux = VARIANTS[variant](address)
    for _ in range(200):
        mux.call(PAYLOAD)
    stop = time.monotonic() + seconds
    counts = [0] * threads

    def loop(slot: int) -> None:
        while time.monotonic() < stop:
            mux.call(PAYLOAD)
            counts[slot] += 1

    cpu, wall = time.process_time(), time.monotonic()
    callers = [threading.Thread(target=loop, args=(n,)) for n in range(threads)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    calls = sum(counts)
    print(f"{calls / wall:.0f} {1e6 * cpu / calls:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--client", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve))
        return
    if args.client:
        _client(args.client[0], args.client[1], args.threads, args.seconds)
        return
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        server, address = start_server(
            [sys.executable, __file__, "--serve", str(port_file)], port_file
        )
        try:
            figures: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
            for round_ in range(args.rounds):
                for variant in VARIANTS:
                    out = subprocess.run(
                        [sys.executable, __file__, "--client", variant, address,
                         "--threads", str(args.threads), "--seconds", str(args.seconds)],
                        check=True, capture_output=True, text=True,
                    ).stdout.split()  # fmt: skip
                    rate, cpu = float(out[0]), float(out[1])
                    figures[variant].append((rate, cpu))
                    print(f"round {round_ + 1} {variant:4}: {rate:6.0f} calls/s, "
                          f"client CPU {cpu:5.1f} us a call", flush=True)  # fmt: skip
        finally:
            server.terminate()
            server.wait()
    for variant, runs in figures.items():
        rate = statistics.median(r for r, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"median {variant:4}: {rate:6.0f} calls/s, client CPU {cpu:5.1f} us a call")


if __name__ == "__main__":
    main()
