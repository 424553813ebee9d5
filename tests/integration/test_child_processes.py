"""The processes tests start (tests/_procs.py): servers die with the test run, even one
started from a thread pool whose thread has ended, and even when the run is killed
with SIGKILL; `reap` ends what ignores SIGTERM; a `Cleanup` runs when its owner dies,
and not once cancelled."""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
import warnings
from pathlib import Path

from _procs import Cleanup
from _support import eventually, reap, reaped, spawn

TESTS = Path(__file__).resolve().parents[1]

PARENT = f"""
import sys, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
sys.path.insert(0, {str(TESTS)!r})
from _support import start_server

workdir = Path(sys.argv[1])
with ThreadPoolExecutor(1) as pool:  # the starting thread ends before we are killed
    server = pool.submit(start_server, workdir).result()
print(server.proc.pid, flush=True)
time.sleep(600)
"""


def gone(pid: int) -> bool:
    """No such process, or a zombie (whoever adopted it has not reaped it yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def test_a_server_dies_when_the_run_that_started_it_is_killed(tmp_path: Path) -> None:
    with reaped(
        subprocess.Popen(
            [sys.executable, "-c", PARENT, str(tmp_path)], stdout=subprocess.PIPE, text=True
        )
    ) as parent:
        assert parent.stdout is not None
        server_pid = int(parent.stdout.readline())
        # Its starting thread has ended (PR_SET_PDEATHSIG would have killed it by now).
        assert not gone(server_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
    eventually(lambda: gone(server_pid), timeout=30, what=f"server {server_pid} to die")


def test_reap_kills_what_ignores_sigterm_and_leaves_no_warning() -> None:
    stubborn = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print(1, flush=True)\n"
        "time.sleep(600)"
    )
    proc = spawn([sys.executable, "-c", stubborn], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"1\n"
    assert reap(proc, grace=0.5) == -signal.SIGKILL
    assert proc.stdout.closed
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        del proc
        gc.collect()


def test_a_cleanup_runs_when_its_owner_dies_and_not_once_cancelled(tmp_path: Path) -> None:
    owner = f"""
import sys, time
sys.path.insert(0, {str(TESTS)!r})
from _procs import Cleanup
kept = Cleanup(["touch", {str(tmp_path / "ran")!r}])
Cleanup(["touch", {str(tmp_path / "cancelled")!r}]).cancel()
print("ready", flush=True)
time.sleep(600)
"""
    with reaped(
        subprocess.Popen([sys.executable, "-c", owner], stdout=subprocess.PIPE, text=True)
    ) as proc:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGKILL)
    eventually(lambda: (tmp_path / "ran").exists(), timeout=30, what="the cleanup to run")
    assert not (tmp_path / "cancelled").exists()
    # And closed by its owner: run now, and waited for.
    Cleanup(["touch", str(tmp_path / "closed")]).close()
    assert (tmp_path / "closed").exists()
