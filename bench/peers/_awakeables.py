"""The side channel that carries Restate awakeables' ids to the party that settles them.

In the awakeable flow the workflow's notification step (a ``ctx.run``) tells the
human, or the gateway standing for them, the id to settle by: here it sends a
datagram ``<event> <workflow id> <awakeable id>`` to the benchmark's socket
(``BENCH_AWAKEABLES`` in `_restate_service.py`). Events: ``notified`` (the step
ran; the invocation is live) and ``suspended`` (the invocation suspended on the
awakeable). A waiter is a thread's `threading.Event` or an asyncio future.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from pathlib import Path


class Waiter:
    """The awakeable id of one expected event, once it arrived (`wait` for threads)."""

    def __init__(self) -> None:
        self.awakeable_id = ""
        self.event = threading.Event()

    def wait(self, timeout: float) -> str | None:
        return self.awakeable_id if self.event.wait(timeout) else None


class Awakeables:
    """Receives the service's datagrams on a Unix socket and hands each id to its waiter."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        self._sock.bind(str(path))
        self._lock = threading.Lock()
        self._threads: dict[tuple[str, str], Waiter] = {}
        self._futures: dict[tuple[str, str], asyncio.Future[str]] = {}
        self._thread = threading.Thread(target=self._loop, name="awakeables", daemon=True)
        self._thread.start()

    def expect(self, workflow_id: str, event: str) -> Waiter:
        waiter = Waiter()
        with self._lock:
            self._threads[(event, workflow_id)] = waiter
        return waiter

    def expect_async(self, workflow_id: str, event: str) -> asyncio.Future[str]:
        """A future of the running loop, set (thread-safely) to the awakeable id."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._futures[(event, workflow_id)] = future
        return future

    def forget(self, workflow_id: str, event: str) -> None:
        with self._lock:
            self._threads.pop((event, workflow_id), None)
            self._futures.pop((event, workflow_id), None)

    def _loop(self) -> None:
        while True:
            try:
                data = self._sock.recv(4096)
            except OSError:
                return
            parts = data.decode().split()
            if len(parts) != 3:
                continue
            event, workflow_id, awakeable_id = parts
            with self._lock:
                waiter = self._threads.pop((event, workflow_id), None)
                future = self._futures.pop((event, workflow_id), None)
            if waiter is not None:
                waiter.awakeable_id = awakeable_id
                waiter.event.set()
            if future is not None:
                with contextlib.suppress(RuntimeError):  # its loop closed: nobody waits
                    future.get_loop().call_soon_threadsafe(_set, future, awakeable_id)

    def close(self) -> None:
        self._sock.close()


def _set(future: asyncio.Future[str], value: str) -> None:
    if not future.done():
        future.set_result(value)
