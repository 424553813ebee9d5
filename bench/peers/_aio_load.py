"""The async load client: one asyncio loop (in the calling thread) running `concurrency`
cycles at a time until a deadline, over a small keep-alive HTTP/1.1 client on
asyncio streams (stdlib only). The counterpart of `_load.run_threads`, with the
same summary; its CPU is the benchmark process's, like the threads'."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from _load import summary


class HttpError(RuntimeError):
    """An HTTP status of 300 or more; the message names the call and the body's start."""


class AioHttp:
    """One keep-alive HTTP/1.1 connection (opened on first use, reopened once if the
    server dropped it). `send` and `receive` split a call so that a caller can leave
    a request open (Restate's awakeable flow: the result comes on it) while it makes
    other calls on another connection."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending = ""

    async def send(self, method: str, path: str, body: Any = None) -> None:
        if self._reader is not None and self._reader.at_eof():
            self.close()  # the server closed it while idle
        data = b"" if body is None else json.dumps(body).encode()
        head = (
            f"{method} {path} HTTP/1.1\r\nhost: 127.0.0.1:{self.port}\r\n"
            f"content-length: {len(data)}\r\n"
            + ("content-type: application/json\r\n" if body is not None else "")
            + "\r\n"
        )
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
        self._writer.write(head.encode() + data)
        self._pending = f"{method} {path}"

    async def receive(self) -> Any:
        assert self._reader is not None
        reader, call = self._reader, self._pending
        status_line = await reader.readline()
        if not status_line:
            self.close()
            raise ConnectionResetError(f"{call}: the server closed the connection")
        status = int(status_line.split()[1])
        length, chunked, closing = 0, False, False
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding" and "chunked" in value:
                chunked = True
            elif name == "connection" and value == "close":
                closing = True
        payload = await (_chunks(reader) if chunked else reader.readexactly(length))
        if closing:
            self.close()
        if status >= 300:
            raise HttpError(f"{call}: HTTP {status}: {payload[:300]!r}")
        return json.loads(payload) if payload else None

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        for attempt in range(2):
            try:
                await self.send(method, path, body)
                return await self.receive()
            except (ConnectionError, asyncio.IncompleteReadError):
                self.close()  # a dropped keep-alive connection: reconnect once
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


async def _chunks(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while size := int((await reader.readline()).split(b";")[0], 16):
        body += await reader.readexactly(size)
        await reader.readline()
    await reader.readline()
    return bytes(body)


Cycle = Callable[[str, int], Awaitable[int]]
"""One async cycle: (workflow id, slot) -> the latency it measured, in ns."""


MakeCycle = Callable[[], tuple[Cycle, Callable[[], None]]]
"""Makes a cycle and the function that closes its connections, inside the loop."""


def run_async(make_cycle: MakeCycle, concurrency: int, duration: float) -> dict[str, Any]:
    """`concurrency` tasks on one new loop, each running cycles until `duration` is
    over; `make_cycle` is called inside the loop (its connections belong to it)."""
    return asyncio.run(_run(make_cycle, concurrency, duration))


async def _run(make_cycle: MakeCycle, concurrency: int, duration: float) -> dict[str, Any]:
    cycle, close = make_cycle()
    prefix = uuid.uuid4().hex[:10]
    counter = itertools.count()
    latencies: list[int] = []
    errors: list[str] = []
    deadline = time.perf_counter() + duration

    async def loop(slot: int) -> None:
        while time.perf_counter() < deadline:
            try:
                latencies.append(await cycle(f"{prefix}-{next(counter)}", slot))
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")

    started = time.perf_counter()
    try:
        await asyncio.gather(*(loop(i) for i in range(concurrency)))
    finally:
        close()
    elapsed = time.perf_counter() - started
    return summary(latencies, errors, elapsed)
