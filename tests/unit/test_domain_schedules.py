"""Schedules' pure logic (domain/schedules.py): cron checks, ticks in time zones and
across DST, jitter, and what fires at `now` under each catch-up policy, with Hypothesis
checking the firing loop against a model of the ticks."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from troth_server.domain import schedules as s
from troth_server.domain.errors import InvalidArgument
from troth_server.domain.promise import Payload

MINUTE = 60_000
HOUR = 60 * MINUTE
EMPTY = Payload(headers={}, data=b"")


def ms(text: str, zone: str = "UTC") -> int:
    moment = datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(zone))
    return round(moment.timestamp() * 1000)


def spec(cron: str = "0 * * * *", **kw: object) -> s.ScheduleSpec:
    base = s.ScheduleSpec(name="hourly", cron=cron, workflow="wf", group="g", args=EMPTY)
    return s.check_spec(replace(base, **kw))  # type: ignore[arg-type]


def field_of(call: object) -> str:
    with pytest.raises(InvalidArgument) as caught:
        call()  # type: ignore[operator]
    return caught.value.field


# --- checks ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cron", ["", "0 9 * *", "0 0 9 * * 1-5", "61 * * * *", "0 25 * * *", "0 9 * * MON-XYZ", "x"]
)
def test_a_bad_cron_is_refused_naming_the_field(cron: str) -> None:
    assert field_of(lambda: spec(cron)) == "cron"


def test_a_cron_naming_no_date_is_refused() -> None:
    assert field_of(lambda: spec("0 0 31 2 *")) == "cron"


@pytest.mark.parametrize("zone", ["Mars/Olympus", "", "../../etc/passwd", "EST5EDT,M3.2.0"])
def test_an_unknown_time_zone_is_refused(zone: str) -> None:
    assert field_of(lambda: spec(timezone=zone)) == "timezone"


def test_a_bad_catch_up_is_refused() -> None:
    assert field_of(lambda: s.check_catch_up("sometimes")) == "catch_up"
    assert s.check_catch_up("") is s.CatchUp.SKIP


@pytest.mark.parametrize("name", ["", "a b", "x@y", "n" * 201])
def test_a_bad_name_is_refused(name: str) -> None:
    assert field_of(lambda: spec(name=name)) == "name"


def test_jitter_is_bounded() -> None:
    assert field_of(lambda: spec(jitter_ms=-1)) == "jitter"
    assert field_of(lambda: spec(jitter_ms=s.MAX_JITTER_MS + 1)) == "jitter"


def test_whitespace_in_a_cron_is_normalised() -> None:
    assert spec(" 0   9 * *  1-5 ").cron == "0 9 * * 1-5"


# --- ticks -------------------------------------------------------------------------


def test_weekday_mornings_in_a_time_zone() -> None:
    weekday = spec("0 9 * * 1-5", timezone="Europe/Paris")
    friday_evening = ms("2026-12-04T18:00:00", "Europe/Paris")
    ticks = list(zip(range(2), s.ticks_after(weekday, friday_evening), strict=False))
    assert [t for _, t in ticks] == [
        ms("2026-12-07T09:00:00", "Europe/Paris"),  # Monday, not the weekend
        ms("2026-12-08T09:00:00", "Europe/Paris"),
    ]


def test_ticks_after_are_strictly_after_and_ticks_until_include_the_instant() -> None:
    hourly = spec()
    at = ms("2026-12-07T09:00:00")
    assert next(s.ticks_after(hourly, at)) == at + HOUR
    assert next(s.ticks_until(hourly, at)) == at
    assert next(s.ticks_until(hourly, at - 1)) == at - HOUR
    assert next(s.ticks_after(hourly, at - 1)) == at


def test_a_fixed_time_in_the_spring_forward_gap_runs_once_after_the_gap() -> None:
    # Europe/Paris, 2026-03-29: 02:00 -> 03:00; a 02:30 job runs at 03:00 that day.
    job = spec("30 2 * * *", timezone="Europe/Paris")
    ticks = [
        t for _, t in zip(range(3), s.ticks_after(job, ms("2026-03-28T12:00:00")), strict=False)
    ]
    assert ticks == [
        ms("2026-03-29T01:00:00"),  # 03:00 CEST, the first minute after the gap
        ms("2026-03-30T00:30:00"),  # 02:30 CEST
        ms("2026-03-31T00:30:00"),
    ]


def test_a_fixed_time_in_the_fall_back_overlap_runs_once() -> None:
    # Europe/Paris, 2026-10-25: 03:00 CEST -> 02:00 CET; 02:30 happens twice.
    job = spec("30 2 * * *", timezone="Europe/Paris")
    ticks = [
        t for _, t in zip(range(2), s.ticks_after(job, ms("2026-10-24T12:00:00")), strict=False)
    ]
    assert ticks == [ms("2026-10-25T00:30:00"), ms("2026-10-26T01:30:00")]


def test_an_interval_follows_real_time_through_the_overlap() -> None:
    every_half_hour = spec("*/30 * * * *", timezone="Europe/Paris")
    start = ms("2026-10-25T00:00:00")  # 02:00 CEST
    ticks = [t for _, t in zip(range(4), s.ticks_after(every_half_hour, start - 1), strict=False)]
    assert ticks == [start + i * 30 * MINUTE for i in range(4)]
    assert len({s.run_id("x", t) for t in ticks}) == 4  # distinct runs in both folds


def test_run_ids_name_the_schedule_and_the_tick_in_utc() -> None:
    assert s.run_id("nightly", ms("2026-12-07T09:00:00", "Europe/Paris")) == (
        "nightly@2026-12-07T08:00:00Z"
    )


@given(st.text(min_size=1, max_size=20), st.integers(0, 2**42), st.integers(0, s.MAX_JITTER_MS))
def test_jitter_is_deterministic_and_bounded(name: str, tick: int, jitter: int) -> None:
    first = s.jitter_for(name, tick, jitter)
    assert first == s.jitter_for(name, tick, jitter)
    assert 0 <= first <= jitter


def test_jitter_spreads_ticks() -> None:
    delays = {s.jitter_for("n", t * HOUR, 10 * MINUTE) for t in range(50)}
    assert len(delays) > 40


# --- what fires ----------------------------------------------------------------------


def made(cron: str = "0 * * * *", now: int = 0, **kw: object) -> s.Schedule:
    return s.created(spec(cron, **kw), now, "alice")


def test_nothing_fires_before_the_next_tick_nor_while_paused() -> None:
    start = ms("2026-12-07T09:10:00")
    hourly = made(now=start)
    assert hourly.next_tick == ms("2026-12-07T10:00:00")
    assert s.plan(hourly, hourly.next_tick - 1) is None
    assert s.plan(s.paused(hourly, start), start + 10 * HOUR) is None


def test_on_time_a_tick_runs_under_every_policy() -> None:
    for policy in s.CatchUp:
        hourly = made(now=ms("2026-12-07T09:10:00"), catch_up=policy)
        firing = s.plan(hourly, ms("2026-12-07T10:00:01"))
        assert firing is not None
        assert firing.runs == (ms("2026-12-07T10:00:00"),)
        assert firing.next_tick == ms("2026-12-07T11:00:00")
        assert firing.skipped == 0


def test_after_downtime_skip_runs_none_one_runs_the_latest_all_runs_each() -> None:
    before = ms("2026-12-07T09:10:00")
    after = ms("2026-12-07T14:30:00")  # ticks 10:00 .. 14:00 missed
    missed = tuple(ms(f"2026-12-07T{h}:00:00") for h in range(10, 15))
    plans = {p: s.plan(made(now=before, catch_up=p), after) for p in s.CatchUp}
    assert plans[s.CatchUp.SKIP] is not None and plans[s.CatchUp.SKIP].runs == ()
    assert plans[s.CatchUp.SKIP].skipped == 5
    assert plans[s.CatchUp.ONE] is not None and plans[s.CatchUp.ONE].runs == missed[-1:]
    assert plans[s.CatchUp.ONE].skipped == 4
    assert plans[s.CatchUp.ALL] is not None and plans[s.CatchUp.ALL].runs == missed
    for firing in plans.values():
        assert firing is not None and firing.next_tick == ms("2026-12-07T15:00:00")


def test_all_is_bounded() -> None:
    every_minute = made("* * * * *", now=0, catch_up=s.CatchUp.ALL)
    firing = s.plan(every_minute, 1000 * MINUTE)
    assert firing is not None
    assert len(firing.runs) == s.MAX_CATCH_UP
    assert firing.runs[-1] == 1000 * MINUTE
    assert firing.skipped >= 1
    assert firing.next_tick == 1001 * MINUTE


def test_a_resumed_schedule_starts_after_now() -> None:
    hourly = s.paused(made(now=0), 0)
    again = s.resumed(hourly, 5 * HOUR + 1)
    assert again.next_tick == 6 * HOUR and not again.paused


def test_a_jittered_tick_waits_and_so_do_the_ticks_after_it() -> None:
    job = made("* * * * *", now=0, jitter_ms=10 * MINUTE, catch_up=s.CatchUp.ALL)
    assert job.next_tick == MINUTE
    assert job.next_fire_time == MINUTE + s.jitter_for("hourly", MINUTE, 10 * MINUTE)
    firing = s.plan(job, job.next_fire_time)  # type: ignore[arg-type]
    assert firing is not None and firing.runs[0] == MINUTE
    ticks = [*firing.runs, firing.next_tick]
    assert ticks == sorted(ticks)


@settings(max_examples=80, deadline=None)
@given(
    policy=st.sampled_from(list(s.CatchUp)),
    cron=st.sampled_from(
        ["* * * * *", "*/7 * * * *", "0 * * * *", "15 3 * * *", "30 2 * * *", "*/30 1-3 * * *"]
    ),
    zone=st.sampled_from(["UTC", "Europe/Paris", "America/New_York"]),
    start=st.sampled_from(
        [
            "2026-12-07T00:00:00",
            "2026-03-28T22:00:00",
            "2026-10-24T22:00:00",
            "2026-03-07T22:00:00",
            "2026-10-31T22:00:00",
        ]
    ),
    jitter=st.sampled_from([0, 20_000, 5 * MINUTE]),
    steps=st.lists(st.integers(1, 3 * HOUR), min_size=1, max_size=25),
)
def test_the_firing_loop_runs_each_tick_at_most_once_in_order(
    policy: s.CatchUp, cron: str, zone: str, start: str, jitter: int, steps: list[int]
) -> None:
    """Advance `now` by random steps (a loop's interval, downtime, clock jumps forward),
    in time zones and across daylight-saving changes: no tick runs twice, runs come in
    tick order, every run is a real tick, and `all` within its bound loses none."""
    now = ms(start)
    schedule = s.created(spec(cron, catch_up=policy, jitter_ms=jitter, timezone=zone), now, None)
    ran: list[int] = []
    looked: list[int] = []
    for step in steps:
        now += step
        firing = s.plan(schedule, now)
        if firing is None:
            continue
        assert all(tick <= now for tick in firing.runs)
        ran.extend(firing.runs)
        looked.extend(firing.seen)
        schedule = s.fired(schedule, firing, now)
        assert schedule.next_tick is not None and schedule.next_tick > (ran or [0])[-1]
    assert ran == sorted(set(ran))
    real = set()
    for tick in s.ticks_after(spec(cron, timezone=zone), ms(start)):
        if tick > now:
            break
        real.add(tick)
    assert set(ran) <= real
    assert looked == sorted(set(looked))  # no due tick is looked at twice
    assert schedule.next_tick is not None
    passed = {t for t in real if t < schedule.next_tick}
    if len(real) <= s.MAX_CATCH_UP:
        # Every tick before the next one either ran or was counted skipped, none both.
        assert len(passed) == len(ran) + schedule.skipped
        assert set(ran) <= passed
        if policy is s.CatchUp.ALL:
            assert set(ran) == passed  # none lost


def test_an_update_runs_from_the_new_definitions_first_tick_and_keeps_the_record() -> None:
    hourly = made(now=0)
    firing = s.plan(hourly, HOUR + 1)
    assert firing is not None
    ran = s.fired(hourly, firing, HOUR + 1)
    quarterly = s.updated(ran, spec("*/15 * * * *"), HOUR + 2 * MINUTE)
    assert quarterly.next_tick == HOUR + 15 * MINUTE
    assert quarterly.last_run_id == ran.last_run_id and quarterly.create_time == 0
    still = s.updated(s.paused(ran, HOUR), spec("*/15 * * * *"), HOUR)
    assert still.paused and still.next_tick is None
