"""Ctrl-C on a worker, and `troth worker`, with real processes.

`Worker.run()` in a plain script (no logging configured) logs its INFO lines to
stderr; the first SIGINT says what it waits for (which workflows, for how long
at most) and keeps waiting; the second stops at once: the held task is given
back (ReleaseTask: it is PENDING again long before its 60 s lease could run
out), the process exits 130 although a step function is still running, and no
traceback is printed. `troth worker FILE:build_worker --group G` builds the
worker with a client from its flags, logs what it does, and stops on one SIGINT.

This module is also the worker script (`python test_worker_interrupts.py ADDRESS`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Generator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))

from _support import ServerProcess, eventually, start_server
from _workers import EFFECTS_ENV, effect

from troth import Client, Context, Worker
from troth.v1 import tasks_pb2, tasks_pb2_grpc

GROUP = "interrupts"
TROTH = Path(sys.executable).parent / "troth"


def block(marker: str) -> str:
    """A step that runs far longer than any test: it returns only if its file appears."""
    effect(f"started {marker}")
    release = Path(os.environ[EFFECTS_ENV]).with_name(f"release-{marker}")
    deadline = time.monotonic() + 300
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return marker


def slow(ctx: Context, marker: str) -> Generator[Any, Any, str]:
    return (yield ctx.run(block, marker))


def hello(ctx: Context, name: str) -> Generator[Any, Any, str]:
    return (yield ctx.run(str.upper, name))


def build_worker(client: Client, group: str = GROUP) -> Worker:
    """The factory `troth worker` calls with its own client."""
    worker = Worker(client, group, lease=timedelta(seconds=60))
    worker.workflow(hello)
    worker.workflow(slow)
    return worker


def main(address: str) -> None:
    # No logging.basicConfig: Worker.run() must show its lines by itself.
    with Client(address) as client:
        worker = Worker(
            client, GROUP, lease=timedelta(seconds=60), shutdown_grace=timedelta(minutes=1)
        )
        worker.workflow(slow)
        worker.run()


if __name__ == "__main__":
    main(sys.argv[1])


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = start_server(tmp_path / "server")
    yield proc
    proc.stop(timeout=60)  # generous: the suite may run beside CPU hogs


def _spawn(command: list[str], log: Path, tmp_path: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, EFFECTS_ENV: str(tmp_path / "effects")}
    with log.open("wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)


def _wait_for(log: Path, proc: subprocess.Popen[bytes], text: str, timeout: float = 30) -> None:
    def seen() -> bool:
        assert proc.poll() is None, f"the worker exited ({proc.returncode}):\n{log.read_text()}"
        return text in log.read_text(errors="replace")

    eventually(seen, timeout, f"{text!r} in the worker's log")


def _task_states(server: ServerProcess, group: str) -> list[int]:
    with server.channel() as channel:
        stub = tasks_pb2_grpc.TaskServiceStub(channel)
        reply = stub.SearchTasks(tasks_pb2.SearchTasksRequest(group=group), timeout=10)
    return [task.state for task in reply.tasks]


def test_ctrl_c_twice_says_what_it_waits_for_then_stops_at_once(
    server: ServerProcess, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    proc = _spawn([sys.executable, __file__, server.address], log, tmp_path)
    try:
        # Logging was not configured, yet the worker's INFO lines are on stderr.
        _wait_for(log, proc, f"polling group '{GROUP}'")
        with Client(server.address) as client:
            client.start("slow", "m1", id="interrupt-slow-1", group=GROUP)
        eventually(lambda: "started m1" in _effects(tmp_path), 30, "the step to start")

        proc.send_signal(signal.SIGINT)
        _wait_for(log, proc, "got SIGINT: waiting up to 1m for 1 running task(s) "
                             "(workflows interrupt-slow-1)")  # fmt: skip
        _wait_for(log, proc, "press Ctrl-C again to stop at once")
        assert _task_states(server, GROUP) == [tasks_pb2.TASK_STATE_CLAIMED]  # still its

        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = log.read_text()
    assert "got a second signal: stopping now, giving the held tasks back" in text
    assert "stopping with 1 task(s) still inside a step; releasing them anyway" in text
    assert "Traceback" not in text, text
    # Given back by ReleaseTask: its lease (60 s) is far from over.
    assert _task_states(server, GROUP) == [tasks_pb2.TASK_STATE_PENDING]


def test_troth_worker_builds_the_worker_from_its_flags_and_logs(
    server: ServerProcess, tmp_path: Path
) -> None:
    log = tmp_path / "troth-worker.log"
    command = [str(TROTH), "--server", server.address, "worker",
               f"{__file__}:build_worker", "--group", "cli-workers"]  # fmt: skip
    proc = _spawn(command, log, tmp_path)
    try:
        _wait_for(log, proc, "polling group 'cli-workers'")
        _wait_for(log, proc, "workflows: hello")
        with Client(server.address) as client:
            handle = client.start("hello", "ada", id="interrupt-hello-1", group="cli-workers")
            assert handle.result(timeout=30) == "ADA"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = log.read_text()
    assert "INFO troth.worker: worker" in text  # the format troth worker configures
    assert "workflow 'interrupt-hello-1' returned" in text
    assert "got SIGINT: no task is running; stopping\n" in text
    assert "stopped" in text and "Traceback" not in text


def _effects(tmp_path: Path) -> str:
    path = tmp_path / "effects"
    return path.read_text() if path.exists() else ""
