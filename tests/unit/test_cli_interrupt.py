"""After Ctrl-C the `troth` command ends within its cleanup allowance, whatever hangs."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from troth._cli import CLEANUP_SECONDS, INTERRUPTED

# A command whose cleanup never ends: the SIGINT handler `main` installs raises
# KeyboardInterrupt, and the `finally` then blocks for good (as a channel close can).
HANGING = """
import signal, sys, threading
from troth import _cli
signal.signal(signal.SIGINT, _cli._interrupted)
print("ready", flush=True)
try:
    threading.Event().wait()
finally:
    print("cleaning up", flush=True)
    threading.Event().wait()
"""


def test_an_interrupted_command_whose_cleanup_hangs_exits_130_in_time() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", HANGING], stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            status = proc.wait(CLEANUP_SECONDS + 8)
        finally:
            proc.kill()
        took = time.monotonic() - sent
        assert status == INTERRUPTED
        assert proc.stdout.read() == "cleaning up\n"  # what was printed is flushed
    assert took >= CLEANUP_SECONDS * 0.9, f"exited after {took:.1f} s: cleanup was cut short"
