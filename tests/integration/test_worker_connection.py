"""A worker's connection as its operator sees it (issue 28's frictions), against a real
server: refused for want of a credential that will never work, `troth worker` stops
with one ERROR line saying what to do, and a non-zero exit (it retried
`UNAUTHENTICATED` forever); after a server restart the worker says it is back, and
after how long (it said nothing).

SQLite only: the store plays no part in what the worker sends or logs."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from _auth import Grant, write_token_file
from _support import eventually, start_server

from troth import Client, Context, Worker
from troth.errors import UnauthenticatedError

if TYPE_CHECKING:
    from _support import ServerProcess

MODULE = """
from troth import Worker

def build_worker(client, group="no-token"):
    worker = Worker(client, group)
    worker.workflow(hello)
    return worker

def hello(ctx, name):
    return (yield ctx.run(str.upper, name))
"""


def hello(ctx: Context, name: str) -> Any:
    return (yield ctx.run(str.upper, name))


@pytest.fixture(scope="module")
def authed(tmp_path_factory: pytest.TempPathFactory) -> Any:
    workdir = tmp_path_factory.mktemp("worker-auth")
    path = workdir / "tokens.toml"
    tokens = write_token_file(path, [Grant("worker-1", ("worker",), ("no-token",))])
    server = start_server(workdir, "--auth-tokens", str(path))
    yield server, tokens
    assert server.stop() == 0, server.log()[-3000:]


def _troth_worker(address: str, tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    module = tmp_path / "no_token_worker.py"
    module.write_text(MODULE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TROTH_TOKEN")}
    troth = str(Path(sys.executable).parent / "troth")
    return subprocess.run(
        [troth, "--server", address, *flags, "worker", str(module)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def _errors(stderr: str) -> list[str]:
    """The ERROR lines of `troth worker`'s log (`troth._foreground.LOG_FORMAT`), and any
    line of the CLI's own error output."""
    return [line for line in stderr.splitlines() if " ERROR " in line or "error:" in line]


def test_troth_worker_without_a_token_stops_with_one_error_line(
    authed: Any, tmp_path: Path
) -> None:
    server, _tokens = authed
    ran = _troth_worker(server.address, tmp_path)
    assert ran.returncode == 1, ran.stderr
    errors = _errors(ran.stderr)
    assert len(errors) == 1, ran.stderr
    for what_to_do in ("--token-file", "TROTH_TOKEN_FILE", "Client(token="):
        assert what_to_do in errors[0], errors[0]
    assert "sent no token" in errors[0], errors[0]


def test_troth_worker_with_a_token_the_server_does_not_know_stops_too(
    authed: Any, tmp_path: Path
) -> None:
    server, _tokens = authed
    token_file = tmp_path / "token"
    token_file.write_text("troth_nosuchkey_notasecret\n")
    ran = _troth_worker(server.address, tmp_path, "--token-file", str(token_file))
    assert ran.returncode == 1, ran.stderr
    errors = _errors(ran.stderr)
    assert len(errors) == 1, ran.stderr
    assert "TOKEN_UNKNOWN" in errors[0] and "refused" in errors[0], errors[0]
    assert "notasecret" not in ran.stderr


def test_worker_run_raises_what_refused_it(authed: Any) -> None:
    # The library's road: `run()` stops and raises the refusal (`start()`: `failure`).
    server, _tokens = authed
    with Client(server.address) as client:
        worker = Worker(client, group="no-token")
        worker.workflow(hello)
        with pytest.raises(UnauthenticatedError) as refused:
            worker.run()
        assert refused.value.reason == "CREDENTIALS_MISSING"
        assert worker.failure is refused.value


def test_a_worker_says_when_its_stream_is_back_after_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server: ServerProcess = start_server(tmp_path / "first")
    restarted: ServerProcess | None = None
    caplog.set_level(logging.INFO, logger="troth.worker")
    try:
        with Client(server.address) as client:
            worker = Worker(client, group="restarts", lease=timedelta(seconds=2))
            worker.workflow(hello)
            with worker:
                eventually(lambda: client.list_workers("restarts"), what="the worker to connect")
                assert not [r for r in caplog.records if "reconnected" in r.getMessage()]
                assert server.stop() == 0
                restarted = start_server(
                    tmp_path / "second", "--listen", server.address, db_url=server.db_url
                )

                def back() -> list[str]:
                    return [r.getMessage() for r in caplog.records
                            if "reconnected" in r.getMessage()]  # fmt: skip

                eventually(back, what="the reconnected line")
                (line,) = back()
                assert f"worker {worker.worker_id} reconnected its task stream" in line, line
                assert "after" in line and "s away" in line, line
                record = next(r for r in caplog.records if "reconnected" in r.getMessage())
                assert record.levelno == logging.INFO
                handle = client.start(
                    hello, "back", id=f"back-{worker.worker_id}", group="restarts"
                )
                assert handle.result(timeout=30) == "BACK"
    finally:
        if restarted is not None:
            restarted.stop()
