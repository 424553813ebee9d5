"""What W1's messages alone cost, with no store and no logic: the floor of troth's stack.

A W1 cycle (`make bench-peers`: a workflow starts, its worker suspends it on a human's
promise, the load client settles that promise and reads the result) is, on the wire,
a fixed pattern of calls and deliveries between three Python processes: the load
client, the server and the worker. This script plays that pattern between three
processes that do nothing else: a `grpc.aio` server that answers each call at once
from a dict (no store, no protobuf, no authentication: a few raw bytes a call, handled
inline on its stream's coroutine), a worker and a load client that call it on grpcio's
synchronous streams, multiplexed and batched as the SDK's `troth._mux.CallStream` does
(every call ready at once goes in one message; the server answers and delivers
likewise; the troth server's and the SDK's gRPC options on each side), the worker
reporting a suspension to the client on a Unix datagram as `bench/_workflow_worker.py`
does. What it measures is what the transport costs troth's processes before troth does
any work of its own: a floor for the whole-system CPU of a W1 cycle and a ceiling for
its rate on this machine.

Two shapes of the cycle:

- ``today``: the messages troth's W1-suspend cycle sends now (its rpc log): the client
  starts (a call), settles (a call) and reads the result (a call, answered when the
  workflow completes); the worker gets two deliveries and makes three calls (the human's
  promise, the suspend, the completion): 6 calls and 2 deliveries.
- ``fewest``: the fewest the semantics allow: the start's own call carries the result
  (`Client.execute`), the suspend carries the human's promise: 4 calls and 2
  deliveries.

Printed per shape and round: cycles per second, CPU per cycle of the server, the worker
and the client and their sum, and the cores the machine used (all its processes).
Rounds alternate the shapes; each round starts the three processes afresh.

Usage::

    .venv/bin/python bench/floor.py [--in-flight 64] [--seconds 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _servers import proc_cpu_seconds
from transport import SyncStream, serve_on_free_port, start_server

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

SERVICE = "bench.Floor"
SHAPES = ("today", "fewest")

# One byte of operation after the call's 8-byte id, then the workflow's id.
START, EXECUTE, CREATE, SUSPEND, SETTLE, WAIT, COMPLETE = b"sxcpzwd"
FIRST, SECOND = b"12"  # the delivery's phase, before the workflow's id
OK = b"k"


def _same(data: bytes) -> bytes:
    return data


def _framed(messages: list[bytes]) -> bytes:
    """Several messages in one, each after its 2-byte length: as troth batches the
    calls and answers ready together (`CallsRequest.more`, `PollResponse.more`)."""
    return b"".join(len(m).to_bytes(2, "little") + m for m in messages)


def _frames(data: bytes) -> Iterator[bytes]:
    at = 0
    while at < len(data):
        size = int.from_bytes(data[at : at + 2], "little")
        yield data[at + 2 : at + 2 + size]
        at += 2 + size


class BatchingStream(SyncStream):
    """`SyncStream` sending every call queued at once in one message, as the SDK does."""

    def _requests(self) -> Iterator[bytes]:
        while True:
            ready = [self.outgoing.get()]
            while not self.outgoing.empty():
                ready.append(self.outgoing.get_nowait())
            yield _framed(ready)

    def _read(self) -> None:
        for message in self.stream:
            for answer in _frames(message):
                self.answered(answer)


END = b""
"""Queued last for a `Calls` stream whose caller ended it (a call is never empty)."""


async def _drained(queue: asyncio.Queue[bytes]) -> bytes:
    """Every message queued now, framed as one (END alone if it comes first)."""
    ready = [await queue.get()]
    while not queue.empty() and ready[-1] != END:
        ready.append(queue.get_nowait())
    if ready[-1] == END:
        if len(ready) > 1:
            queue.put_nowait(END)  # after these answers
            ready.pop()
        else:
            return END
    return _framed(ready)


class FloorServer:
    """Answers each call at once; holds a result call until its workflow completes."""

    def __init__(self) -> None:
        self.deliveries: list[asyncio.Queue[bytes]] = []
        self.turn = 0
        self.waiting: dict[bytes, tuple[asyncio.Queue[bytes], bytes]] = {}
        self.completed: set[bytes] = set()

    def deliver(self, message: bytes) -> None:
        self.turn = (self.turn + 1) % len(self.deliveries)
        self.deliveries[self.turn].put_nowait(message)

    def on_call(self, message: bytes, out: asyncio.Queue[bytes]) -> None:
        call_id, op, workflow = message[:8], message[8], message[9:]
        if op == START:
            self.deliver(bytes([FIRST]) + workflow)
        elif op == EXECUTE:
            self.deliver(bytes([FIRST]) + workflow)
            self.waiting[workflow] = (out, call_id)
            return
        elif op == SETTLE:
            self.deliver(bytes([SECOND]) + workflow)
        elif op == WAIT:
            if workflow not in self.completed:
                self.waiting[workflow] = (out, call_id)
                return
            self.completed.discard(workflow)
        elif op == COMPLETE:
            held = self.waiting.pop(workflow, None)
            if held is None:
                self.completed.add(workflow)
            else:
                held[0].put_nowait(held[1] + OK)
        out.put_nowait(call_id + OK)

    async def calls(self, requests: AsyncIterator[bytes], _context: Any) -> AsyncIterator[bytes]:
        out: asyncio.Queue[bytes] = asyncio.Queue()

        async def read() -> None:
            async for message in requests:
                for call in _frames(message):
                    self.on_call(call, out)
            out.put_nowait(END)

        reader = asyncio.ensure_future(read())
        while (answers := await _drained(out)) != END:
            yield answers
        await reader

    async def tasks(self, _request: bytes, _context: Any) -> AsyncIterator[bytes]:
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        self.deliveries.append(queue)
        while True:
            yield await _drained(queue)


async def _serve(port_file: Path) -> None:
    floor = FloorServer()
    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Calls": grpc.stream_stream_rpc_method_handler(floor.calls, _same, _same),
            "Tasks": grpc.unary_stream_rpc_method_handler(floor.tasks, _same, _same),
        },
    )
    await serve_on_free_port(handler, port_file)


def _work(shape: str, address: str, notify: str) -> None:
    """The worker: each delivery on a pool thread, its calls on one multiplexed stream."""
    calls = BatchingStream(address, f"/{SERVICE}/Calls")
    # One channel for both streams, as a troth worker has.
    tasks: Iterator[bytes] = calls.channel.unary_stream(
        f"/{SERVICE}/Tasks", request_serializer=_same, response_deserializer=_same
    )(b"")
    pool = ThreadPoolExecutor(max_workers=64)
    report = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

    def run(delivery: bytes) -> None:
        workflow = delivery[1:]
        if delivery[0] == FIRST:
            if shape == "today":
                calls.call(bytes([CREATE]) + workflow)
            calls.call(bytes([SUSPEND]) + workflow)
            report.sendto(workflow, notify)
        else:
            calls.call(bytes([COMPLETE]) + workflow)

    calls.call(bytes([CREATE]) + b"-")  # the channel is up
    time.sleep(0.2)  # and the server has the deliveries' stream
    print("ready", flush=True)
    for message in tasks:
        for delivery in _frames(message):
            pool.submit(run, delivery)


def _load(shape: str, address: str, notify: str, in_flight: int, seconds: float) -> None:
    """The load client: `in_flight` threads, each running cycles one after another.
    Prints `ready`, then `go` when its measured window opens, then `cycles cpu_s wall_s`."""
    calls = BatchingStream(address, f"/{SERVICE}/Calls")
    suspended: dict[bytes, threading.Event] = {}
    lock = threading.Lock()
    inbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    inbox.bind(notify)

    def listen() -> None:
        while True:
            workflow = inbox.recv(256)
            with lock:
                event = suspended.pop(workflow)
            event.set()

    threading.Thread(target=listen, daemon=True).start()
    print("ready", flush=True)
    counts = [0] * in_flight
    measuring = threading.Event()

    def cycle(slot: int) -> None:
        serial = 0
        while True:
            serial += 1
            workflow = f"w{slot}-{serial}".encode()
            event = threading.Event()
            with lock:
                suspended[workflow] = event
            if shape == "today":
                calls.call(bytes([START]) + workflow)
                event.wait()
                calls.call(bytes([SETTLE]) + workflow)
                calls.call(bytes([WAIT]) + workflow)
            else:
                result = calls.begin(bytes([EXECUTE]) + workflow)
                event.wait()
                calls.call(bytes([SETTLE]) + workflow)
                result.pending.acquire()
            if measuring.is_set():
                counts[slot] += 1

    threads = [threading.Thread(target=cycle, args=(n,)) for n in range(in_flight)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # warm-up
    cpu, wall = time.process_time(), time.monotonic()
    measuring.set()
    print("go", flush=True)
    time.sleep(seconds)
    measuring.clear()
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    print(f"{sum(counts)} {cpu:.4f} {wall:.4f}", flush=True)
    os._exit(0)  # the cycles in flight would wait for a worker that is stopped next


def _round(shape: str, in_flight: int, seconds: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        port_file, notify = Path(tmp) / "port", str(Path(tmp) / "notify")
        me = [sys.executable, __file__]
        server, address = start_server([*me, "--serve", str(port_file)], port_file)
        procs: list[subprocess.Popen[Any]] = [server]
        try:
            worker = subprocess.Popen(
                [*me, "--work", shape, address, notify], stdout=subprocess.PIPE, text=True
            )
            procs.append(worker)
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "ready"
            client = subprocess.Popen(
                [*me, "--load", shape, address, notify, "--in-flight", str(in_flight),
                 "--seconds", str(seconds)],
                stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            procs.append(client)
            assert client.stdout is not None
            assert client.stdout.readline().strip() == "ready"
            assert client.stdout.readline().strip() == "go"
            before = {p.pid: proc_cpu_seconds(p.pid) or 0.0 for p in (server, worker)}
            machine = psutil.cpu_times()
            cycles, client_cpu, wall = (float(x) for x in client.stdout.readline().split())
            after = psutil.cpu_times()
            spent = {
                p.pid: (proc_cpu_seconds(p.pid) or 0.0) - before[p.pid] for p in (server, worker)
            }
        finally:
            for proc in reversed(procs):
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
    busy = sum(
        getattr(after, f) - getattr(machine, f)
        for f in ("user", "system", "nice", "irq", "softirq", "steal")
    )
    if not cycles:
        raise RuntimeError(f"no {shape} cycle completed in {seconds:g} s: is the machine stalled?")
    per_ms = 1000.0 / cycles
    return {
        "rate": cycles / wall,
        "server": spent[server.pid] * per_ms,
        "worker": spent[worker.pid] * per_ms,
        "client": client_cpu * per_ms,
        "cores": busy / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--work", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--load", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve))
        return
    if args.work:
        _work(*args.work)
        return
    if args.load:
        _load(*args.load, args.in_flight, args.seconds)
        return
    shapes = args.shapes.split(",")
    figures: dict[str, list[dict[str, float]]] = {shape: [] for shape in shapes}
    print(f"{args.in_flight} in flight, {args.seconds:g} s a round after 1 s of warm-up; "
          "CPU ms per cycle", flush=True)  # fmt: skip
    for round_ in range(args.rounds):
        for shape in shapes:
            got = _round(shape, args.in_flight, args.seconds)
            figures[shape].append(got)
            print(f"round {round_ + 1} {shape:6}: {_line(got)}", flush=True)
    for shape, runs in figures.items():
        median = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        print(f"median  {shape:6}: {_line(median)}")


def _line(got: dict[str, float]) -> str:
    whole = got["server"] + got["worker"] + got["client"]
    return (f"{got['rate']:6.0f} cycles/s, server {got['server']:.2f}, worker "
            f"{got['worker']:.2f}, client {got['client']:.2f}, whole {whole:.2f} ms; "
            f"cores used {got['cores']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
