"""Schedules through the API on both stores (a SQLite file, the real PostgreSQL): a real
server (`Core` and its servicers, in this process, its store clock injected so that a
test moves time), the SDK's `Client.schedules`, and a real worker running the runs.

A schedule crosses a server restart and clock jumps (forward and back) with no tick run
twice and none lost under its catch-up policy; each field's mistake is INVALID_ARGUMENT
naming the field.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from _in_process import in_process_server
from _pg import fresh_schema
from _support import eventually

from troth import (
    AlreadyExistsError,
    Client,
    Context,
    InvalidArgumentError,
    NotFoundError,
    PromiseState,
    ScheduleInfo,
    Worker,
)

HOUR = 3_600_000
T0 = 1_796_000_000_000 - 1_796_000_000_000 % HOUR + 10 * 60_000  # hh:10:00 UTC
GROUP = "sched"


class Clock:
    """The store clock of the in-process server: tests move it."""

    def __init__(self, now: int) -> None:
        self._now = now
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            return self._now

    def set(self, now: int) -> None:
        with self._lock:
            self._now = now


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/sched.db"
    else:
        with fresh_schema() as url:
            yield url


def summarise(what: str) -> str:
    return f"report of {what}"


def report(ctx: Context, what: str) -> Iterator[Any]:
    return (yield ctx.run(summarise, what))


def runs_of(client: Client, name: str) -> list[str]:
    page = client.search(tags={"troth:schedule": name}, page_size=500)
    return sorted(p.id for p in page.promises)


def at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def run_id(name: str, ms: int) -> str:
    return f"{name}@{at(ms).strftime('%Y-%m-%dT%H:%M:%SZ')}"


def test_a_schedule_starts_one_run_per_tick_across_a_restart_and_clock_jumps(
    db_url: str,
) -> None:
    clock = Clock(T0)
    first = T0 + 50 * 60_000  # the next hour
    with in_process_server(db_url, clock=clock) as (address, _), Client(address) as client:
        created = client.schedules.create(
            "hourly", "report", "sales", cron="0 * * * *", group=GROUP, catch_up="all"
        )
        assert isinstance(created, ScheduleInfo)
        assert created.next_tick_time == at(first)
        worker = Worker(client, group=GROUP)
        worker.workflow(report)
        worker.start()
        try:
            clock.set(first + 1000)
            eventually(lambda: runs_of(client, "hourly") == [run_id("hourly", first)])
            assert client.handle(run_id("hourly", first)).result(timeout=20) == "report of sales"
            clock.set(first - HOUR)  # a jump back: nothing runs again
            clock.set(first + 30 * 60_000)
            schedule = client.schedules.get("hourly")
            assert schedule.last_run_id == run_id("hourly", first)
            assert schedule.next_tick_time == at(first + HOUR)
        finally:
            worker.stop()
    # Down for three hours and a half; the store clock jumped on meanwhile.
    clock.set(first + 3 * HOUR + 30 * 60_000)
    with in_process_server(db_url, clock=clock) as (address, _), Client(address) as client:
        missed = [run_id("hourly", first + h * HOUR) for h in range(1, 4)]
        eventually(lambda: runs_of(client, "hourly") == sorted([run_id("hourly", first), *missed]))
        assert client.schedules.get("hourly").skipped == 0
        clock.set(first + 4 * HOUR + 1000)
        eventually(lambda: len(runs_of(client, "hourly")) == 5)
        for promise_id in runs_of(client, "hourly"):
            promise = client.get(promise_id)
            assert promise.tags["troth:func"] == "report"
            ran = promise_id == run_id("hourly", first)  # the others wait for a worker
            assert promise.state is (PromiseState.RESOLVED if ran else PromiseState.PENDING)


def test_skip_runs_no_missed_tick_after_a_restart(db_url: str) -> None:
    clock = Clock(T0)
    first = T0 + 50 * 60_000
    with in_process_server(db_url, clock=clock) as (address, _), Client(address) as client:
        client.schedules.create("skipper", "report", "x", cron="0 * * * *", group=GROUP)
    clock.set(first + 5 * HOUR + 10 * 60_000)
    with in_process_server(db_url, clock=clock) as (address, _), Client(address) as client:
        eventually(lambda: client.schedules.get("skipper").skipped == 6)
        assert runs_of(client, "skipper") == []
        assert client.schedules.get("skipper").next_tick_time == at(first + 6 * HOUR)
        clock.set(first + 6 * HOUR + 500)
        eventually(lambda: runs_of(client, "skipper") == [run_id("skipper", first + 6 * HOUR)])


def test_create_get_list_pause_resume_delete(db_url: str) -> None:
    clock = Clock(T0)
    with in_process_server(db_url, clock=clock) as (address, _), Client(address) as client:
        made = client.schedules.create(
            "weekday-mornings", "report", "ops", cron="0 9 * * 1-5", group=GROUP,
            timezone="Europe/Paris", catch_up="one", jitter=timedelta(minutes=5),
            ttl=timedelta(hours=2),
        )  # fmt: skip
        assert made.timezone == "Europe/Paris" and made.catch_up == "one"
        assert made.jitter == timedelta(minutes=5) and made.ttl == timedelta(hours=2)
        assert made.next_tick_time is not None
        local = made.next_tick_time.astimezone(__import__("zoneinfo").ZoneInfo("Europe/Paris"))
        assert (local.hour, local.minute) == (9, 0) and local.weekday() < 5
        assert made.next_fire_time is not None
        assert timedelta(0) <= made.next_fire_time - made.next_tick_time <= timedelta(minutes=5)
        # A repeat of the same definition is the schedule; another one is refused.
        assert client.schedules.create(
            "weekday-mornings", "report", "ops", cron="0 9 * * 1-5", group=GROUP,
            timezone="Europe/Paris", catch_up="one", jitter=timedelta(minutes=5),
            ttl=timedelta(hours=2),
        ) == made  # fmt: skip
        with pytest.raises(AlreadyExistsError):
            client.schedules.create("weekday-mornings", "report", cron="0 10 * * *")
        client.schedules.create("b-second", "report", cron="*/5 * * * *", paused=True)
        assert [s.name for s in client.schedules.list()] == ["b-second", "weekday-mornings"]
        paused = client.schedules.pause("weekday-mornings")
        assert paused.paused and paused.next_tick_time is None
        assert client.schedules.pause("weekday-mornings").paused  # again: no change
        resumed = client.schedules.resume("b-second")
        assert not resumed.paused and resumed.next_tick_time == at(T0 - T0 % 300_000 + 300_000)
        gone = client.schedules.delete("b-second")
        assert gone.name == "b-second"
        for call in (
            lambda: client.schedules.get("b-second"),
            lambda: client.schedules.pause("b-second"),
            lambda: client.schedules.resume("b-second"),
            lambda: client.schedules.delete("b-second"),
        ):
            with pytest.raises(NotFoundError):
                call()


BAD: list[tuple[str, dict[str, Any]]] = [
    ("cron", {"cron": "0 9 * *"}),
    ("cron", {"cron": "0 9 * * MON-XYZ"}),
    ("cron", {"cron": "0 0 31 2 *"}),
    ("cron", {"cron": ""}),
    ("timezone", {"timezone": "Mars/Olympus"}),
    ("catch_up", {"catch_up": "sometimes"}),
    ("jitter", {"jitter": timedelta(hours=2)}),
    ("ttl", {"ttl": timedelta(seconds=-1)}),
    ("name", {"name": "has space"}),
    ("name", {"name": "x@y"}),
    ("group", {"group": ""}),
]


def test_each_mistake_is_invalid_argument_naming_its_field(db_url: str) -> None:
    with in_process_server(db_url, clock=Clock(T0)) as (address, _), Client(address) as client:
        for field, change in BAD:
            kwargs: dict[str, Any] = {"cron": "0 * * * *", "group": GROUP, **change}
            name = kwargs.pop("name", "bad")
            with pytest.raises(InvalidArgumentError) as caught:
                client.schedules.create(name, "report", **kwargs)
            assert caught.value.field == field, (change, caught.value)
        assert client.schedules.list() == []


def test_search_schedules_pages_by_name(db_url: str) -> None:
    import grpc

    from troth.v1 import schedules_pb2, tasks_pb2_grpc

    with in_process_server(db_url, clock=Clock(T0)) as (address, _), Client(address) as client:
        names = [f"s{i:02d}" for i in range(5)]
        for name in reversed(names):
            client.schedules.create(name, "report", cron="0 * * * *", group=GROUP)
        with grpc.insecure_channel(address) as channel:
            stub = tasks_pb2_grpc.TaskServiceStub(channel)
            request = schedules_pb2.SearchSchedulesRequest(page_size=2)
            seen: list[str] = []
            while True:
                page = stub.SearchSchedules(request, timeout=10)
                assert len(page.schedules) <= 2
                seen.extend(s.name for s in page.schedules)
                if not page.next_page_token:
                    break
                request.page_token = page.next_page_token
        assert seen == names
        assert [s.name for s in client.schedules.list()] == names


def test_update_replaces_the_definition_and_runs_from_its_first_tick_after_now(
    db_url: str,
) -> None:
    clock = Clock(T0)
    first = T0 + 50 * 60_000
    with in_process_server(db_url, clock=clock) as (address, _), Client(address) as client:
        client.schedules.create("moving", "report", "a", cron="0 * * * *", group=GROUP)
        clock.set(first + 1000)
        eventually(lambda: runs_of(client, "moving") == [run_id("moving", first)])
        changed = client.schedules.update("moving", cron="*/15 * * * *", args=["b"])
        assert changed.cron == "*/15 * * * *" and changed.workflow == "report"
        assert client.decode(changed.args) == ["b"]
        assert changed.next_tick_time == at(first + 15 * 60_000)
        assert changed.last_run_id == run_id("moving", first)
        assert client.schedules.update("moving") == changed  # nothing given: the same
        paused = client.schedules.pause("moving")
        still = client.schedules.update("moving", catch_up="all")
        assert still.paused and still.next_tick_time is None and still.catch_up == "all"
        assert paused.cron == still.cron
        with pytest.raises(InvalidArgumentError) as caught:
            client.schedules.update("moving", timezone="Nowhere/Else")
        assert caught.value.field == "timezone"
        with pytest.raises(NotFoundError):
            client.schedules.update("nothing-here", cron="0 * * * *")
