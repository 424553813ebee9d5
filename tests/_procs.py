"""Test support: the processes a test starts are reaped, and die with the test run.

- `spawn` starts a Python child (a server, a worker) through `_guarded.py`, fed a
  pipe whose write end only this process holds: when it closes (`reap`, or this
  process dies however, SIGKILL included) the child is SIGKILLed. Same pid, so
  signals a test sends reach the program itself.
- `reap` / `reaped` end a child that is still running (SIGTERM, then SIGKILL after
  a grace period), wait for it and close its pipes: no zombie, no "subprocess is
  still running" ResourceWarning at garbage collection.
- `Cleanup` runs a command (e.g. `pg_ctl stop`) when this process ends, however,
  or when closed: for what is not a child of ours (a daemonised PostgreSQL).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from _guarded import DISARM

GUARDED = str(Path(__file__).with_name("_guarded.py"))

_guards: dict[int, tuple[subprocess.Popen[Any], int]] = {}
"""pid of a spawned child -> it and the write end of its pipe. The reference keeps
a child that a test forgot from being garbage-collected while it runs (a
ResourceWarning, attributed to whichever test runs then); `reap_all` ends them."""
_guards_lock = threading.Lock()

P = TypeVar("P", bound="subprocess.Popen[Any]")


def spawn(command: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
    """`subprocess.Popen(command, **popen)` for a Python program, `[sys.executable,
    "-m", MODULE, ...]`, `[sys.executable, SCRIPT, ...]` or `[sys.executable, "-c",
    CODE, ...]`, that dies when this
    process does (reap it with `reap`, which also releases its pipe)."""
    if not command or command[0] != sys.executable:
        raise ValueError(f"spawn runs Python programs ([sys.executable, ...]), not {command!r}")
    read, write = os.pipe()  # both non-inheritable: only `pass_fds` hands `read` on
    try:
        proc: subprocess.Popen[Any] = subprocess.Popen(
            [sys.executable, GUARDED, str(read), *command[1:]], pass_fds=(read,), **popen
        )
    except BaseException:
        os.close(write)
        raise
    finally:
        os.close(read)
    with _guards_lock:
        _guards[proc.pid] = (proc, write)
    return proc


def _release(proc: subprocess.Popen[Any]) -> None:
    with _guards_lock:
        guard = _guards.pop(proc.pid, None)
    if guard is not None:
        os.close(guard[1])


def reap_all() -> None:
    """Reap every spawned child still unreaped (at the end of the test session)."""
    with _guards_lock:
        left = [proc for proc, _ in _guards.values()]
    for proc in left:
        reap(proc, grace=5)


def reap(proc: P, grace: float = 10.0) -> int:
    """End `proc` if it still runs (SIGTERM, SIGKILL after `grace` seconds), wait for
    it, close its pipes; its exit status."""
    try:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
                os.kill(proc.pid, signal.SIGCONT)  # a stopped child acts on SIGTERM
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    finally:
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        if proc.returncode is not None:
            _release(proc)
    return proc.returncode


@contextlib.contextmanager
def reaped(proc: P, grace: float = 10.0) -> Iterator[P]:
    """`with reaped(subprocess.Popen(...)) as proc:` the child is reaped at the end
    of the block, whatever happened in it."""
    try:
        yield proc
    finally:
        reap(proc, grace)


def stop(proc: subprocess.Popen[Any], timeout: float = 20.0) -> int:
    """SIGTERM and wait up to `timeout` for a graceful exit; its status. If it does
    not exit in time it is killed (and reaped) and `TimeoutError` says so."""
    try:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise TimeoutError(
            f"pid {proc.pid} ({' '.join(map(str, proc.args))[:200]}) did not exit within "
            f"{timeout:g} s of SIGTERM; killed"
        ) from None
    finally:
        reap(proc, grace=0)


class Cleanup:
    """Run `command` once, when `close()` is called or this process ends however
    (a watchdog process waits on a pipe). With `remove`, only if that directory
    still exists, and the directory is removed afterwards."""

    def __init__(self, command: Sequence[str], remove: Path | None = None) -> None:
        read, write = os.pipe()
        extra = ["--remove", str(remove)] if remove is not None else []
        try:
            self._proc = subprocess.Popen(
                [sys.executable, GUARDED, str(read), "--then", *extra, "--", *command],
                pass_fds=(read,),
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C of the run does not reach it
            )
        except BaseException:
            os.close(write)
            raise
        finally:
            os.close(read)
        self._write: int | None = write

    def cancel(self) -> None:
        """The caller cleaned up itself: end the watchdog without running the command."""
        self.close(disarm=True)

    def close(self, timeout: float = 120.0, *, disarm: bool = False) -> None:
        """Run the command now and wait for it (with `disarm`: do not run it)."""
        if self._write is not None:
            if disarm:
                os.write(self._write, DISARM)
            os.close(self._write)
            self._write = None
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:
            reap(self._proc, grace=5)
