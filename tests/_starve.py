"""Starve a process of CPU: let it use `--run` seconds of CPU after each `--stopped`
seconds stopped (SIGSTOP, SIGCONT), until this process gets SIGTERM; it leaves the
process running.

Run as a process of its own (`starving`), not as a thread of a test: a thread beside
the test's own load waits for that process's GIL and reads the starved process's CPU
late, so on a busy machine the starved one ran well past its share.

It counts the CPU the starved process used (not the wall clock), so its share is the
same on a fast machine and a slow one, quiet or loaded. A turn ends once the process
has used its share over the turns so far (one that overran, by the CPU clock's 10 ms
ticks or the poll, makes the next one shorter), or after `--run` + `--stopped` of wall
clock if it had no work to use the CPU on (unused CPU is not saved up for later).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    from collections.abc import Iterator

POLL_S = 0.002
"""How often a running process's CPU time is read."""


def starve(pid: int, run_s: float, stopped_s: float, done: threading.Event) -> None:
    """The cycle, until `done` is set; `pid` is left running."""
    process = psutil.Process(pid)

    def used() -> float:
        times = process.cpu_times()
        return float(times.user + times.system)

    allowed = used()
    while not done.is_set():
        os.kill(pid, signal.SIGSTOP)
        try:
            done.wait(stopped_s)
        finally:
            os.kill(pid, signal.SIGCONT)
        allowed += run_s
        turn_ends = time.monotonic() + run_s + stopped_s
        now = used()
        while now < allowed and time.monotonic() < turn_ends:
            if done.wait(POLL_S):
                return
            now = used()
        allowed = min(allowed, now)


@contextmanager
def starving(pid: int, run_s: float, stopped_s: float) -> Iterator[None]:
    """Starve process `pid` (see the module) while the block runs; it runs freely after."""
    starver = subprocess.Popen(
        [sys.executable, str(Path(__file__)), str(pid), str(run_s), str(stopped_s)]
    )
    try:
        yield
    finally:
        starver.terminate()
        try:
            starver.wait(10)
        except subprocess.TimeoutExpired:
            starver.kill()
            starver.wait()
        os.kill(pid, signal.SIGCONT)  # whatever became of the starver


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pid", type=int)
    parser.add_argument("run", type=float, help="seconds of CPU a turn")
    parser.add_argument("stopped", type=float, help="seconds stopped between turns")
    args = parser.parse_args()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    # The cycle on a thread of its own: the main thread only waits, where SIGTERM's
    # handler runs at once.
    worker = threading.Thread(target=starve, args=(args.pid, args.run, args.stopped, done))
    worker.start()
    while worker.is_alive():
        worker.join(0.1)


if __name__ == "__main__":
    main()
