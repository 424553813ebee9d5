"""The server's clock (troth_server.clock): pure, with injected time sources."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from troth_server.clock import (
    SLEW,
    DatabaseClock,
    GuardedClock,
    OutageGuard,
    WallClock,
    transaction_clock,
)
from troth_server.domain import task as tasks
from troth_server.domain.task import UNKNOWN_LEASE_MS, Task, TaskKind, TaskState

T0 = 1_800_000_000_000
HOUR = 3_600_000


class Sources:
    """A wall clock and a monotonic clock (both ms) that only the test moves."""

    def __init__(self, wall: int = T0) -> None:
        self.wall = wall
        self.mono = 1_000.0

    def advance(self, ms: float) -> None:
        """Time passes: both clocks move."""
        self.mono += ms
        self.wall += int(ms)

    def jump(self, ms: int) -> None:
        """Someone sets the wall clock."""
        self.wall += ms

    def guarded(self, floor: int = 0) -> GuardedClock:
        return GuardedClock(lambda: self.wall, lambda: self.mono, floor=floor)


# -- GuardedClock --------------------------------------------------------------------


def test_starts_at_the_wall_clock_or_the_newest_stored_time() -> None:
    assert Sources().guarded()() == T0
    # The wall clock is behind what the database already holds: never go back.
    assert Sources().guarded(floor=T0 + HOUR)() == T0 + HOUR


def test_a_jump_forward_neither_takes_a_lease_nor_expires_everything() -> None:
    s = Sources()
    clock = s.guarded()
    lease_expires = clock() + 10_000  # a heartbeat with a 10 s lease
    promise_expires = clock() + 30_000
    s.advance(1_000)
    s.jump(60_000)
    for _ in range(8):  # 8 s later, in steps
        s.advance(1_000)
        assert clock() < lease_expires
    assert clock() <= T0 + 9_000 * (1 + SLEW) + 1
    assert clock() < promise_expires


def test_a_jump_back_keeps_neither_a_lease_nor_a_timeout() -> None:
    s = Sources()
    clock = s.guarded()
    lease_expires = clock() + 2_000
    timeout = clock() + 60_000
    s.jump(-HOUR)
    s.advance(2_000 / (1 - SLEW) + 1)
    assert clock() >= lease_expires
    s.advance(58_000 / (1 - SLEW) + 1)
    assert clock() >= timeout  # on time, give or take the slew: not an hour late


def test_follows_the_wall_clock_slowly_and_then_exactly() -> None:
    s = Sources()
    clock = s.guarded()
    s.jump(1_000)
    s.advance(1_000)
    assert clock() == T0 + 1_000 + 5  # 5 ms of the jump per second
    s.advance(1_000_000)  # long after: caught up, and then it stays with the wall clock
    assert clock() == s.wall
    s.advance(12_345)
    assert clock() == s.wall


def test_never_goes_back_even_if_the_monotonic_source_does() -> None:
    s = Sources()
    clock = s.guarded()
    s.advance(5_000)
    before = clock()
    s.mono -= 3_000
    s.jump(-HOUR)
    assert clock() >= before


def test_in_a_transaction_it_is_the_same_clock() -> None:
    s = Sources()
    clock = s.guarded()
    assert transaction_clock(clock)(None) == clock()  # type: ignore[arg-type]
    assert transaction_clock(lambda: 42)(None) == 42  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=0, max_value=2 * HOUR),
    st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=60_000, allow_nan=False),
            st.integers(min_value=-2 * HOUR, max_value=2 * HOUR),
        ),
        max_size=40,
    ),
)
def test_intervals_are_monotonic_within_the_slew_whatever_the_wall_clock_does(
    floor_ahead: int, steps: list[tuple[float, int]]
) -> None:
    """Any sequence of elapsed times and wall clock jumps: the clock never goes back, starts
    at or after the floor, and every interval it shows is the monotonic one within SLEW."""
    s = Sources()
    clock = s.guarded(floor=T0 + floor_ahead)
    last = clock()
    assert last >= T0 + floor_ahead
    for elapsed, jump in steps:
        s.advance(elapsed)
        s.jump(jump)
        now = clock()
        assert now >= last
        # int() truncates, so one millisecond either way.
        assert (1 - SLEW) * elapsed - 1 <= now - last <= (1 + SLEW) * elapsed + 1
        last = now


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=-HOUR, max_value=HOUR),
    st.lists(st.floats(min_value=1, max_value=600_000, allow_nan=False), min_size=1, max_size=30),
)
def test_after_one_jump_the_gap_to_the_wall_clock_only_shrinks(
    jump: int, steps: list[float]
) -> None:
    s = Sources()
    clock = s.guarded()
    s.jump(jump)
    gap = abs(s.wall - clock())
    for elapsed in steps:
        s.advance(elapsed)
        now_gap = abs(s.wall - clock())
        assert now_gap <= gap + 1
        assert now_gap <= max(0.0, gap - SLEW * elapsed) + 2
        gap = now_gap


# -- WallClock and the test clock file -----------------------------------------------


@dataclass
class FakeTime:
    ns: int = T0 * 1_000_000
    mono_ns: int = 0


def test_the_test_clock_file_offsets_the_wall_clock(tmp_path: Path) -> None:
    t = FakeTime()
    offset = tmp_path / "offset"
    wall = WallClock(str(offset), time_ns=lambda: t.ns, monotonic_ns=lambda: t.mono_ns)
    assert wall() == T0  # missing file: no offset
    offset.write_text("")
    t.mono_ns += 50_000_000
    assert wall() == T0  # empty file: no offset
    offset.write_text("60.5")
    t.mono_ns += 50_000_000
    assert wall() == T0 + 60_500
    offset.write_text("-3600")
    t.mono_ns += 10_000_000
    assert wall() == T0 + 60_500  # re-read at most every 50 ms
    t.mono_ns += 40_000_000
    assert wall() == T0 - HOUR
    offset.write_text("not a number")
    t.mono_ns += 50_000_000
    assert wall() == T0


def test_without_the_environment_variable_it_is_the_wall_clock() -> None:
    wall = WallClock.from_env({})
    import time

    assert abs(wall() - time.time_ns() // 1_000_000) < 1_000


# -- DatabaseClock -------------------------------------------------------------------


class FakeTx:
    def __init__(self, now: int | None) -> None:
        self.now = now

    def database_time(self) -> int | None:
        return self.now


def test_writes_decide_at_the_databases_time_and_reads_never_estimate_early() -> None:
    mono = [0.0]
    db = [T0]
    reads: list[int] = []

    def read() -> int:
        reads.append(db[0])
        return db[0]

    clock = DatabaseClock(read, lambda: mono[0], max_age_ms=1_000)
    tx = FakeTx(T0 + 5)
    assert transaction_clock(clock)(tx) == T0 + 5  # type: ignore[arg-type]
    assert reads == []
    mono[0] += 300
    assert clock() == T0 + 305  # the reading plus the monotonic time since it was asked
    mono[0] += 2_000
    db[0] = T0 + 2_400
    assert clock() == T0 + 2_400  # stale: read again
    assert reads == [T0 + 2_400]
    with pytest.raises(TypeError):
        clock.in_transaction(FakeTx(None))  # type: ignore[arg-type]


def test_a_reading_is_timed_from_before_it_was_asked_for() -> None:
    """The database's time at the end of a round trip is at most the reading plus the
    round trip: timing it from when it was asked keeps the estimate never behind."""
    mono = [0.0]

    class SlowTx:
        def database_time(self) -> int:
            mono[0] += 40  # the round trip
            return T0

    clock = DatabaseClock(lambda: 0, lambda: mono[0])
    clock.in_transaction(SlowTx())  # type: ignore[arg-type]
    assert clock() == T0 + 40


# -- OutageGuard and the lease rule --------------------------------------------------


def test_the_guard_starts_a_grace_at_start_after_a_gap_and_after_a_store_failure() -> None:
    guard = OutageGuard(T0, 0.0, interval_ms=200)
    assert guard.tick(T0 + 200, 200.0) == T0  # the start
    assert guard.tick(T0 + 400, 400.0) == T0
    assert guard.tick(T0 + 5_400, 5_400.0) == T0 + 5_400  # frozen for 5 s
    assert guard.tick(T0 + 5_600, 5_600.0) == T0 + 5_400
    guard.store_failed()
    assert guard.tick(T0 + 5_800, 5_800.0) == T0 + 5_800
    assert guard.tick(T0 + 6_000, 6_000.0) == T0 + 5_800
    # A tick late by less than a second on a loaded machine is no outage.
    assert guard.tick(T0 + 7_000, 7_000.0) == T0 + 5_800


def _claimed(lease_ms: int | None) -> Task:
    task = tasks.create("t", "root", "g", TaskKind.INVOKE)
    return replace(tasks.claim(task, "w", T0, 2_000), lease_ms=lease_ms)


def test_an_outage_never_takes_a_lease() -> None:
    task = _claimed(2_000)
    assert task.lease_ms == 2_000 and task.lease_expire_time == T0 + 2_000
    assert tasks.lease_expired(task, T0 + 2_000)
    # The server came back at T0 + 5 s: the worker gets one lease length to heartbeat.
    back = T0 + 5_000
    assert not tasks.lease_expired(task, T0 + 6_999, back)
    assert tasks.lease_expired(task, T0 + 7_000, back)
    assert tasks.expire_lease(task, T0 + 6_999, back) is task
    assert tasks.expire_lease(task, T0 + 7_000, back).state is TaskState.PENDING
    renewed = tasks.heartbeat(task, "w", task.counter, T0 + 5_100, 3_000)
    assert (renewed.lease_expire_time, renewed.lease_ms) == (T0 + 8_100, 3_000)


def test_a_lease_from_before_leases_were_recorded_counts_as_the_longest() -> None:
    task = _claimed(None)
    back = T0 + 5_000
    assert not tasks.lease_expired(task, back + UNKNOWN_LEASE_MS - 1, back)
    assert tasks.lease_expired(task, back + UNKNOWN_LEASE_MS, back)
