"""The README's `make run`, run as a user runs it, then the CLI session of
docs/clients-and-errors.md against it, and the metrics it serves."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from _procs import Cleanup
from _support import reaped, wait_serving

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.e2e


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def troth(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "troth"), "--server", address, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def venv_for_make_run(workdir: Path) -> Path:
    """The virtual environment `make run` is given: this run's own when it serves this
    checkout's code (make then installs nothing, or this checkout again), else a new one
    in `workdir`, made as a new user's is. Never another checkout's: make would install
    this checkout's code into it, editable, and that checkout would run this one's code
    from then on (a second checkout, a git worktree, tested with the first's venv)."""
    sdk = importlib.util.find_spec("troth")
    if sdk is not None and sdk.origin and Path(sdk.origin).resolve().is_relative_to(ROOT):
        return BIN.parent
    return workdir / "venv"


@dataclass(frozen=True)
class MakeRun:
    address: str
    metrics: str


@pytest.fixture(scope="module")
def make_run(tmp_path_factory: pytest.TempPathFactory) -> object:
    """`make run` exactly as the README says, on free ports and a scratch database."""
    if shutil.which("make") is None:
        pytest.fail("make is required by the README")
    port = free_port()
    workdir = tmp_path_factory.mktemp("make-run")
    db = workdir / "troth.db"
    address = f"127.0.0.1:{port}"
    metrics = f"127.0.0.1:{free_port()}"
    with (workdir / "make-run.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                "make",
                "-C",
                str(ROOT),
                "run",
                f"LISTEN={address}",
                f"DB=sqlite:///{db}",
                f"METRICS_LISTEN={metrics}",
            ],
            stdout=log,
            stderr=log,
            start_new_session=True,
            env={**os.environ, "VENV": str(venv_for_make_run(workdir))},
        )
    # make is no Python program to `spawn`: its process group is killed if this run dies.
    watchdog = Cleanup(["kill", "-KILL", "--", f"-{proc.pid}"])
    with reaped(proc):
        try:
            wait_serving(address, 120)
            yield MakeRun(address, metrics)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
            watchdog.cancel()
    assert db.exists(), "the server did not create its SQLite file"


def test_make_run_serves_metrics(make_run: MakeRun) -> None:
    """The README: `make run` serves Prometheus metrics (issue 28: on by default)."""
    with urllib.request.urlopen(f"http://{make_run.metrics}/metrics", timeout=30) as answer:
        body = answer.read().decode()
    assert "troth_server_info" in body


def test_the_readme_cli_session(make_run: MakeRun) -> None:
    address = make_run.address
    steps = [
        ("promises", "create", "approve-7", "--param", '{"post": 7}', "--ttl", "3d",
         "--tag", "team=editors"),
        ("promises", "resolve", "approve-7", "--value", '{"approved": true}'),
        ("promises", "get", "approve-7"),
    ]  # fmt: skip
    for args in steps:
        done = troth(address, *args)
        assert done.returncode == 0, (args, done.stderr)
    assert "RESOLVED" in done.stdout

    got = troth(address, "--json", "promises", "get", "approve-7")
    assert got.returncode == 0, got.stderr
    record = json.loads(got.stdout)
    assert record["state"] == "RESOLVED"
    assert record["value"] == {"approved": True}
    assert record["param"] == {"post": 7}
    assert record["tags"] == {"team": "editors"}

    troth(address, "promises", "create", "approve-8", "--tag", "team=editors")
    found = troth(address, "promises", "search", "approve-*", "--state", "PENDING",
                  "--tag", "team=editors")  # fmt: skip
    assert found.returncode == 0, found.stderr
    assert "approve-8" in found.stdout and "approve-7" not in found.stdout

    second = troth(address, "promises", "reject", "approve-7", "--value", '{"approved": false}')
    assert second.returncode == 1
    assert "already resolved" in second.stderr
    assert "Traceback" not in second.stderr

    bad = troth(address, "promises", "resolve", "approve-8", "--value", "{not json")
    assert bad.returncode == 2
    assert "--value" in bad.stderr

    with reaped(
        subprocess.Popen(
            [str(BIN / "troth"), "--server", address, "promises", "watch", "approve-8"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    ) as watch:
        assert watch.stdout is not None
        first_line = watch.stdout.readline()
        assert "approve-8" in first_line or "PENDING" in first_line
        troth(address, "promises", "cancel", "approve-8")
        out, err = watch.communicate(timeout=30)
    assert watch.returncode == 0, err
    assert "REJECTED_CANCELED" in first_line + out

    pruned = troth(address, "promises", "prune", "--older-than", "30d", "--dry-run")
    assert pruned.returncode == 0, pruned.stderr
    assert "would prune 0 promises" in pruned.stdout
