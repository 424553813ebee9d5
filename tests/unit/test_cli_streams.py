"""`troth._cli.streams`: a followed stream yields its items, raises its error and is
closed; after Ctrl-C a command whose cleanup hangs still ends (130) within the grace
period; a command with a SIGINT handler of its own keeps its meaning of Ctrl-C.
(Each Ctrl-C case runs in a subprocess: the watchdog ends a process.)"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from troth._cli.streams import CLEANUP_SECONDS, INTERRUPTED, follow


def test_follow_yields_the_items_in_order_then_closes() -> None:
    closed: list[bool] = []
    assert list(follow(iter([1, 2, 3]), lambda: closed.append(True))) == [1, 2, 3]
    assert closed == [True]


def test_follow_raises_the_streams_error_and_closes() -> None:
    def broken() -> Iterator[int]:
        yield 1
        raise ValueError("the stream broke")

    closed: list[bool] = []
    got: list[int] = []
    with pytest.raises(ValueError, match="the stream broke"):
        for item in follow(broken(), lambda: closed.append(True)):
            got.append(item)
    assert got == [1] and closed == [True]


def _run(code: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return done, time.monotonic() - started


HANGS_AFTER_CTRL_C = """
import os, signal, time
from troth._cli.streams import Interrupts
interrupts = Interrupts()
interrupts.install()
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)
except KeyboardInterrupt:
    print("interrupted; now the cleanup hangs", flush=True)
    while True:
        time.sleep(0.05)
"""


def test_a_cleanup_that_hangs_after_ctrl_c_is_ended_with_130() -> None:
    done, took = _run(HANGS_AFTER_CTRL_C)
    assert done.returncode == INTERRUPTED, done.stderr
    assert done.stdout == "interrupted; now the cleanup hangs\n"
    assert took < 30, took
    assert "Traceback" not in done.stderr


OWN_HANDLER = f"""
import os, signal, time
from troth._cli.streams import Interrupts
interrupts = Interrupts()
interrupts.install()
seen = []
signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))  # a worker's own
os.kill(os.getpid(), signal.SIGINT)
time.sleep({CLEANUP_SECONDS} + 1.5)  # past the grace period: the watchdog leaves it alone
print("still running, saw", len(seen), flush=True)
"""


def test_a_command_with_its_own_sigint_handler_keeps_its_ctrl_c() -> None:
    done, _ = _run(OWN_HANDLER)
    assert (done.returncode, done.stdout) == (0, "still running, saw 1\n"), done.stderr
