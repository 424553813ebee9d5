"""Schedules through the real single writer on both stores (SQLite file, PostgreSQL):
a tick fires once, with its run started in the same transaction; a restart (a new
writer and store over the same database) and a clock jump start no tick twice and lose
none under the policy; the due read walks `ix_schedules_due`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from _pg import fresh_schema

from troth_server.domain import schedules as s
from troth_server.domain.promise import Payload, PromiseState
from troth_server.domain.schedules import CatchUp, ScheduleAlreadyExists, ScheduleSpec
from troth_server.schedules import Scheduler, ScheduleService
from troth_server.store import Store, open_store
from troth_server.store._schedules import select_due, soonest
from troth_server.writes.group_commit import GroupCommitter

HOUR = 3_600_000
T0 = 1_796_000_000_000 - 1_796_000_000_000 % HOUR + 10 * 60_000  # hh:10:00 UTC
ARGS = Payload(headers={"content-type": "application/json"}, data=b'["x"]')


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/s.db"
    else:
        with fresh_schema() as url:
            yield url


class Server:
    """The store, the writer and the schedule service, as `Core` wires them."""

    def __init__(self, url: str, clock: Clock, processes: int = 1) -> None:
        self.store: Store = open_store(url, migrate=True, processes=processes)
        self.committer = GroupCommitter(self.store, clock, on_commit=lambda changes: None)
        self.committer.start()
        self.service = ScheduleService(self.store, self.committer, clock, 30 * 24 * HOUR)
        self.scheduler = Scheduler(self.service, interval=60.0)

    def close(self) -> None:
        self.committer.stop()
        self.store.close()

    def create(self, spec: ScheduleSpec) -> tuple[s.Schedule, bool]:
        from troth_server.writes.ops.schedules import CreateScheduleOp

        return self.committer.submit(CreateScheduleOp(spec, "alice"))

    def runs(self, name: str) -> list[str]:
        return sorted(
            p.id for p in self.store.get_promises([f"{name}@{s.tick_text(t)}" for t in _hours(60)])
        )


def _hours(n: int) -> list[int]:
    start = T0 - T0 % HOUR
    return [start + i * HOUR for i in range(-2, n)]


def hourly(name: str = "hourly", catch_up: CatchUp = CatchUp.SKIP) -> ScheduleSpec:
    return s.check_spec(
        ScheduleSpec(
            name=name, cron="0 * * * *", workflow="report", group="g", args=ARGS,
            catch_up=catch_up,
        )
    )  # fmt: skip


def test_a_tick_starts_one_run_in_the_transaction_that_advances_it(db_url: str) -> None:
    clock = Clock(T0)
    server = Server(db_url, clock)
    try:
        schedule, created = server.create(hourly())
        assert created and schedule.next_tick == T0 + 50 * 60_000
        again, created = server.create(hourly())
        assert not created and again == schedule
        with pytest.raises(ScheduleAlreadyExists):
            server.create(hourly(catch_up=CatchUp.ALL))
        assert server.scheduler.run_once() == []
        clock.now = schedule.next_tick + 500  # type: ignore[operator]
        started = server.scheduler.run_once()
        assert started == [f"hourly@{s.tick_text(schedule.next_tick)}"]  # type: ignore[arg-type]
        (run,) = server.store.get_promises(started)
        assert run.state is PromiseState.PENDING
        assert run.param == ARGS
        assert run.tags["troth:invoke"] == "g" and run.tags["troth:func"] == "report"
        assert run.tags[s.SCHEDULE_TAG] == "hourly"
        assert run.started_by == "alice"
        assert server.store.active_tasks(started)[started[0]].group == "g"
        # The same instant again: nothing is due.
        assert server.scheduler.run_once() == []
        stored = server.service.get("hourly")
        assert stored.next_tick == schedule.next_tick + HOUR  # type: ignore[operator]
        assert stored.last_run_id == started[0]
    finally:
        server.close()


@pytest.mark.parametrize(
    ("policy", "expected"),
    [(CatchUp.SKIP, 0), (CatchUp.ONE, 1), (CatchUp.ALL, 5)],
)
def test_a_restart_and_a_clock_jump_run_each_tick_at_most_once(
    db_url: str, policy: CatchUp, expected: int
) -> None:
    clock = Clock(T0)
    server = Server(db_url, clock)
    try:
        schedule, _ = server.create(hourly(catch_up=policy))
        first = schedule.next_tick
        assert first is not None
        clock.now = first + 1000
        assert len(server.scheduler.run_once()) == 1
    finally:
        server.close()  # the server goes away ...
    clock.now = first + 5 * HOUR + 30 * 60_000  # ... and comes back 5 h 30 later
    server = Server(db_url, clock)
    try:
        started = server.scheduler.run_once()
        assert len(started) == expected
        assert len(set(started)) == len(started)
        assert server.scheduler.run_once() == []
        clock.now -= 2 * HOUR  # a jump back: nothing again
        assert server.scheduler.run_once() == []
        clock.now = first + 6 * HOUR + 1000  # and forward past the next tick: it runs once
        assert len(server.scheduler.run_once()) == 1
        assert server.scheduler.run_once() == []
        ran = set(server.runs("hourly"))
        assert len(ran) == 1 + expected + 1
        if policy is CatchUp.ALL:  # none lost
            assert ran == {f"hourly@{s.tick_text(first + h * HOUR)}" for h in range(7)}
        if policy is CatchUp.ONE:  # the latest missed one
            assert f"hourly@{s.tick_text(first + 5 * HOUR)}" in ran
        stored = server.service.get("hourly")
        assert stored.skipped == 5 - expected
    finally:
        server.close()


def test_two_writers_on_one_database_start_each_tick_once(db_url: str) -> None:
    """Two replicas' writers (on SQLite, two server processes': `troth serve --processes`)
    fire the same due schedules: each tick starts one run."""
    clock = Clock(T0)
    a, b = Server(db_url, clock, processes=2), Server(db_url, clock, processes=2)
    try:
        for i in range(10):
            a.create(hourly(f"h{i}", CatchUp.ALL))
        clock.now = T0 + 3 * HOUR
        started = a.scheduler.run_once() + b.scheduler.run_once()
        assert len(started) == len(set(started)) == 30
    finally:
        a.close()
        b.close()


def test_pause_resume_and_delete(db_url: str) -> None:
    clock = Clock(T0)
    server = Server(db_url, clock)
    try:
        from troth_server.writes.ops.schedules import DeleteScheduleOp, PauseScheduleOp

        server.create(hourly())
        paused, changed = server.committer.submit(PauseScheduleOp("hourly", True))
        assert changed and paused.paused and paused.next_fire_time is None
        clock.now = T0 + 3 * HOUR
        assert server.scheduler.run_once() == []
        resumed, changed = server.committer.submit(PauseScheduleOp("hourly", False))
        assert changed and resumed.next_tick == T0 - T0 % HOUR + 4 * HOUR
        clock.now = resumed.next_tick + 1  # type: ignore[operator]
        assert len(server.scheduler.run_once()) == 1
        assert [x.name for x in server.service.list("", 10)] == ["hourly"]
        server.committer.submit(DeleteScheduleOp("hourly"))
        assert server.service.list("", 10) == []
        clock.now += 2 * HOUR
        assert server.scheduler.run_once() == []
    finally:
        server.close()


def test_the_due_reads_walk_their_index(db_url: str) -> None:
    """The loop's reads of what is due (the soonest fire time, read each pass; the due
    schedules, locked by the writer) walk `ix_schedules_due` (the active schedules by
    fire time), whatever the number of paused ones."""
    store = open_store(db_url, migrate=True)
    store.close()
    params = {"now": T0, "limit": 20}
    statements = (select_due, soonest)
    if db_url.startswith("sqlite"):
        import sqlite3

        from sqlalchemy.dialects import sqlite as sqlite_dialect

        conn = sqlite3.connect(db_url.removeprefix("sqlite:///"))
        try:
            for statement in statements:
                compiled = statement.compile(dialect=sqlite_dialect.dialect())
                names = compiled.positiontup or ()
                values = [{**compiled.params, **params}[name] for name in names]
                rows = conn.execute("EXPLAIN QUERY PLAN " + str(compiled), values).fetchall()
                plan = "\n".join(str(r[-1]) for r in rows)
                assert "INDEX ix_schedules_due" in plan, plan
                assert "TEMP B-TREE" not in plan, plan  # the index gives the order too
        finally:
            conn.close()
        return
    conninfo = db_url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO schedules (name, cron, timezone, workflow, "group", args_headers,
                 args_data, catch_up, jitter_ms, paused, next_tick, next_fire_time, skipped,
                 create_time, update_time)
               SELECT 's' || g, '0 * * * *', 'UTC', 'wf', 'g', '{}', '', 'skip', 0,
                 g % 10 <> 0, CASE WHEN g % 10 = 0 THEN g END, CASE WHEN g % 10 = 0 THEN g END,
                 0, 0, 0
               FROM generate_series(1, 50000) g"""
        )
        conn.execute("ANALYZE schedules")
        for statement in statements:
            sql = str(statement.compile(dialect=_pg_dialect()))
            rows = conn.execute("EXPLAIN " + sql, {**params, "now": 10_000}).fetchall()
            plan = "\n".join(str(r[0]) for r in rows)
            assert "ix_schedules_due" in plan, plan
            assert "Seq Scan on schedules" not in plan, plan


def _pg_dialect() -> object:
    from sqlalchemy.dialects import postgresql

    return postgresql.psycopg.dialect()


def test_a_crash_before_the_commit_leaves_the_tick_to_fire_once(db_url: str) -> None:
    """The advance and the run's start share one transaction: a firing that dies before
    its commit (the process killed, the store gone) leaves neither, and the next pass
    fires the tick, once."""
    from troth_server.writes.ops.schedules import FireSchedulesOp

    class Crash(Exception):
        pass

    clock = Clock(T0)
    server = Server(db_url, clock)
    try:
        schedule, _ = server.create(hourly())
        assert schedule.next_tick is not None
        clock.now = schedule.next_tick + 1000

        def dies(tx: object) -> None:
            op = FireSchedulesOp(20, HOUR)
            keys = op.keys(tx, clock.now)  # type: ignore[arg-type]
            assert list(keys.promises) == [f"hourly@{s.tick_text(schedule.next_tick)}"]  # type: ignore[arg-type]
            raise Crash

        with pytest.raises(Crash):
            server.store.write(dies)
        assert server.service.get("hourly").next_tick == schedule.next_tick
        assert server.runs("hourly") == []
        assert server.scheduler.run_once() == [f"hourly@{s.tick_text(schedule.next_tick)}"]
        assert server.scheduler.run_once() == []
    finally:
        server.close()
