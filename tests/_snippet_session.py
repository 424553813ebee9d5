"""A reader's terminal, for `tests/e2e/test_snippets.py`: one bash process per document.

Blocks are typed into it one after another (`source`d), so `cd`, `export`, `source
.venv/bin/activate` and background jobs carry over as they do for a person. It runs
with `set -eo pipefail`: a command that fails ends the terminal, and the test fails
naming the block and showing its output. Python blocks are run in it too, with
`python -c "$(< FILE)"`: the current directory on `sys.path`, as when pasted into a
file there and run.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from _procs import Cleanup, reap

PRELUDE = r"""
set -eo pipefail
__snippet_wait_port() {  # a background server: wait until it accepts connections
  local port=$1 pid=$! deadline=$((SECONDS + 60))
  until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "snippet: the background command (pid $pid) exited before port $port answered" >&2
      return 96
    fi
    if ((SECONDS > deadline)); then
      echo "snippet: nothing answered on port $port" >&2; return 96
    fi
    sleep 0.05
  done
}
__snippet_exits() {  # a command the README says exits with a given status
  local want=$1 rc=0; shift
  "$@" || rc=$?
  if [[ $rc != "$want" ]]; then
    echo "snippet: '$*' exited $rc, the README says $want" >&2; return 97
  fi
}
__snippet_fails() {  # a command the README shows failing with an error
  local want=$1 rc=0 err; shift
  err=$(mktemp)
  "$@" 2>"$err" || rc=$?
  cat "$err" >&2
  if [[ $rc == 0 ]]; then echo "snippet: '$*' succeeded; the README shows: $want" >&2; return 98; fi
  if ! grep -qF -- "$want" "$err"; then echo "snippet: '$*' did not say: $want" >&2; return 98; fi
}
__snippet_stop_jobs() {  # a section ends: its background commands are stopped (Ctrl-C)
  local pid rc
  for pid in $(jobs -p); do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in $(jobs -p); do
    rc=0; wait "$pid" || rc=$?
    echo "$pid $rc" >> "$1"
  done
}
"""

OK_BACKGROUND_EXITS = (0, 128 + signal.SIGTERM)
"""Ctrl-C's stand-in, SIGTERM: a clean exit, or the signal re-raised (uvicorn, plain scripts)."""


class SnippetFailed(AssertionError):
    pass


class Terminal:
    def __init__(self, workdir: Path, env: dict[str, str], state: Path) -> None:
        self.workdir = workdir
        self.state = state
        state.mkdir(parents=True, exist_ok=True)
        self.log = state / "terminal.log"
        self._count = 0
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    "bash", "--norc", "--noprofile", "-c",
                    'while IFS= read -r __line; do eval "$__line" </dev/null; done',
                ],
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                cwd=workdir, env=env, text=True, start_new_session=True,
            )  # fmt: skip
        # Its process group (the terminal and what it starts) is killed if the run dies.
        self._watchdog = Cleanup(["kill", "-KILL", "--", f"-{self.proc.pid}"])
        self._send(f"source {self._file('prelude.sh', PRELUDE)}")

    def _file(self, name: str, text: str) -> Path:
        path = self.state / name
        path.write_text(text, encoding="utf-8")
        return path

    def _send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def _output_since(self, offset: int) -> str:
        return self.log.read_bytes()[offset:].decode(errors="replace")[-6000:]

    def run(self, where: str, script: str, timeout: float = 120) -> str:
        """Type `script` in; return its output, or raise naming `where` if it failed."""
        self._count += 1
        done = self.state / f"done-{self._count}"
        offset = self.log.stat().st_size
        path = self._file(f"block-{self._count}.sh", script)
        self._send(f"source {path}; pwd > {self.state / 'cwd'}; : > {done}")
        deadline = time.monotonic() + timeout
        while not done.exists():
            if self.proc.poll() is not None:
                raise SnippetFailed(
                    f"{where}: a command failed (exit {self.proc.returncode}); "
                    f"the terminal showed:\n{self._output_since(offset)}\n--- as run ---\n{script}"
                )
            if time.monotonic() > deadline:
                raise SnippetFailed(
                    f"{where}: still running after {timeout}s (a command that runs until "
                    "Ctrl-C goes in a `<!-- snippet: background -->` block, or ends with &):"
                    f"\n{self._output_since(offset)}"
                )
            time.sleep(0.02)
        return self._output_since(offset)

    def python(self, where: str, name: str, code: str, *, background: bool) -> str:
        path = self._file(name, code)
        return self.run(where, f'python -c "$(< {path})"{" &" if background else ""}\n')

    @property
    def cwd(self) -> Path:
        path = self.state / "cwd"
        return Path(path.read_text().strip()) if path.exists() else self.workdir

    def stop_jobs(self, where: str) -> None:
        """End the background commands (SIGTERM, as Ctrl-C in their terminals) and check
        that each had kept running and stops cleanly."""
        statuses = self.state / f"jobs-{self._count}"
        self.run(where, f"__snippet_stop_jobs {statuses}\n")
        for line in statuses.read_text().splitlines() if statuses.exists() else []:
            pid, rc = line.split()
            if int(rc) not in OK_BACKGROUND_EXITS:
                raise SnippetFailed(
                    f"{where}: a background command (pid {pid}) ended with status {rc}:\n"
                    f"{self._output_since(0)}"
                )

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        else:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:  # what the failed block left running in the background
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        reap(self.proc)
        self._watchdog.cancel()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
