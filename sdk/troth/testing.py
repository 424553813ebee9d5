"""Helpers for testing your own workflows: replay without a server, or a real one.

`running_server` starts a real troth server (the `troth-server` distribution)
on a free port and a throw-away SQLite file, for integration tests of your
workers and gateways; no fake server is involved.

`replay` checks that a workflow's current code still matches a recorded
history (as Temporal's `Replayer` does): run it in your test suite against
histories recorded from production before you deploy a change.

`load_history` reads a history from JSON, in this shape (values are plain
JSON, encoded with the JSON codec; `state` defaults to `RESOLVED`)::

    {"root_id": "publish-post-7", "args": ["post-7"],
     "promises": [
        {"id": "publish-post-7.0", "state": "PENDING", "tags": {"troth:kind": "promise"}},
        {"id": "publish-post-7.1", "tags": {"troth:kind": "run", "troth:func": "send_email"},
         "value": "sent", "settle_time": "2025-01-01T00:00:00+00:00"}]}
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from os import PathLike
from pathlib import Path
from typing import Any

import grpc

from troth._engine import CreateStep, Done, Engine, Failed, Outcome, Suspend, Workflow
from troth._promise import Promise, PromiseState
from troth.codec import Codec, JsonCodec, Payload
from troth.errors import ConfigurationError, NonDeterminismError

__all__ = [
    "CreateStep",
    "Done",
    "Failed",
    "Outcome",
    "Suspend",
    "load_history",
    "replay",
    "running_server",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def replay(
    workflow: Workflow,
    args: Sequence[Any],
    history: Iterable[Promise],
    *,
    root_id: str,
    codec: Codec | None = None,
) -> Outcome:
    """Replay `workflow(ctx, *args)` against `history`; run nothing, create nothing.

    Returns the outcome where the recorded history runs out: `Done`/`Failed`
    if the workflow finishes, `Suspend` if it waits on a pending promise, or
    the `CreateStep` for the first step the history does not hold. No step
    function is ever called. The generator is closed before returning.

    Raises:
        NonDeterminismError: The code no longer yields what the history recorded.
    """
    with Engine(workflow, args, root_id=root_id, history=history, codec=codec) as engine:
        outcome = engine.advance()
    if isinstance(outcome, Failed) and isinstance(outcome.error, NonDeterminismError):
        raise outcome.error
    return outcome


def load_history(
    source: str | PathLike[str] | Mapping[str, Any], *, codec: Codec | None = None
) -> tuple[str, list[Any], list[Promise]]:
    """Read a JSON history (a path or a parsed mapping): `(root_id, args, promises)`."""
    data: Mapping[str, Any]
    if isinstance(source, Mapping):
        data = source
    else:
        data = json.loads(Path(source).read_text(encoding="utf-8"))
    encoder = codec or JsonCodec()
    promises = [_promise_from_json(item, encoder) for item in data.get("promises", [])]
    return str(data["root_id"]), list(data.get("args", [])), promises


def _promise_from_json(item: Mapping[str, Any], codec: Codec) -> Promise:
    state = PromiseState(item.get("state", PromiseState.RESOLVED))
    settled = state is not PromiseState.PENDING
    value = codec.encode(item["value"]) if settled and "value" in item else Payload()
    settle_time = item.get("settle_time")
    return Promise(
        id=str(item["id"]),
        state=state,
        param=codec.encode(item["param"]) if "param" in item else Payload(),
        value=value,
        tags={str(k): str(v) for k, v in item.get("tags", {}).items()},
        create_time=_time(item.get("create_time")) or _EPOCH,
        settle_time=_time(settle_time) if settled else None,
    )


def _time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


@contextmanager
def running_server(*args: str, timeout: float = 30.0) -> Iterator[str]:
    """Start `troth serve` on 127.0.0.1, a free port and a fresh SQLite file.

    Yields its address (`host:port`) once it accepts calls; stops it (SIGTERM)
    on exit. Extra `args` go to `troth serve` (e.g. `"--sweep-interval", "100ms"`).

    Raises:
        ConfigurationError: `troth-server` is not installed, or it did not start
            within `timeout` seconds (the message carries its log).

    .. versionadded:: 0.1.0
    """
    with tempfile.TemporaryDirectory(prefix="troth-test-") as workdir:
        port_file = Path(workdir) / "port"
        log_path = Path(workdir) / "server.log"
        command = [
            sys.executable, "-m", "troth_server", "serve", "--listen", "127.0.0.1:0",
            "--db", f"sqlite:///{Path(workdir) / 'troth.db'}", "--port-file", str(port_file),
            *args,
        ]  # fmt: skip
        with log_path.open("wb") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=log, env=dict(os.environ))
        try:
            address = _wait_for_port(proc, port_file, log_path, timeout)
            _wait_until_serving(address, timeout)
            yield address
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _wait_for_port(
    proc: subprocess.Popen[bytes], port_file: Path, log_path: Path, timeout: float
) -> str:
    deadline = time.monotonic() + timeout
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            log = log_path.read_text(errors="replace")
            if "No module named troth_server" in log:
                raise ConfigurationError(
                    "running_server needs the server: pip install troth-server"
                )
            proc.kill()
            raise ConfigurationError(f"the troth server did not start:\n{log[-4000:]}")
        time.sleep(0.02)
    return f"127.0.0.1:{int(port_file.read_text())}"


def _wait_until_serving(address: str, timeout: float) -> None:
    with grpc.insecure_channel(address) as channel:
        grpc.channel_ready_future(channel).result(timeout=timeout)
