"""Server-Sent Events from the watch stream (`Client.watch_promises`), so open pages
update themselves.

Each `/events` connection holds one watch, iterated on a thread of its own (the
SDK's stream blocks) and handed to the event loop; when the browser goes away
the response is cancelled and the watch closed. A reconnect of the watch (the
server restarted, a failover) sends `reload`: events in between were missed.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING

from troth.errors import TrothError

if TYPE_CHECKING:
    from troth import Client, PromiseEvent, PromiseEventStream

__all__ = ["HEARTBEAT_SECONDS", "Bridges", "event_lines"]

HEARTBEAT_SECONDS = 15.0
"""A comment line this often, so proxies keep the connection and a gone browser is seen."""

_END = object()


def _frame(kind: str, data: Mapping[str, str]) -> str:
    return f"event: {kind}\ndata: {json.dumps(data, sort_keys=True)}\n\n"


def _event_data(event: PromiseEvent) -> dict[str, str]:
    promise = event.promise
    return {
        "type": event.type.value,
        "id": promise.id,
        "root_id": promise.root_id,
        "state": promise.state.value,
    }


class Bridges:
    """The open event streams, at most `limit` at once (each holds a watch and a thread)."""

    def __init__(self, limit: int = 200) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._open = 0

    @property
    def open(self) -> int:
        return self._open

    def try_acquire(self) -> bool:
        with self._lock:
            if self._open >= self._limit:
                return False
            self._open += 1
            return True

    def release(self) -> None:
        with self._lock:
            self._open -= 1


async def event_lines(
    client: Client, id: str, tags: Mapping[str, str], bridges: Bridges
) -> AsyncIterator[str]:
    """The SSE frames of the promises matching `id` and `tags`: `ready` once the
    watch is in place, then one `promise` frame per event, `reload` after a
    reconnect, `failed` (and the end) if the watch cannot go on or too many
    pages are open."""
    if not bridges.try_acquire():
        yield _frame("failed", {"message": "too many live pages are open; reload later"})
        return
    try:
        async for frame in _watched(client, id, tags):
            yield frame
    finally:
        bridges.release()


async def _watched(client: Client, id: str, tags: Mapping[str, str]) -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[object] = asyncio.Queue()

    def put(item: object) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop has closed: nobody is listening any more
            pass

    try:
        stream: PromiseEventStream = await asyncio.to_thread(
            client.watch_promises, id, tags=dict(tags), on_reconnect=lambda: put("reload")
        )
    except TrothError as exc:
        yield _frame("failed", {"message": str(exc)})
        return

    def pump() -> None:
        try:
            for event in stream:
                put(_event_data(event))
        except Exception as exc:  # a TrothError, or anything: the page must hear it ended
            put(exc)
        put(_END)

    threading.Thread(target=pump, name=f"console-watch {id}", daemon=True).start()
    try:
        yield _frame("ready", {"id": id})
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), HEARTBEAT_SECONDS)
            except TimeoutError:
                yield ": ping\n\n"
                continue
            if item is _END:
                return
            if item == "reload":
                yield _frame("reload", {})
            elif isinstance(item, Exception):
                yield _frame("failed", {"message": str(item)})
                return
            elif isinstance(item, dict):
                yield _frame("promise", item)
    finally:
        stream.close()
