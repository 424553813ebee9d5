"""The run's records: append-only JSON lines, each written with one ``O_APPEND`` write and fsync'd.

Three files in the run's directory, one writer kind each:

- ``effects.jsonl``: the side-effect ledger. A step function writes ``begin``
  when it starts and ``end`` when it returns: ``{"phase", "pid", "wid",
  "step", "nonce", "t"}``. Several worker processes append to it at once; a
  line is one ``write`` under ``PIPE_BUF``, so lines never interleave, and it
  is fsync'd before the step goes on, so a SIGKILL right after loses nothing.
- ``acks.jsonl``: what the load generator was told: every start, settle and
  read, with its answer (``applied``, ``already_settled``, ``timed_out``,
  ``not_found``, ``uncertain``...).
- ``faults.jsonl``: every fault injected: ``{"kind", "target", "pid", "t",
  "until"}`` (``until`` is when a SIGSTOP ended, or a clock offset was lifted).

Times are ``time.time()`` of this machine (every process of a run shares it;
the harness never changes the machine's clock, only a server's injected one).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

EFFECTS = "effects.jsonl"
ACKS = "acks.jsonl"
FAULTS = "faults.jsonl"


def append(path: Path | str, record: dict[str, Any]) -> None:
    """Append one record as one line: one ``write`` with ``O_APPEND``, then ``fsync``."""
    line = (json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def read(path: Path | str) -> list[dict[str, Any]]:
    """Every complete record of a journal file (a torn last line of a killed writer is skipped)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


class Journal:
    """The harness's side of the records (acks and faults); workers write effects themselves."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.effects_path = directory / EFFECTS
        self.acks_path = directory / ACKS
        self.faults_path = directory / FAULTS
        self._lock = threading.Lock()

    def ack(self, **record: Any) -> None:
        record.setdefault("t_done", time.time())
        with self._lock:
            append(self.acks_path, record)

    def fault(self, kind: str, target: str, pid: int | None, t: float, **extra: Any) -> None:
        with self._lock:
            append(self.faults_path, {"kind": kind, "target": target, "pid": pid, "t": t, **extra})

    def effects(self) -> list[dict[str, Any]]:
        return read(self.effects_path)

    def acks(self) -> list[dict[str, Any]]:
        return read(self.acks_path)

    def faults(self) -> list[dict[str, Any]]:
        return read(self.faults_path)
