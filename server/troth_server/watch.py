"""In-process fan-out of settled promises to `WatchPromise` streams."""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

    from troth_server.domain.promise import Promise


class Subscription:
    def __init__(self, hub: WatchHub, promise_id: str) -> None:
        self.promise_id = promise_id
        self._hub = hub
        self._event = threading.Event()
        self.settled: Promise | None = None

    def deliver(self, promise: Promise) -> None:
        self.settled = promise
        self._event.set()

    def wake(self) -> None:
        self._event.set()

    def wait(self, timeout: float | None) -> bool:
        return self._event.wait(timeout)

    def close(self) -> None:
        self._hub.unsubscribe(self)


class AsyncSubscription(Subscription):
    """A subscription awaited on an event loop; woken from any thread."""

    def __init__(self, hub: WatchHub, promise_id: str, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(hub, promise_id)
        self._loop = loop
        self._async_event = asyncio.Event()

    def deliver(self, promise: Promise) -> None:
        self.settled = promise
        self.wake()

    def wake(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._async_event.set)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    async def wait_async(self, timeout: float | None) -> bool:
        try:
            await asyncio.wait_for(self._async_event.wait(), timeout)
        except TimeoutError:
            return False
        return True


class WatchHub:
    """Subscriptions by promise id; `publish` wakes the watchers of settled promises."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscriptions: dict[str, set[Subscription]] = {}

    def subscribe(
        self, promise_id: str, loop: asyncio.AbstractEventLoop | None = None
    ) -> Subscription:
        """Subscribe a thread, or, given `loop`, a coroutine on that loop."""
        subscription = (
            Subscription(self, promise_id)
            if loop is None
            else AsyncSubscription(self, promise_id, loop)
        )
        with self._lock:
            self._subscriptions.setdefault(promise_id, set()).add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        with self._lock:
            subs = self._subscriptions.get(subscription.promise_id)
            if subs is not None:
                subs.discard(subscription)
                if not subs:
                    del self._subscriptions[subscription.promise_id]

    def watched_ids(self) -> set[str]:
        with self._lock:
            return set(self._subscriptions)

    def publish(self, settled: Iterable[Promise]) -> None:
        if not self._subscriptions:
            return
        with self._lock:
            targets = [(sub, p) for p in settled for sub in self._subscriptions.get(p.id, ())]
        for sub, p in targets:
            sub.deliver(p)

    def wake_all(self) -> None:
        """Wake every watcher (shutdown): each re-checks and ends its stream."""
        with self._lock:
            subs = [s for group in self._subscriptions.values() for s in group]
        for sub in subs:
            sub.wake()
