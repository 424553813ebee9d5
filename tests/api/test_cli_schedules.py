"""`troth schedules create|list|show|pause|resume|delete` against a real `troth serve` on
SQLite and PostgreSQL; and a schedule across restarts of `troth serve` whose wall clock
jumps (`TROTH_TEST_CLOCK_FILE`), firing each tick at most once."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from _support import ServerProcess, eventually, start_server
from _support import run_cli as troth

from troth import Client


def test_create_list_show_pause_resume_delete(
    server: ServerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"mornings-{uuid.uuid4().hex[:8]}"
    code, out, err = troth(
        server, capsys, "schedules", "create", name, "--cron", "0 9 * * 1-5",
        "--workflow", "report", "--args", '["sales", 7]', "--group", "g",
        "--timezone", "Europe/Paris", "--catch-up", "one", "--jitter", "5m",
    )  # fmt: skip
    assert code == 0, err
    assert out.startswith(f"schedule {name} created\n\n")
    assert "0 9 * * 1-5 (Europe/Paris)" in out and "report on group g" in out
    assert '["sales", 7]' in out
    code, out, _ = troth(server, capsys, "schedules", "list")
    assert code == 0 and name in out and "NEXT TICK" in out
    code, out, _ = troth(server, capsys, "--json", "schedules", "show", name)
    shown = json.loads(out)
    assert shown["args"] == ["sales", 7] and shown["catch_up"] == "one"
    assert shown["jitter"] == "5m" and not shown["paused"]
    tick = datetime.fromisoformat(shown["next_tick_time"].replace("Z", "+00:00"))
    assert tick.astimezone(__import__("zoneinfo").ZoneInfo("Europe/Paris")).hour == 9
    code, out, _ = troth(server, capsys, "schedules", "update", name, "--cron", "0 8 * * 1-5")
    assert code == 0 and out.startswith(f"schedule {name} updated")
    assert "0 8 * * 1-5 (Europe/Paris)" in out and '["sales", 7]' in out  # the rest kept
    code, out, _ = troth(server, capsys, "--json", "schedules", "pause", name)
    assert json.loads(out)["paused"] and json.loads(out)["next_tick_time"] is None
    code, out, _ = troth(server, capsys, "schedules", "resume", name)
    assert code == 0 and out.startswith(f"schedule {name} resumed")
    code, out, _ = troth(server, capsys, "schedules", "delete", name)
    assert code == 0
    code, _, err = troth(server, capsys, "schedules", "show", name)
    assert code != 0 and "does not exist" in err


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (("--cron", "0 9 * *"), "cron"),
        (("--cron", "0 9 * * 1", "--timezone", "Mars/Olympus"), "timezone"),
        (("--cron", "0 9 * * 1", "--catch-up", "sometimes"), "catch_up"),
    ],
)
def test_a_mistake_names_its_field(
    server: ServerProcess, capsys: pytest.CaptureFixture[str], flags: tuple[str, ...], field: str
) -> None:
    code, _, err = troth(
        server, capsys, "schedules", "create", "bad", "--workflow", "report", *flags
    )
    assert code != 0
    assert f"{field}:" in err, err


HOUR_S = 3600


def _offset_to(clock_file: Path, seconds: float) -> None:
    tmp = clock_file.with_suffix(".tmp")
    tmp.write_text(repr(seconds))
    tmp.replace(clock_file)


def _runs(client: Client, name: str) -> list[str]:
    return sorted(p.id for p in client.search(tags={"troth:schedule": name}).promises)


def test_restarts_and_clock_jumps_of_troth_serve_run_each_tick_once(tmp_path: Path) -> None:
    """SQLite: the server's clock is its own, slewed on a wall clock jump while it runs
    (a jump fires nothing at once) and anchored to the wall clock at a start (a restart
    after a jump catches up, under the schedule's policy, once)."""
    clock_file = tmp_path / "clock-offset"
    _offset_to(clock_file, 0.0)
    db = f"sqlite:///{tmp_path / 'troth.db'}"
    env = {"TROTH_TEST_CLOCK_FILE": str(clock_file)}

    def serve() -> ServerProcess:
        return start_server(tmp_path / "s", "--sweep-interval", "100ms", db_url=db, env=env)

    server = serve()
    try:
        with Client(server.address) as client:
            made = client.schedules.create(
                "hourly", "report", cron="0 * * * *", group="g", catch_up="one"
            )
            assert made.next_tick_time is not None
            first = made.next_tick_time
            # A jump of 3 h while it runs: the clock slews towards it, no tick fires.
            ahead = (first - datetime.now(UTC)).total_seconds() + 2 * HOUR_S + 600
            _offset_to(clock_file, ahead)
            # Nothing to await for a tick that must not fire: watch five passes' worth.
            time.sleep(0.5)
            assert _runs(client, "hourly") == []
    finally:
        server.stop()
    server = serve()  # back, its clock at the jumped wall clock: 3 ticks missed
    try:
        with Client(server.address) as client:
            latest = first + timedelta(hours=2)
            expected = [f"hourly@{latest.strftime('%Y-%m-%dT%H:%M:%SZ')}"]
            eventually(lambda: _runs(client, "hourly") == expected)
            eventually(lambda: client.schedules.get("hourly").skipped == 2)
    finally:
        server.stop()
    server = serve()  # again at the same time: nothing more
    try:
        with Client(server.address) as client:
            time.sleep(0.5)  # five passes' worth of the 100 ms loop: nothing more fires
            assert _runs(client, "hourly") == expected
            assert client.schedules.get("hourly").last_run_id == expected[0]
    finally:
        server.stop()
