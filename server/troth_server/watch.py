"""In-process fan-out of promise changes to `WatchPromise` and `WatchPromises` streams.

`WatchPromise` subscribers wait for one id and are woken from the thread that
learnt of the settle. `WatchPromises` subscribers get events (created, settled,
timed out) of every promise their filter matches: commits and announcements
from other replicas are queued to one fan-out thread, which filters and hands
each subscriber its events, so that no number of watchers ever slows a commit.
Each subscriber buffers at most `backlog` events; one that falls further
behind (its client reads too slowly) is ended with `WatchFellBehind`, since a
silent gap would leave an inbox page wrong without anyone knowing.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import queue
import re
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from troth.errors import Reason
from troth_server.domain.errors import DomainError
from troth_server.domain.promise import TIMEOUT_PRINCIPAL, Promise, PromiseState

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Collection, Iterable, Iterator, Mapping

    from troth_server.writes.batch import StateChange

log = structlog.get_logger("troth.watch")


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
        self._event_subscriptions: set[EventSubscription] = set()
        self._jobs: queue.SimpleQueue[Callable[[], list[PromiseEvent]]] | None = None

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
            event_subs = list(self._event_subscriptions)
        for sub in subs:
            sub.wake()
        for event_sub in event_subs:
            event_sub.wake()

    # -- WatchPromises ----------------------------------------------------------------

    def subscribe_events(
        self, wanted: EventFilter, backlog: int, loop: asyncio.AbstractEventLoop | None = None
    ) -> EventSubscription:
        """Subscribe a thread, or, given `loop`, a coroutine on that loop, to the
        events of every promise `wanted` matches from now on."""
        subscription = (
            EventSubscription(self, wanted, backlog)
            if loop is None
            else AsyncEventSubscription(self, wanted, backlog, loop)
        )
        with self._lock:
            self._event_subscriptions.add(subscription)
            if self._jobs is None:
                self._jobs = queue.SimpleQueue()
                threading.Thread(
                    target=self._fan_out, args=(self._jobs,), name="troth-watch", daemon=True
                ).start()
        return subscription

    def unsubscribe_events(self, subscription: EventSubscription) -> None:
        with self._lock:
            self._event_subscriptions.discard(subscription)

    def publish_changes(self, changes: Collection[StateChange]) -> None:
        """A commit of this server made these changes (called after the commit)."""
        if self._event_subscriptions and changes:
            self._submit(lambda: events_from_changes(changes))

    def publish_remote(
        self,
        created_ids: Collection[str],
        settled_ids: Collection[str],
        read: Callable[[Collection[str]], Iterable[Promise]],
    ) -> None:
        """Another replica created or settled these promises; `read` loads them
        (on the fan-out thread, so the caller never waits for the store)."""
        if not self._event_subscriptions or not (created_ids or settled_ids):
            return

        def load() -> list[PromiseEvent]:
            found = {p.id: p for p in read(set(created_ids) | set(settled_ids))}
            return events_from_announcement(created_ids, settled_ids, found)

        self._submit(load)

    def events_missed(self) -> None:
        """Events may have been lost (announcements from other replicas were):
        end every event stream, so that its client reconnects and re-lists."""
        if self._event_subscriptions:
            self._submit(_raise_missed)

    def _submit(self, job: Callable[[], list[PromiseEvent]]) -> None:
        jobs = self._jobs
        if jobs is not None:
            jobs.put(job)

    def _fan_out(self, jobs: queue.SimpleQueue[Callable[[], list[PromiseEvent]]]) -> None:
        while True:
            job = jobs.get()
            with self._lock:
                subscribers = list(self._event_subscriptions)
            try:
                events = job()
            except EventsMissed as exc:
                for subscriber in subscribers:
                    subscriber.fail(exc)
                continue
            except Exception as exc:  # e.g. the store, reading another replica's promises
                log.warning("watch.events_lost", error=str(exc))
                for subscriber in subscribers:
                    subscriber.fail(EventsMissed(f"reading them failed ({exc})"))
                continue
            for subscriber in subscribers:
                subscriber.offer([e for e in events if subscriber.wanted.matches(e.promise)])


def _raise_missed() -> list[PromiseEvent]:
    raise EventsMissed("its link to the other replicas was interrupted")


# -- events (pure) --------------------------------------------------------------------


class EventType(enum.Enum):
    CREATED = "CREATED"
    SETTLED = "SETTLED"
    """Resolved, rejected or cancelled by someone."""
    TIMED_OUT = "TIMED_OUT"
    """Reached its expire_time: REJECTED_TIMEDOUT, or RESOLVED for a timer."""


@dataclass(frozen=True, slots=True)
class PromiseEvent:
    type: EventType
    promise: Promise


@dataclass(frozen=True, slots=True)
class EventFilter:
    """Which promises a `WatchPromises` stream wants: an id glob and exact tags."""

    id_glob: str = "*"
    tags: Mapping[str, str] = field(default_factory=dict)
    prefixes: tuple[str, ...] = ()
    """Only ids starting with one of these, when given (a scoped principal's watch)."""

    def matches(self, promise: Promise) -> bool:
        if self.prefixes and not promise.id.startswith(self.prefixes):
            return False
        tags = promise.tags
        for key, value in self.tags.items():
            if tags.get(key) != value:
                return False
        return self.id_glob == "*" or _glob(self.id_glob).fullmatch(promise.id) is not None


@functools.lru_cache(maxsize=256)
def _glob(id_glob: str) -> re.Pattern[str]:
    """A search glob as a regex: `*` is any run of characters; nothing else is special."""
    return re.compile(".*".join(re.escape(part) for part in id_glob.split("*")), re.DOTALL)


def settle_event_type(promise: Promise) -> EventType:
    """SETTLED, or TIMED_OUT for a promise its expire_time settled (a timer too)."""
    if promise.state is PromiseState.REJECTED_TIMEDOUT or promise.settled_by == TIMEOUT_PRINCIPAL:
        return EventType.TIMED_OUT
    return EventType.SETTLED


def events_from_changes(changes: Iterable[StateChange]) -> list[PromiseEvent]:
    """The events of one commit's state changes, in commit order."""
    events = []
    for change in changes:
        promise = change.promise
        if change.old_state is None:
            events.append(PromiseEvent(EventType.CREATED, promise))
            if promise.is_settled:  # created already settled, in one step
                events.append(PromiseEvent(settle_event_type(promise), promise))
        elif change.old_state is PromiseState.PENDING and promise.is_settled:
            events.append(PromiseEvent(settle_event_type(promise), promise))
    return events


def events_from_announcement(
    created_ids: Iterable[str], settled_ids: Iterable[str], found: Mapping[str, Promise]
) -> list[PromiseEvent]:
    """The events of another replica's commit, from the promises as read since.

    A promise both created and settled there gets both events, in that order.
    The promise is as read, so a CREATED event may already show a later state.
    """
    events = [PromiseEvent(EventType.CREATED, found[i]) for i in created_ids if i in found]
    for promise_id in settled_ids:
        promise = found.get(promise_id)
        if promise is not None and promise.is_settled:
            events.append(PromiseEvent(settle_event_type(promise), promise))
    return events


# -- event subscriptions --------------------------------------------------------------


class WatchFellBehind(DomainError):
    """A `WatchPromises` client read too slowly: its backlog overflowed."""

    reason = Reason.RESOURCE_EXHAUSTED

    def __init__(self, backlog: int) -> None:
        super().__init__(
            f"this watch fell more than {backlog} events behind (its client reads too "
            "slowly), so it was ended and later events were dropped; reconnect, and re-list "
            "with SearchPromises what changed meanwhile"
        )


class EventsMissed(DomainError):
    """This server may have missed events of other replicas' commits."""

    reason = Reason.STORE_UNAVAILABLE

    def __init__(self, why: str) -> None:
        super().__init__(
            f"this server may have missed events committed by other replicas ({why}); "
            "reconnect, and re-list with SearchPromises what changed meanwhile"
        )


class EventSubscription:
    """One `WatchPromises` stream's buffer: filled by the fan-out thread, drained
    by the stream. Holds at most `backlog` events; past that it fails instead."""

    def __init__(self, hub: WatchHub, wanted: EventFilter, backlog: int) -> None:
        self.wanted = wanted
        self._hub = hub
        self._backlog = backlog
        self._lock = threading.Lock()
        self._events: deque[PromiseEvent] = deque()
        self._fault: DomainError | None = None
        self._signalled = False
        """A wake-up is on its way: later events need not send another."""
        self._event = threading.Event()

    def offer(self, events: list[PromiseEvent]) -> None:
        if not events:
            return
        with self._lock:
            if self._fault is not None:
                return
            if len(self._events) + len(events) > self._backlog:
                self._fault = WatchFellBehind(self._backlog)
                self._events.clear()
            else:
                self._events.extend(events)
            if self._signalled:
                return
            self._signalled = True
        self.wake()

    def fail(self, fault: DomainError) -> None:
        """End the stream with `fault` once it has sent what it already holds."""
        with self._lock:
            if self._fault is None:
                self._fault = fault
        self.wake()

    def take(self) -> tuple[list[PromiseEvent], DomainError | None]:
        """Everything buffered, and the fault that ends the stream after it, if any."""
        with self._lock:
            events = list(self._events)
            self._events.clear()
            self._signalled = False
            self._reset()
            return events, self._fault

    def _reset(self) -> None:
        self._event.clear()

    def wake(self) -> None:
        self._event.set()

    def wait(self) -> None:
        self._event.wait()

    def close(self) -> None:
        self._hub.unsubscribe_events(self)


class AsyncEventSubscription(EventSubscription):
    """An event subscription drained on an event loop; filled from any thread."""

    def __init__(
        self, hub: WatchHub, wanted: EventFilter, backlog: int, loop: asyncio.AbstractEventLoop
    ) -> None:
        super().__init__(hub, wanted, backlog)
        self._loop = loop
        self._async_event = asyncio.Event()

    def _reset(self) -> None:
        self._async_event.clear()  # take() runs on the loop

    def wake(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._async_event.set)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    async def wait_async(self) -> None:
        await self._async_event.wait()


class EventWatch:
    """Iterate for the events of a subscription; `cancel()` ends it from any thread.

    Ends by itself when the server stops (`stopping`); raises the
    subscription's fault (after the events buffered before it).
    """

    def __init__(self, subscription: EventSubscription, stopping: threading.Event) -> None:
        self._subscription = subscription
        self._stopping = stopping
        self._cancelled = False

    def cancel(self) -> None:
        self._cancelled = True
        self._subscription.wake()

    def _over(self) -> bool:
        return self._cancelled or self._stopping.is_set()

    def __iter__(self) -> Iterator[PromiseEvent]:
        try:
            while not self._over():
                events, fault = self._subscription.take()
                yield from events
                if fault is not None:
                    raise fault
                if not events:
                    self._subscription.wait()
        finally:
            self._subscription.close()


class AsyncEventWatch(EventWatch):
    """`EventWatch` for an event loop: `async for`."""

    _subscription: AsyncEventSubscription

    async def __aiter__(self) -> AsyncIterator[PromiseEvent]:
        try:
            while not self._over():
                events, fault = self._subscription.take()
                for event in events:
                    yield event
                if fault is not None:
                    raise fault
                if not events:
                    await self._subscription.wait_async()
        finally:
            self._subscription.close()
