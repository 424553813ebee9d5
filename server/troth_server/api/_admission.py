"""Admission: the server's limits on calls in flight, and its report of what it refused.

Two gates, so that neither kind of call can starve the other: unary calls
(`--max-concurrent-rpcs`) and long-lived server streams (`Poll`, `WatchPromise`,
`WatchPromises`: `--max-streams`), with the long polls (`WaitPromise`) among the
streams: they wait as long as a watch does. A call that finds its gate full is answered at
once `RESOURCE_EXHAUSTED`, reason `OVERLOADED`, with a `google.rpc.RetryInfo`
delay, before any of its work is done; so is a write that finds the group
committer's queue full (`--max-queued-writes`, raised as `Overloaded` by
`troth_server.writes.group_commit` and let through by `_rpc` to be answered here).
Health checks and reflection pass no gate: an operator can always ask.

A third check sees what the gates cannot: calls waiting in gRPC core before the
server could even start them. grpc.aio picks calls up one per event-loop turn, so
a saturated (or CPU-starved) server can have thousands waiting there while few are
in progress, and core cancels, silently, any call that waited 30 s
(`grpc.server_max_unrequested_time_in_server`; `backlog_options` lifts that too, so
a call waits until its own deadline instead). The SDK sends the timeout it gave
each call (`troth-timeout-ms`); from the deadline gRPC derived from it on arrival,
the server knows how long the call waited. When every call started during the
last 100 ms waited longer than `--max-queue-delay` (CoDel's test of a standing
queue, applied to RPCs: `QueueDelay`), new calls are refused `OVERLOADED` at once,
with the standing delay as their RetryInfo, until the backlog drains; calls that
finish work already done (`CompleteTask`, `Heartbeat`, `ReleaseTask`) are never
refused for it. Calls sent without the metadata (grpcurl) are refused with the
rest but do not measure.

Refusals are counted per RPC (`Admission.refused_total`) and reported by
`OverloadReport` in one `overload` log line per second while they last, never
one line per refused call: under overload, a log line per call would be one
more thing the server cannot afford.

Why the gates matter at all: without them, gRPC core keeps every call that
arrived but that grpc.aio has not yet picked up in a backlog it caps
(`grpc.server.max_pending_requests`, default 1000, hard limit 3000) and cancels
whatever is over the cap, silently: callers saw `CANCELLED` and nothing was
logged. `backlog_options` raises that cap; the gates answer the excess quickly
enough that the backlog never grows near it.
"""

from __future__ import annotations

import asyncio
import collections
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc
import structlog

from troth._grpc_args import (
    ARG_SERVER_MAX_PENDING_REQUESTS,
    ARG_SERVER_MAX_PENDING_REQUESTS_HARD_LIMIT,
    ARG_SERVER_MAX_UNREQUESTED_TIME_IN_SERVER_SECONDS,
)
from troth_server.domain.errors import InvalidArgument, Overloaded
from troth_server.units import duration_text

if TYPE_CHECKING:
    from collections.abc import Callable

    import grpc.aio

    AioContext: TypeAlias = grpc.aio.ServicerContext[Any, Any]

log = structlog.get_logger("troth.overload")

UNARY_FLAG = "max-concurrent-rpcs"
STREAM_FLAG = "max-streams"
UNARY_RETRY_MS = 50
"""A unary slot frees within milliseconds: come back soon (the SDK adds jitter and backoff)."""
STREAM_RETRY_MS = 1000
"""A stream slot frees only when some stream ends: come back later."""
QUEUE_FLAG = "max-queue-delay"
QUEUE_INTERVAL_S = 0.1
"""The window over which every started call must have waited too long (CoDel's interval)."""
QUEUE_RETRY_MAX_MS = 5000
TIMEOUT_METADATA = "troth-timeout-ms"
"""Metadata the SDK sends with every call that has a deadline: the timeout it gave
grpc, in whole milliseconds (at most `MAX_TIMEOUT_MS`)."""
MAX_TIMEOUT_MS = 10**12
FINISHING_WORK = frozenset({"CompleteTask", "Heartbeat", "ReleaseTask", "Calls"})
"""Calls never refused for the queue delay: refusing them would waste work already done
(or a lease), and they add no new work (`Calls`, a worker's stream, carries them)."""

LONG_POLLS = frozenset({"WaitPromise"})
"""Unary calls that wait for something to happen: each takes a slot of `--max-streams`,
as the watch it stands for does, never one of `--max-concurrent-rpcs` (which a few
hundred callers waiting for results would otherwise fill, and starve every other call)."""


UNREQUESTED_CALL_MAX_S = 86_400


def backlog_options(max_concurrent_rpcs: int, max_streams: int) -> list[tuple[str, int]]:
    """gRPC core options so that a burst waits in core's backlog instead of being
    CANCELLED: room for ten times what the gates admit (at least 20,000 calls), which a
    burst fills only if the event loop stops picking calls up altogether, for as long
    as each call's own deadline allows."""
    backlog = max(20_000, 10 * (max_concurrent_rpcs + max_streams))
    return [
        (ARG_SERVER_MAX_PENDING_REQUESTS, backlog),
        (ARG_SERVER_MAX_PENDING_REQUESTS_HARD_LIMIT, backlog),
        # Core would cancel a call that waited this long (default 30 s) with no word;
        # a call waits for its own deadline instead, and the queue-delay check sheds
        # load long before.
        (ARG_SERVER_MAX_UNREQUESTED_TIME_IN_SERVER_SECONDS, UNREQUESTED_CALL_MAX_S),
    ]


@dataclass(slots=True)
class Gate:
    """A count of calls in flight against a limit (no I/O, one event loop: no lock)."""

    flag: str
    limit: int
    what: str
    """What is at the limit, for the message: "unary calls are in progress"."""
    retry_after_ms: int
    in_use: int = 0

    def try_enter(self) -> bool:
        if self.in_use >= self.limit:
            return False
        self.in_use += 1
        return True

    def leave(self) -> None:
        self.in_use -= 1

    def refusal(self) -> Overloaded:
        return Overloaded(
            self.flag, self.limit, f"{self.limit} {self.what}", retry_after_ms=self.retry_after_ms
        )


@dataclass(slots=True)
class QueueDelay:
    """How long calls waited before the server could start them, as CoDel judges a queue
    (Nichols and Jacobson, "Controlling Queue Delay", 2012): a queue is standing when
    the shortest wait of every call started within an interval is over the target, and
    at least `min_calls` were started in it (with a backlog, calls are started all the
    time). One slow client, or a burst the server works off within the interval, is not
    enough.

    Pure: `sample` and `standing` take the monotonic time; one event loop, no lock.
    """

    limit_s: float
    interval_s: float = QUEUE_INTERVAL_S
    min_calls: int = 4
    standing_s: float = 0.0
    """The shortest wait of the calls started in the last complete interval (0 when
    fewer than `min_calls` were)."""
    _window_end: float = -math.inf
    _window_min: float = math.inf
    _window_calls: int = 0

    def sample(self, waited_s: float, now: float) -> None:
        """One call started at `now` after waiting `waited_s` seconds."""
        self._roll(now)
        self._window_min = min(self._window_min, waited_s)
        self._window_calls += 1

    def standing(self, now: float) -> float:
        """The standing delay as of `now` (0 once a whole interval went by unmeasured)."""
        self._roll(now)
        return self.standing_s

    def over(self, now: float) -> bool:
        return self.standing(now) > self.limit_s

    def _roll(self, now: float) -> None:
        if now < self._window_end:
            return
        # The window that ended decides, if `now` is in the very next one; after a
        # whole window with (almost) no call started, nothing was waiting.
        fresh = now < self._window_end + self.interval_s and self._window_calls >= self.min_calls
        self.standing_s = self._window_min if fresh else 0.0
        self._window_end = now + self.interval_s
        self._window_min = math.inf
        self._window_calls = 0


def waited_s(timeout_ms: str | None, time_remaining: float | None) -> float | None:
    """How long a call waited before it was started: the timeout its client gave it
    (`troth-timeout-ms`) less what gRPC says remains of the deadline it derived from
    that timeout on arrival; None when the call says nothing. Raises InvalidArgument on
    metadata that is not a whole number of milliseconds in range."""
    if timeout_ms is None:
        return None
    if not (timeout_ms.isascii() and timeout_ms.isdigit()) or len(timeout_ms) > 13:
        raise InvalidArgument(
            TIMEOUT_METADATA,
            "metadata must be the call's timeout in whole milliseconds (the troth SDK "
            "sends it); drop it or send digits only",
        )
    timeout = int(timeout_ms)
    if not 0 < timeout <= MAX_TIMEOUT_MS:
        raise InvalidArgument(
            TIMEOUT_METADATA, f"metadata must be between 1 and {MAX_TIMEOUT_MS} milliseconds"
        )
    if time_remaining is None:  # no deadline reached the server (a proxy dropped it)
        return None
    return max(0.0, timeout / 1000 - time_remaining)


@dataclass(slots=True)
class Admission:
    """Both gates and the refusal counters (pure: the door and the report use it)."""

    unary: Gate
    streams: Gate
    queue: QueueDelay
    refused_total: collections.Counter[str] = field(default_factory=collections.Counter)
    """Refused calls per RPC method name, since the start."""
    _since_report: collections.Counter[str] = field(default_factory=collections.Counter)
    worst_queue_delay_s: float = 0.0
    """The longest standing queue delay refused for since the last report."""
    on_refused: Callable[[str, str], None] | None = None
    """Each refusal: the method and the limit (flag) that refused it (the metrics)."""

    @classmethod
    def with_limits(
        cls, max_concurrent_rpcs: int, max_streams: int, max_queue_delay_ms: int = 1000
    ) -> Admission:
        return cls(
            unary=Gate(UNARY_FLAG, max_concurrent_rpcs, "unary calls are in progress",
                       UNARY_RETRY_MS),
            streams=Gate(STREAM_FLAG, max_streams, "streams are open", STREAM_RETRY_MS),
            queue=QueueDelay(max_queue_delay_ms / 1000),
        )  # fmt: skip

    def gate_for(self, method: str) -> Gate:
        """The gate a unary call of `method` takes a slot of (`LONG_POLLS`)."""
        return self.streams if method in LONG_POLLS else self.unary

    def queue_refusal(self, now: float) -> Overloaded | None:
        """The refusal of a new call while calls wait too long to be started, else None."""
        standing = self.queue.standing(now)
        if standing <= self.queue.limit_s:
            return None
        self.worst_queue_delay_s = max(self.worst_queue_delay_s, standing)
        return Overloaded(
            QUEUE_FLAG,
            duration_text(round(self.queue.limit_s * 1000)),  # as --max-queue-delay reads it
            f"calls have waited {standing:.1f} s before it could start them",
            retry_after_ms=min(QUEUE_RETRY_MAX_MS, max(UNARY_RETRY_MS, round(standing * 1000))),
        )

    def admit(self, method: str, gate: Gate, waited: float | None, now: float) -> Overloaded | None:
        """The one admission decision, for a unary call, a stream's opening and a call on
        `Calls` alike (`api/_door.py`): the call's time queued sampled (if it says), then
        a slot of `gate` taken; or the refusal, counted (while calls wait too long to be
        started, a new one is refused unless it finishes work)."""
        if waited is not None:
            self.queue.sample(waited, now)
        if method not in FINISHING_WORK:
            queued = self.queue_refusal(now)
            if queued is not None:
                self.refused(method, queued.limit)
                return queued
        if not gate.try_enter():
            self.refused(method, gate.flag)
            return gate.refusal()
        return None

    def refused(self, method: str, limit: str = "") -> None:
        self.refused_total[method] += 1
        self._since_report[method] += 1
        if self.on_refused is not None:
            self.on_refused(method, limit)

    def take_report(self) -> dict[str, int] | None:
        """Refusals per method since the last report (None if there were none), and reset."""
        if not self._since_report:
            return None
        report = dict(self._since_report)
        self._since_report.clear()
        return report

    def take_worst_queue_delay(self) -> float:
        """The worst standing delay refused for since the last call, and reset."""
        worst, self.worst_queue_delay_s = self.worst_queue_delay_s, 0.0
        return worst

    def limits(self) -> dict[str, int]:
        return {
            self.unary.flag: self.unary.limit,
            self.streams.flag: self.streams.limit,
            QUEUE_FLAG: round(self.queue.limit_s * 1000),
        }


class OverloadReport:
    """One `overload` log line per second while calls are being refused; `start()` on the
    server's event loop, `stop()` before it closes."""

    def __init__(
        self,
        admission: Admission,
        *,
        queued_writes: Callable[[], int] = lambda: 0,
        queue_limit: int | None = None,
        interval: float = 1.0,
    ) -> None:
        self._admission = admission
        self._queued_writes = queued_writes
        self._queue_limit = queue_limit
        self._interval = interval
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self.report()  # the last second's refusals

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            self.report()

    def report(self, *, always: bool = False) -> None:
        """Log the refusals since the last line (with `always`, also when there were none)."""
        since = self._admission.take_report()
        if since is None and not always:
            return
        admission = self._admission
        limits = admission.limits()
        if self._queue_limit is not None:
            limits["max-queued-writes"] = self._queue_limit
        log.warning(
            "overload",
            refused=since or {},
            refused_total=dict(admission.refused_total),
            unary_in_flight=admission.unary.in_use,
            streams_open=admission.streams.in_use,
            queue_delay_s=round(admission.take_worst_queue_delay(), 3),
            queued_writes=self._queued_writes(),
            limits=limits,
        )
