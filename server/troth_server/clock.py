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
- SQLite served by several processes (`troth serve --processes N`, `SharedClock`):
  the same clock, one for all of them. Its `Anchor` (a monotonic time, the clock's
  value then, and the wall clock's offset from it still to absorb) lives in a small
  file beside the database that every process maps (`ClockFile`): CLOCK_MONOTONIC is
  one clock for the whole machine on Linux, so every process reads the same time
  from it. The supervisor sets the anchor once, before it starts any (at the wall
  clock, never behind the newest time stored); each write transaction, holding the
  processes' write lock, moves it forward (the slew), so that it never goes back.

What the wall clock is still used for: log timestamps, the anchor of the
SQLite clock at start, and that clock's slow correction towards it.

Tests jump a server process's wall clock through `TROTH_TEST_CLOCK_FILE`
(`WallClock`): a file holding a float offset in seconds.

Everything here but `WallClock`'s default sources and `ClockFile` (a file) is pure: time sources are
injected, and `OutageGuard` takes `now` as a parameter.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class Anchor:
    """The shared SQLite clock (`SharedClock`) as a function of the monotonic clock:
    `value` at `mono`, plus the monotonic time since, plus as much of `error` (the
    wall clock's offset from `value` at `mono`, assumed to hold since) as the slew
    allows. Continuous and increasing: moving the anchor (`advanced`) never makes
    the clock jump. Pure."""

    mono: float
    value: float
    error: float = 0.0

    @classmethod
    def start(cls, mono: float, wall: int, floor: int) -> Anchor:
        """The anchor at a start: the wall clock's time, or `floor` (the newest time
        stored) if the wall clock is behind it, which it then slews back to."""
        value = float(max(wall, floor))
        return cls(mono, value, wall - value)

    def at(self, mono: float, slew: float = SLEW) -> float:
        elapsed = mono - self.mono
        if elapsed <= 0:  # read just before another process moved the anchor
            return self.value + elapsed
        bound = slew * elapsed
        return self.value + elapsed + max(-bound, min(bound, self.error))

    def advanced(self, mono: float, wall: int, slew: float = SLEW) -> Anchor:
        """The anchor moved to `mono`, the wall clock's offset measured again."""
        value = max(self.value, self.at(mono, slew))
        return Anchor(mono, value, wall - value)


class AnchorStore(Protocol):
    def read(self) -> Anchor: ...

    def write(self, anchor: Anchor) -> None: ...


class SharedClock:
    """The clock of several server processes on one SQLite file: every process reads
    the one `Anchor` (`ClockFile`); a write transaction, holding the processes' write
    lock (the only writer of the anchor then), moves it forward, slewing towards the
    wall clock as `GuardedClock` does."""

    def __init__(
        self,
        anchors: AnchorStore,
        wall: Callable[[], int],
        monotonic: Callable[[], float] = monotonic_ms,
        *,
        slew: float = SLEW,
    ) -> None:
        self._anchors = anchors
        self._wall = wall
        self._monotonic = monotonic
        self._slew = slew

    def __call__(self) -> int:
        return int(self._anchors.read().at(self._monotonic(), self._slew))

    def in_transaction(self, tx: WriteTx) -> int:
        anchor = self._anchors.read().advanced(self._monotonic(), self._wall(), self._slew)
        self._anchors.write(anchor)
        return int(anchor.value)


_ANCHOR = struct.Struct("<Qddd")
"""A `ClockFile`: a sequence number (odd while it is written), then the anchor."""


class ClockFile:
    """The `Anchor` of one SQLite file's processes, in a file every one of them maps.

    A seqlock: the writer (one at a time: it holds the processes' write lock) makes
    the sequence number odd, writes the anchor, makes it even; a reader retries a
    reading the sequence number says was torn. A writer killed halfway leaves it
    odd: readers keep the last anchor they read until the next writer rewrites it
    (one that never read it takes it as it is).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            if os.fstat(fd).st_size < _ANCHOR.size:
                raise ValueError(f"{os.fspath(path)} holds no clock anchor")
            self._map = mmap.mmap(fd, _ANCHOR.size)
        finally:
            os.close(fd)
        self._last: Anchor | None = None
        self._last = self.read()

    @staticmethod
    def create(path: str | os.PathLike[str], anchor: Anchor) -> None:
        """Write a new file at `path` holding `anchor` (replacing any old one whole)."""
        tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
        with open(tmp, "wb") as file:
            file.write(_ANCHOR.pack(0, anchor.mono, anchor.value, anchor.error))
        os.replace(tmp, path)

    def read(self) -> Anchor:
        for _ in range(1000):
            before, mono, value, error = _ANCHOR.unpack_from(self._map)
            if before % 2 == 0 and struct.unpack_from("<Q", self._map)[0] == before:
                self._last = Anchor(mono, value, error)
                return self._last
        if self._last is None:
            # Never read here before (a child started since): the anchor as the killed
            # writer left it, at worst its old and new fields mixed, a write apart.
            _, mono, value, error = _ANCHOR.unpack_from(self._map)
            self._last = Anchor(mono, value, error)
        return self._last

    def write(self, anchor: Anchor) -> None:
        (sequence,) = struct.unpack_from("<Q", self._map)
        writing = sequence + 1 if sequence % 2 == 0 else sequence + 2
        struct.pack_into("<Q", self._map, 0, writing)
        struct.pack_into("<ddd", self._map, 8, anchor.mono, anchor.value, anchor.error)
        struct.pack_into("<Q", self._map, 0, writing + 1)
        self._last = anchor

    def close(self) -> None:
        self._map.close()


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
