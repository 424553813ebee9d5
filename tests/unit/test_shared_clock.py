"""Several server processes on one SQLite file: their one clock (`clock.SharedClock`,
`Anchor`, `ClockFile`), and the supervisor's pure parts (`troth serve --processes`)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from troth._grpc_args import ARG_ALLOW_REUSEPORT
from troth_server.app import grpc_options
from troth_server.clock import SLEW, Anchor, ClockFile, GuardedClock, SharedClock
from troth_server.config import Settings, parse_processes, settings_from
from troth_server.supervisor import (
    GIVE_UP_AFTER,
    ChildRole,
    resolved_listen,
    restart_delay,
)

T0 = 1_800_000_000_000
HOUR = 3_600_000


class Memory:
    """An anchor store in memory (`ClockFile` is the one in a file)."""

    def __init__(self, anchor: Anchor) -> None:
        self.anchor = anchor

    def read(self) -> Anchor:
        return self.anchor

    def write(self, anchor: Anchor) -> None:
        self.anchor = anchor


class Sources:
    def __init__(self) -> None:
        self.wall = T0
        self.mono = 1_000.0

    def advance(self, ms: float) -> None:
        self.mono += ms
        self.wall += int(ms)


def test_the_anchor_starts_at_the_wall_clock_or_the_newest_stored_time() -> None:
    assert Anchor.start(5.0, T0, 0).at(5.0) == T0
    behind = Anchor.start(5.0, T0, T0 + HOUR)
    assert behind.at(5.0) == T0 + HOUR  # never before what the database holds
    assert behind.at(1_005.0) == T0 + HOUR + 1_000 * (1 - SLEW)  # slewing back, slowly


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=0, max_value=2 * HOUR),
    st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=60_000, allow_nan=False),
            st.integers(min_value=-2 * HOUR, max_value=2 * HOUR),
            st.booleans(),
            st.integers(min_value=0, max_value=2),
        ),
        max_size=40,
    ),
)
def test_every_process_reads_one_clock_that_never_goes_back(
    floor_ahead: int, steps: list[tuple[float, int, bool, int]]
) -> None:
    """Three processes over one anchor, any of them writing (moving it) or reading at any
    time, the wall clock jumping: they read the same time, which never goes back and
    whose every interval is the monotonic one within SLEW, as `GuardedClock`'s."""
    s = Sources()
    shared = Memory(Anchor.start(s.mono, s.wall, T0 + floor_ahead))
    clocks = [SharedClock(shared, lambda: s.wall, lambda: s.mono) for _ in range(3)]
    last = clocks[0]()
    assert last >= T0 + floor_ahead
    for elapsed, jump, writes, which in steps:
        s.advance(elapsed)
        s.wall += jump
        clock = clocks[which]
        now = clock.in_transaction(None) if writes else clock()  # type: ignore[arg-type]
        assert {c() for c in clocks} == {now}
        assert now >= last
        assert (1 - SLEW) * elapsed - 1 <= now - last <= (1 + SLEW) * elapsed + 1
        last = now


def test_written_every_second_it_keeps_time_as_the_one_server_clock_does() -> None:
    s = Sources()
    guarded = GuardedClock(lambda: s.wall, lambda: s.mono)
    shared = SharedClock(Memory(Anchor.start(s.mono, s.wall, 0)), lambda: s.wall, lambda: s.mono)
    s.wall += 60_000  # someone sets the wall clock a minute ahead
    for _ in range(13_000):  # 3 h 36 min, a write each second
        s.advance(1_000)
        # The anchor learns of the jump at a write, and slews from then: one write late.
        assert abs(shared.in_transaction(None) - guarded()) <= SLEW * 1_000 + 1  # type: ignore[arg-type]
    assert shared() == guarded() == s.wall


def test_the_clock_file_is_shared_by_every_mapping(tmp_path: Path) -> None:
    path = tmp_path / "troth.db.clock"
    ClockFile.create(path, Anchor(10.0, float(T0), 250.0))
    one, two = ClockFile(path), ClockFile(path)
    assert two.read() == Anchor(10.0, float(T0), 250.0)
    one.write(Anchor(20.0, float(T0 + 10), -5.0))
    assert two.read() == Anchor(20.0, float(T0 + 10), -5.0)
    one.close()
    two.close()


def test_a_writer_killed_halfway_leaves_the_last_anchor_read(tmp_path: Path) -> None:
    path = tmp_path / "troth.db.clock"
    ClockFile.create(path, Anchor(10.0, float(T0), 0.0))
    reader = ClockFile(path)
    with open(path, "r+b") as file:  # the sequence number odd: a write never finished
        file.write(struct.pack("<Q", 7))
        file.seek(8)
        file.write(struct.pack("<d", 99.0))
    assert reader.read() == Anchor(10.0, float(T0), 0.0)
    writer = ClockFile(path)  # a child started since: takes it as it was left
    assert writer.read() == Anchor(99.0, float(T0), 0.0)
    writer.write(Anchor(30.0, float(T0 + 20), 0.0))  # the next writer mends it
    assert reader.read() == Anchor(30.0, float(T0 + 20), 0.0)


def test_a_clock_file_that_holds_no_anchor_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    with pytest.raises(ValueError, match="no clock anchor"):
        ClockFile(tmp_path / "empty")


# -- the supervisor's parts -----------------------------------------------------------


def test_processes_is_a_number_or_auto() -> None:
    assert settings_from([]).processes == 1
    assert settings_from(["--processes", "3"]).processes == 3
    assert settings_from([], {"TROTH_PROCESSES": "auto"}).processes == len(os.sched_getaffinity(0))
    for bad in ("0", "-1", "two"):
        with pytest.raises(ValueError):
            parse_processes(bad)
    with pytest.raises(SystemExit):
        settings_from(["--processes", "2", "--listen", "unix:/tmp/troth.sock"])


def test_only_several_processes_share_the_port() -> None:
    assert (ARG_ALLOW_REUSEPORT, 0) in grpc_options(Settings())
    assert (ARG_ALLOW_REUSEPORT, 1) in grpc_options(Settings(processes=2))


def test_a_child_serves_on_the_port_child_0_bound() -> None:
    assert resolved_listen("0.0.0.0:0", 7071) == "0.0.0.0:7071"
    assert resolved_listen("[::]:0", 7071) == "[::]:7071"


def test_the_console_is_served_by_child_0_alone() -> None:
    settings = Settings(processes=2, console_listen="127.0.0.1:7080", port_file="/x")
    for index in (0, 1):
        role = ChildRole(index, 2, 1, "127.0.0.1:7071", f"/tmp/port-{index}", None, index == 0)
        again = ChildRole.from_env({"TROTH_SERVE_CHILD": role.to_env()})
        assert again == role
        child = role.apply(settings)
        assert (child.listen, child.port_file, child.processes) == (
            "127.0.0.1:7071",
            f"/tmp/port-{index}",
            2,
        )
        assert child.console_listen == ("127.0.0.1:7080" if index == 0 else None)
    assert ChildRole.from_env({}) is None


def test_a_child_is_restarted_later_each_time_it_dies_before_serving_then_given_up() -> None:
    assert restart_delay(0) == 0.5  # it had served: at once, nearly
    delays = [restart_delay(n) for n in range(1, GIVE_UP_AFTER)]
    assert delays == sorted(delays) and all(d is not None and d <= 15 for d in delays)
    assert restart_delay(GIVE_UP_AFTER) is None  # a fault a restart does not mend
