"""Test support: worker processes (a test file run as a script) and what to observe of them.

A test module that needs real worker processes is itself the worker script
(`python test_x.py ADDRESS ...`, its `main` builds a `Worker` and calls
`run()`); `WorkerFleet` starts such processes (they die with the test run, and
are reaped), reads the side-effect file
their steps append to, and kills or stops them.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _procs import reap, spawn, stop

if TYPE_CHECKING:
    from troth import Context

EFFECTS_ENV = "TROTH_TEST_EFFECTS"
"""The side-effect file, one line per step run, given to worker processes."""


def effect(line: str) -> str:
    """A step's side effect: one line appended to the file `$TROTH_TEST_EFFECTS` names."""
    with open(os.environ[EFFECTS_ENV], "a", encoding="utf-8") as file:
        file.write(line + "\n")
    return line


RELEASE_ENV = "TROTH_TEST_RELEASE"
"""A file whose appearance lets `send_email` return."""


def send_email(workflow_id: str) -> str:
    """A step that records that it started, then runs until the file `$TROTH_TEST_RELEASE`
    names appears (the test kills or freezes something meanwhile)."""
    effect(f"{workflow_id} email {os.getpid()}")
    release = Path(os.environ[RELEASE_ENV])
    deadline = time.monotonic() + 120
    while not release.exists():
        assert time.monotonic() < deadline, "the test never released the step"
        time.sleep(0.05)
    return "sent"


def mail_flow(ctx: Context) -> Generator[Any, Any, str]:
    """A workflow whose first step the test holds (`send_email`), then a second one."""
    sent: str = yield ctx.run(send_email, ctx.id)
    yield ctx.run(effect, f"{ctx.id} after")
    return sent


class WorkerFleet:
    """Worker subprocesses running `script`, all appending to one side-effect file."""

    def __init__(self, tmp_path: Path, script: str, address: str) -> None:
        self.tmp_path = tmp_path
        self.script = script
        self.address = address
        self.effects = tmp_path / "effects"
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Run `python SCRIPT ADDRESS *args`, its output in `worker-<n>.log`."""
        log = self.tmp_path / f"worker-{len(self.procs)}.log"
        full_env = {**os.environ, EFFECTS_ENV: str(self.effects), **(env or {})}
        with log.open("wb") as out:
            proc = spawn(
                [sys.executable, self.script, self.address, *args],
                stdout=out,
                stderr=out,
                env=full_env,
            )
        self.procs.append(proc)
        return proc

    def lines(self) -> list[str]:
        if not self.effects.exists():
            return []
        return self.effects.read_text(encoding="utf-8").splitlines()

    def counts(self) -> collections.Counter[str]:
        return collections.Counter(self.lines())

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        path = self.tmp_path / f"worker-{self.procs.index(proc)}.log"
        return path.read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(self.log(proc) for proc in self.procs)

    def eventually(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll `check` until it holds; fail with the workers' logs after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}\n{self.logs()[-4000:]}")
            for proc in self.procs:
                if proc.poll() not in (None, -signal.SIGKILL):
                    raise AssertionError(
                        f"worker {proc.pid} exited with {proc.returncode} while waiting for "
                        f"{what}\n{self.log(proc)[-4000:]}"
                    )
            time.sleep(0.05)

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL: no shutdown code runs; the server sees the stream break."""
        proc.send_signal(signal.SIGKILL)
        reap(proc)

    def terminate(self, proc: subprocess.Popen[bytes]) -> int:
        """SIGTERM: the worker stops gracefully and exits (killed, and TimeoutError,
        if it does not within 15 s)."""
        return stop(proc, 15)

    def stop_all(self) -> None:
        """SIGKILL what still runs, and reap every worker."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            reap(proc)


def rss_kib(pid: int) -> int:
    """The resident set size of process `pid` (VmRSS in /proc/<pid>/status), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def suspended(db_url: str, root_prefix: str) -> int:
    """How many workflows whose ids start with `root_prefix` are suspended, per the server's
    SQLite store: a callback waits for one of their promises and no task of theirs is
    pending or leased. (Read-only, and only for tests: the store is the server's business.)"""
    path = db_url.removeprefix("sqlite:///")
    query = """
        SELECT count(DISTINCT c.root_promise_id) FROM callbacks AS c
        WHERE c.root_promise_id LIKE :prefix ESCAPE '\\'
          AND NOT EXISTS (
            SELECT 1 FROM tasks AS t
            WHERE t.root_promise_id = c.root_promise_id AND t.state IN ('PENDING', 'CLAIMED')
          )
    """
    like = root_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)) as db:
        (count,) = db.execute(query, {"prefix": like}).fetchone()
    return int(count)
