"""Run a test's child so that it ends when the test run does (see `_procs.spawn`).

    python _guarded.py FD -m MODULE ARGS...        run MODULE in this process
    python _guarded.py FD SCRIPT ARGS...           run SCRIPT in this process
    python _guarded.py FD -c CODE ARGS...          run CODE in this process
    python _guarded.py FD --then [--remove DIR] -- COMMAND...
                                                   wait, then run COMMAND (a cleanup)

FD is the read end of a pipe whose write end only the test process holds. It
reads end-of-file when that write end closes: the test closed it (done with the
child), or the test process died, however (SIGKILL included; the kernel closes a
dead process's descriptors). A pipe, not PR_SET_PDEATHSIG, which fires when the
*thread* that started the child exits, and tests start servers from thread pools.

A program runs in this very process (same pid, so signals a test sends reach it)
with a daemon thread that SIGKILLs it at end-of-file. A cleanup waits for
end-of-file in the foreground, then runs COMMAND (e.g. `pg_ctl stop`) if DIR
still exists, and removes DIR; unless the test wrote DISARM first (it cleaned up).
"""

from __future__ import annotations

import os
import runpy
import shutil
import signal
import subprocess
import sys
import threading

DISARM = b"disarm"
"""Written before closing: the test did the cleanup itself (see `_procs.Cleanup.cancel`)."""


def _wait_for_eof(fd: int) -> bytes:
    """Block until end-of-file; what was written before it."""
    got = b""
    while chunk := os.read(fd, 4096):
        got += chunk
    return got


def _die_with_the_test(fd: int) -> None:
    _wait_for_eof(fd)
    os.kill(os.getpid(), signal.SIGKILL)


def _cleanup(fd: int, argv: list[str]) -> int:
    remove = None
    if argv[:1] == ["--remove"]:
        remove, argv = argv[1], argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of the run must not skip it
    if _wait_for_eof(fd) == DISARM:  # the test cleaned up itself: nothing to do
        return 0
    if remove is None or os.path.isdir(remove):
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    if remove is not None:
        shutil.rmtree(remove, ignore_errors=True)
    return 0


def main() -> None:
    fd, rest = int(sys.argv[1]), sys.argv[2:]
    if rest[:1] == ["--then"]:
        sys.exit(_cleanup(fd, rest[1:]))
    threading.Thread(target=_die_with_the_test, args=(fd,), daemon=True).start()
    if rest[:1] == ["-c"]:
        sys.argv = ["-c", *rest[2:]]
        sys.path[0] = ""  # as `python -c` has it
        exec(compile(rest[1], "<string>", "exec"), {"__name__": "__main__"})
    elif rest[:1] == ["-m"]:
        sys.argv = [rest[1], *rest[2:]]
        sys.path[0] = os.getcwd()  # as `python -m` has it
        runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = rest
        sys.path[0] = os.path.dirname(os.path.abspath(rest[0]))
        runpy.run_path(rest[0], run_name="__main__")


if __name__ == "__main__":
    main()
