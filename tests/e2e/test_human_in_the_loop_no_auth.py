"""examples/human_in_the_loop without authentication, as its README's "Without
authentication" runs it: `troth serve --no-auth`, the worker and the gateway with no
tokens, and each person naming themselves with an `x-troth-principal` header where
the authenticated session sends a bearer token (issue 28: approving through the
gateway of a `--no-auth` server was refused `NOT_AN_APPROVER`, whoever clicked).

The editors' approver policy and four eyes hold as with authentication on: the
server checks them against the principal each request names.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from _support import ServerProcess, reap, spawn, start_server
from _support import stop as stop_process

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "human_in_the_loop"
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.e2e


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class NoAuthStack:
    workdir: Path
    server: ServerProcess
    url: str
    procs: list[subprocess.Popen[bytes]]

    def describe(self) -> str:
        logs = sorted(self.workdir.glob("*.log"))
        parts = [f"--- {log.name} ---\n{log.read_text(errors='replace')[-3000:]}" for log in logs]
        return "\n".join([*parts, f"--- server ---\n{self.server.log()[-3000:]}"])


def as_(who: str) -> dict[str, str]:
    """The README's ALICE="x-troth-principal: alice" (no token: the server runs --no-auth)."""
    return {"x-troth-principal": who}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NoAuthStack]:
    workdir = tmp_path_factory.mktemp("human-in-the-loop-no-auth")
    # troth serve --no-auth --listen 127.0.0.1:7070 --db sqlite:///troth.db
    server = start_server(workdir, "--no-auth")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TROTH_")}
    running = NoAuthStack(workdir, server, f"http://127.0.0.1:{port}", [])
    commands = {
        # TROTH_SERVER=... OUTBOX=outbox.jsonl GATEWAY_URL=... python worker.py
        "worker": (
            [sys.executable, "worker.py"],
            {"OUTBOX": str(workdir / "outbox.jsonl"), "GATEWAY_URL": running.url},
        ),
        # TROTH_SERVER=... EDITORS=alice,bob uvicorn gateway:app --host 127.0.0.1 --port 8000
        "gateway": (
            [sys.executable, str(BIN / "uvicorn"), "gateway:app", "--host", "127.0.0.1",
             "--port", str(port)],
            {"EDITORS": "alice,bob"},
        ),
    }  # fmt: skip
    try:
        for name, (command, extra) in commands.items():
            with (workdir / f"{name}.log").open("wb") as log:
                running.procs.append(
                    spawn(
                        command,
                        cwd=EXAMPLE,
                        stdout=log,
                        stderr=log,
                        env={**env, "TROTH_SERVER": server.address, **extra},
                    )
                )
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{running.url}/approvals", timeout=5).is_success:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"the gateway did not answer\n{running.describe()}"
            time.sleep(0.05)
        yield running
    finally:
        try:
            for proc in reversed(running.procs):
                stop_process(proc, 30)
        finally:
            for proc in running.procs:
                reap(proc)
            server.stop()


@pytest.fixture
def http(stack: NoAuthStack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        yield client


def finished(http: httpx.Client, post: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        view: dict[str, Any] = http.get(f"/posts/{post}", params={"wait": 5}).json()
        if view["state"] != "PENDING" or time.monotonic() > deadline:
            return view


def started(http: httpx.Client, post: str, who: str | None = None) -> None:
    headers = as_(who) if who else {}
    response = http.post(f"/posts/{post}/publish", params={"wait": 10}, headers=headers)
    assert response.status_code == 202, response.text


def test_an_editor_approves_by_name_and_is_recorded(stack: NoAuthStack, http: httpx.Client) -> None:
    started(http, "post-7")
    inbox = http.get("/approvals", headers=as_("alice"))
    assert [a["id"] for a in inbox.json()] == ["publish-post-7.0"], stack.describe()
    refused = http.post("/approvals/publish-post-7.0/approve")  # the gateway is no editor
    assert refused.status_code == 403 and refused.json()["reason"] == "NOT_AN_APPROVER"
    approved = http.post(
        "/approvals/publish-post-7.0/approve",
        headers=as_("alice"),
        json={"reviewer": "alice", "comment": "ship it"},
    )
    assert approved.status_code == 200, approved.text
    view = finished(http, "post-7")
    assert view["result"]["status"] == "approved", view
    assert view["result"]["approved_by"] == "alice", view


def test_four_eyes_holds_for_a_named_starter(stack: NoAuthStack, http: httpx.Client) -> None:
    started(http, "post-bob", who="bob")
    assert http.get("/approvals", headers=as_("bob")).json() == []
    own = http.post("/approvals/publish-post-bob.0/approve", headers=as_("bob"))
    assert own.status_code == 403 and own.json()["reason"] == "NOT_AN_APPROVER", own.text
    other = http.post("/approvals/publish-post-bob.0/approve", headers=as_("alice"))
    assert other.status_code == 200, other.text
    assert finished(http, "post-bob")["result"]["approved_by"] == "alice"


def test_a_stranger_named_is_refused(stack: NoAuthStack, http: httpx.Client) -> None:
    started(http, "post-8")
    mallory = http.post("/approvals/publish-post-8.0/reject", headers=as_("mallory"))
    assert mallory.status_code == 403 and mallory.json()["reason"] == "NOT_AN_APPROVER"
    bob = http.post("/approvals/publish-post-8.0/reject", headers=as_("bob"))
    assert bob.status_code == 200, bob.text
    assert finished(http, "post-8")["result"]["status"] == "rejected"
