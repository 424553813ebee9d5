"""The server's clock: the one source of `now` for every decision (DESIGN §4 rule 12).

Expiry, leases and settle/create times are all decided at "the store's time":

- PostgreSQL (`DatabaseClock`): the database's own clock. Every write
  transaction reads `clock_timestamp()` once, inside the transaction, and the
  whole batch decides at that time, so replicas whose own clocks are skewed
  never disagree. Reads estimate the database's time from the latest reading
  and this process's monotonic clock, erring late (never early), and a read
  that finds a promise due asks the writer, which decides at the database's
  time (see `PromiseService`).
- SQLite (`GuardedClock`): the one server's clock. Intervals run on the
  monotonic clock; the wall clock only anchors it, at start (never behind the
  newest time already stored) and afterwards by a slow slew, so that a wall
  clock jump cannot expire everything at once, take a lease early or keep one
  for an hour.

What the wall clock is still used for: log timestamps, the anchor of the
SQLite clock at start, and that clock's slow correction towards it.

Tests jump a server process's wall clock through `TROTH_TEST_CLOCK_FILE`
(`WallClock`): a file holding a float offset in seconds.

Everything here but `WallClock`'s default sources is pure: time sources are
injected, and `OutageGuard` takes `now` as a parameter.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from troth_server.store import WriteTx

TEST_CLOCK_ENV = "TROTH_TEST_CLOCK_FILE"
"""Names a file holding a float offset in seconds added to the wall clock (tests only)."""
_REREAD_NS = 50_000_000
SLEW = 0.005
"""How fast the SQLite clock follows a change of the wall clock: 5 ms per second
(a 60 s step is absorbed in 3 h 20 min; a step back never makes time go back)."""


def monotonic_ms() -> float:
    return time.monotonic_ns() / 1_000_000


class WallClock:
    """`time.time_ns()` in ms, plus the offset in the test clock file when one is named.

    The file is re-read at most every 50 ms; a missing, empty or unreadable file
    means no offset.
    """

    def __init__(
        self,
        offset_file: str | None = None,
        *,
        time_ns: Callable[[], int] = time.time_ns,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._file = offset_file or None
        self._time_ns = time_ns
        self._monotonic_ns = monotonic_ns
        self._offset_ms = 0.0
        self._read_at: int | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> WallClock:
        return cls(environ.get(TEST_CLOCK_ENV))

    def __call__(self) -> int:
        if self._file is not None:
            mono = self._monotonic_ns()
            if self._read_at is None or mono - self._read_at >= _REREAD_NS:
                self._read_at = mono
                self._offset_ms = _read_offset_ms(self._file)
        return int(self._time_ns() // 1_000_000 + self._offset_ms)


def _read_offset_ms(path: str) -> float:
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read().strip()
        return float(text) * 1000 if text else 0.0
    except (OSError, ValueError):
        return 0.0


@runtime_checkable
class StoreClock(Protocol):
    """A clock the group committer asks for the time of each write transaction."""

    def __call__(self) -> int:
        """The time now (ms since the epoch), for reads and pacing."""

    def in_transaction(self, tx: WriteTx) -> int:
        """The time a write transaction decides at, read once per transaction."""


def transaction_clock(clock: Callable[[], int]) -> Callable[[WriteTx], int]:
    """What gives a write transaction its time: the store clock's reading inside it,
    or a plain clock's now (tests inject those)."""
    if isinstance(clock, StoreClock):
        return clock.in_transaction
    return lambda _tx: clock()


class GuardedClock:
    """One server's clock (SQLite): monotonic intervals, anchored to the wall clock.

    Starts at the wall clock's time, or at `floor` (the newest time already
    stored) if the wall clock is behind it. From then on it advances with the
    monotonic clock, and follows the wall clock's offset from it by at most
    `slew` (a fraction of the monotonic time elapsed): never backwards, and
    every interval it measures is within `slew` of the monotonic interval.
    Thread-safe.
    """

    def __init__(
        self,
        wall: Callable[[], int],
        monotonic: Callable[[], float] = monotonic_ms,
        *,
        floor: int = 0,
        slew: float = SLEW,
    ) -> None:
        if not 0 <= slew < 1:
            raise ValueError("slew must be in [0, 1)")
        self._wall = wall
        self._monotonic = monotonic
        self._slew = slew
        self._lock = threading.Lock()
        self._mono = monotonic()
        self._value = float(max(wall(), floor))

    def __call__(self) -> int:
        with self._lock:
            mono = self._monotonic()
            elapsed = max(0.0, mono - self._mono)
            self._mono = max(self._mono, mono)
            ahead = self._value + elapsed
            error = self._wall() - ahead
            bound = self._slew * elapsed
            self._value = ahead + max(-bound, min(bound, error))
            return int(self._value)

    def in_transaction(self, tx: WriteTx) -> int:
        return self()


class DatabaseClock:
    """The database's clock (PostgreSQL), as this process knows it.

    A write transaction reads it inside the transaction (`in_transaction`).
    `__call__` estimates it for reads: the latest reading plus the monotonic
    time since just before that reading was asked for, so the estimate is
    never behind the database's clock (it is ahead by at most one round trip);
    a reading older than `max_age_ms` is refreshed with `read` first.
    """

    def __init__(
        self,
        read: Callable[[], int],
        monotonic: Callable[[], float] = monotonic_ms,
        *,
        max_age_ms: float = 1000.0,
    ) -> None:
        self._read = read
        self._monotonic = monotonic
        self._max_age_ms = max_age_ms
        self._lock = threading.Lock()
        self._sample: tuple[int, float] | None = None

    def __call__(self) -> int:
        mono = self._monotonic()
        sample = self._sample
        if sample is None or mono - sample[1] > self._max_age_ms:
            self._record(self._read(), mono)
            sample = self._sample
            assert sample is not None
        return int(sample[0] + max(0.0, self._monotonic() - sample[1]))

    def in_transaction(self, tx: WriteTx) -> int:
        asked = self._monotonic()
        now = tx.database_time()
        if now is None:
            raise TypeError("DatabaseClock needs a store with a clock of its own (PostgreSQL)")
        self._record(now, asked)
        return now

    def _record(self, value: int, asked: float) -> None:
        with self._lock:
            if self._sample is None or asked >= self._sample[1]:
                self._sample = (value, asked)


class OutageGuard:
    """When this server last came back from being away, so that an outage never takes a lease.

    Away means: not started yet, frozen (SIGSTOP, a suspended machine), or cut
    off from its store. Workers could not heartbeat meanwhile, so a CLAIMED
    task's lease is taken only once one lease length has passed since `since`
    (the domain rule is `task.lease_expired`). Fed by the periodic tick (a gap
    between ticks much longer than their interval means this process did not
    run) and by store failures. Pure: times are parameters.
    """

    def __init__(self, started: int, started_mono: float, *, interval_ms: float) -> None:
        self.since = started
        """The store clock's time this server last came back."""
        self._last_tick = started_mono
        self._slack_ms = interval_ms + max(interval_ms, 1000.0)
        self._failed = False

    def store_failed(self) -> None:
        """A read or write of the store failed: the next good tick starts a grace period."""
        self._failed = True

    def tick(self, now: int, mono: float) -> int:
        """A periodic tick at store time `now` (monotonic `mono`); returns `since`."""
        if self._failed or mono - self._last_tick > self._slack_ms:
            self._failed = False
            self.since = max(self.since, now)
        self._last_tick = max(self._last_tick, mono)
        return self.since
