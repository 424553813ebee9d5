"""examples/human_in_the_loop, run as its README says: server, worker and gateway as processes.

Then driven over HTTP as a user (or a web page) would: start a workflow, see
the notification go out once, find the pending approval, approve or reject
it, click twice, start twice, let an approval time out, and kill the worker
while a workflow waits. Authentication is on, as the README sets it up: tokens
minted with `troth tokens new`, the server on the token file, the worker and
the gateway each with its own token, the editors' decisions made with theirs
(the approver policy refuses anyone else, and four eyes the starter).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from _support import ServerProcess, reap, spawn, start_server
from _support import stop as stop_process

from troth import Client
from troth.errors import NotFoundError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "human_in_the_loop"
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.e2e

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def eventually(
    probe: Callable[[], T | None], what: str, timeout: float = 20.0, detail: Callable[[], str] = str
) -> T:
    """Call `probe` until it returns something other than None; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{detail()}")
        time.sleep(0.05)


PARTIES = (
    # troth tokens new --name NAME --roles ROLES [--groups G] --token-out FILE >> tokens.toml
    ("hitl-worker", "worker", "workers", "worker.token"),
    ("gateway", "gateway", None, "gateway.token"),
    ("alice", "gateway", None, "alice.token"),
    ("bob", "gateway", None, "bob.token"),
)


def mint_tokens(workdir: Path) -> dict[str, str]:
    """The README's `troth tokens new` lines; returns token file name -> token."""
    tokens: dict[str, str] = {}
    with (workdir / "tokens.toml").open("ab") as toml:
        for name, roles, groups, out in PARTIES:
            command = [str(BIN / "troth"), "tokens", "new", "--name", name, "--roles", roles]
            command += ["--groups", groups] if groups else []
            done = subprocess.run(
                [*command, "--token-out", out], cwd=workdir, stdout=toml, timeout=60, check=True
            )
            assert done.returncode == 0
            tokens[out] = (workdir / out).read_text().strip()
    return tokens


@dataclass
class Stack:
    """The server, a worker and the gateway, started with the README's commands."""

    workdir: Path
    server: ServerProcess
    outbox: Path
    gateway_url: str
    tokens: dict[str, str]
    worker: subprocess.Popen[bytes] | None = None
    gateway: subprocess.Popen[bytes] | None = None
    logs: list[Path] = field(default_factory=list)

    def _spawn(self, name: str, command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = self.workdir / f"{name}-{len(self.logs)}.log"
        self.logs.append(log)
        with log.open("wb") as out:  # a Python program, guarded: it dies with the test run
            return spawn(command, cwd=EXAMPLE, stdout=out, stderr=out, env={**os.environ, **env})

    def start_worker(self) -> None:
        # cd examples/human_in_the_loop
        # TROTH_TOKEN=$(cat worker.token) TROTH_SERVER=... OUTBOX=outbox.jsonl GATEWAY_URL=...
        #   python worker.py
        self.worker = self._spawn(
            "worker",
            [sys.executable, "worker.py"],
            {
                "TROTH_TOKEN": self.tokens["worker.token"],
                "TROTH_SERVER": self.server.address,
                "OUTBOX": str(self.outbox),
                "GATEWAY_URL": self.gateway_url,
            },
        )

    def start_gateway(self, port: int) -> None:
        # cd examples/human_in_the_loop
        # TROTH_TOKEN=$(cat gateway.token) TROTH_SERVER=... EDITORS=alice,bob
        #   uvicorn gateway:app --host 127.0.0.1 --port 8000
        self.gateway = self._spawn(
            "gateway",
            [
                sys.executable,
                str(BIN / "uvicorn"),
                "gateway:app",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            {
                "TROTH_TOKEN": self.tokens["gateway.token"],
                "TROTH_SERVER": self.server.address,
                "EDITORS": "alice,bob",
            },
        )

    def as_(self, who: str) -> dict[str, str]:
        """The header of a request made by `who` (ALICE="authorization: Bearer ...")."""
        return {"authorization": f"Bearer {self.tokens[f'{who}.token']}"}

    def gateway_log(self) -> Path:
        return next(log for log in self.logs if log.name.startswith("gateway-"))

    def describe(self) -> str:
        parts = [
            f"--- {log.name} ---\n{log.read_text(errors='replace')[-3000:]}" for log in self.logs
        ]
        parts.append(f"--- server ---\n{self.server.log()[-3000:]}")
        parts.append(f"--- outbox ---\n{notifications(self.outbox)}")
        return "\n".join(parts)


def stop(proc: subprocess.Popen[bytes] | None) -> int | None:
    """SIGTERM (what Ctrl-C in the README's terminal amounts to) and wait (killed, and
    TimeoutError, after 30 s); reaped either way."""
    return None if proc is None else stop_process(proc, 30)


def notifications(outbox: Path, post: str | None = None) -> list[dict[str, Any]]:
    if not outbox.exists():
        return []
    sent = [json.loads(line) for line in outbox.read_text(encoding="utf-8").splitlines()]
    return [n for n in sent if post is None or n["post"] == post]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("human-in-the-loop")
    tokens = mint_tokens(workdir)
    # troth serve --auth-tokens tokens.toml --listen ... --db sqlite:///...
    server = start_server(workdir, "--auth-tokens", str(workdir / "tokens.toml"))
    port = free_port()
    running = Stack(workdir, server, workdir / "outbox.jsonl", f"http://127.0.0.1:{port}", tokens)
    try:
        running.start_worker()
        running.start_gateway(port)

        def ready() -> bool | None:
            assert running.gateway is not None and running.gateway.poll() is None, (
                f"the gateway exited\n{running.describe()}"
            )
            try:
                return httpx.get(f"{running.gateway_url}/approvals", timeout=5).is_success or None
            except httpx.TransportError:
                return None

        eventually(ready, "the gateway to answer", timeout=30, detail=running.describe)
        yield running
    finally:
        try:
            codes = (stop(running.gateway), stop(running.worker))
        finally:
            for proc in (running.gateway, running.worker):
                if proc is not None:
                    reap(proc)
            server_code = server.stop()
    # uvicorn re-raises the SIGTERM it handled once it has shut down cleanly.
    gateway_code, worker_code = codes
    assert gateway_code in (0, -signal.SIGTERM), (
        f"gateway exit {gateway_code}\n{running.describe()}"
    )
    assert "Application shutdown complete" in running.gateway_log().read_text(), running.describe()
    assert worker_code == 0, f"worker exit {worker_code}\n{running.describe()}"
    assert server_code == 0, server.log()[-3000:]


@pytest.fixture
def http(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.gateway_url, timeout=30) as client:
        yield client


def pending_approval(http: httpx.Client, post: str) -> dict[str, Any] | None:
    response = http.get("/approvals")
    assert response.status_code == 200, response.text
    found = [a for a in response.json() if a["post"] == post]
    assert len(found) <= 1, found
    return found[0] if found else None


def finished(http: httpx.Client, post: str) -> dict[str, Any]:
    """The workflow's view once it is no longer PENDING (long-polling `?wait=`)."""

    def probe() -> dict[str, Any] | None:
        response = http.get(f"/posts/{post}", params={"wait": 5})
        assert response.status_code == 200, response.text
        view: dict[str, Any] = response.json()
        return None if view["state"] == "PENDING" else view

    return eventually(probe, f"workflow publish-{post} to finish", timeout=30)


def start(http: httpx.Client, post: str, **body: Any) -> dict[str, Any]:
    response = http.post(f"/posts/{post}/publish", json=body or None)
    assert response.status_code == 202, response.text
    view: dict[str, Any] = response.json()
    assert view["workflow_id"] == f"publish-{post}"
    return view


def test_approve_completes_once_and_a_second_click_is_told_how_it_was_settled(
    stack: Stack, http: httpx.Client
) -> None:
    post = "post-7"
    first, second = start(http, post), start(http, post)
    assert second["started_at"] == first["started_at"], "a second start made a new execution"

    approval = eventually(
        lambda: pending_approval(http, post), "the pending approval", detail=stack.describe
    )
    assert approval["id"] == "publish-post-7.0"
    assert approval["workflow_id"] == "publish-post-7"
    assert approval["state"] == "PENDING" and approval["expires_at"]

    sent = eventually(
        lambda: notifications(stack.outbox, post) or None, "the notification", detail=stack.describe
    )
    assert sent[0]["approval_id"] == approval["id"]
    assert sent[0]["approve"] == f"{stack.gateway_url}/approvals/publish-post-7.0/approve"

    assert approval["approvers"] == ["alice", "bob"]
    # alice's inbox holds it (the server checked the policy for her).
    inbox = http.get("/approvals", headers=stack.as_("alice"))
    assert approval["id"] in [a["id"] for a in inbox.json()], inbox.text
    # The gateway's own token is no editor's: the server refuses it.
    anonymous = http.post(f"/approvals/{approval['id']}/approve")
    assert anonymous.status_code == 403, anonymous.text
    assert anonymous.json()["reason"] == "NOT_AN_APPROVER"
    assert "rule approvers" in anonymous.json()["detail"]

    decision = {"reviewer": "alice", "comment": "ship it"}
    approved = http.post(
        f"/approvals/{approval['id']}/approve", json=decision, headers=stack.as_("alice")
    )
    assert approved.status_code == 200, approved.text
    assert approved.json()["applied"] is True
    assert approved.json()["approval"]["state"] == "RESOLVED"
    assert approved.json()["approval"]["settled_by"] == "alice"

    view = finished(http, post)
    assert view["state"] == "RESOLVED", view
    assert view["result"] == {
        "post": post,
        "approval_id": "publish-post-7.0",
        "status": "approved",
        "decision": {"approved": True, **decision},
        "approved_by": "alice",
    }
    assert pending_approval(http, post) is None

    for action in ("approve", "reject"):
        again = http.post(
            f"/approvals/{approval['id']}/{action}",
            json={"reviewer": "bob"},
            headers=stack.as_("bob"),
        )
        assert again.status_code == 409, again.text
        body = again.json()
        assert body["reason"] == "ALREADY_SETTLED"
        assert body["approval"]["state"] == "RESOLVED"
        assert body["approval"]["outcome"] == "approved"
        assert body["approval"]["settled_at"] == approved.json()["approval"]["settled_at"]
        assert body["approval"]["decision"] == {"approved": True, **decision}
        assert "already approved" in body["detail"] and "alice" in body["detail"]

    # Nothing changed, and the notification went out exactly once.
    assert finished(http, post)["result"]["status"] == "approved"
    assert len(notifications(stack.outbox, post)) == 1, stack.describe()


def test_a_retried_click_with_its_idempotency_key_succeeds_without_effect(
    stack: Stack, http: httpx.Client
) -> None:
    post = "post-retry"
    start(http, post)
    approval = eventually(
        lambda: pending_approval(http, post), "the pending approval", detail=stack.describe
    )
    headers = {"Idempotency-Key": "click-42", **stack.as_("bob")}
    first = http.post(f"/approvals/{approval['id']}/approve", headers=headers)
    again = http.post(f"/approvals/{approval['id']}/approve", headers=headers)
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert (first.json()["applied"], again.json()["applied"]) == (True, False)
    assert finished(http, post)["result"]["status"] == "approved"


def test_reject_is_reflected_in_the_result(stack: Stack, http: httpx.Client) -> None:
    post = "post-8"
    start(http, post)
    approval = eventually(
        lambda: pending_approval(http, post), "the pending approval", detail=stack.describe
    )
    decision = {"reviewer": "bob", "comment": "needs sources"}
    rejected = http.post(
        f"/approvals/{approval['id']}/reject", json=decision, headers=stack.as_("bob")
    )
    assert rejected.status_code == 200, rejected.text
    assert rejected.json()["approval"]["state"] == "REJECTED"

    view = finished(http, post)
    assert view["state"] == "RESOLVED", view  # the workflow caught the rejection
    assert view["result"]["status"] == "rejected"
    assert view["result"]["decision"] == {"approved": False, **decision}

    late = http.post(f"/approvals/{approval['id']}/approve", headers=stack.as_("alice"))
    assert late.status_code == 409, late.text
    assert late.json()["approval"]["outcome"] == "rejected"
    assert "already rejected" in late.json()["detail"]
    assert len(notifications(stack.outbox, post)) == 1


def test_an_approval_that_times_out_is_reflected_in_the_result(
    stack: Stack, http: httpx.Client
) -> None:
    post = "post-9"
    start(http, post, approval_timeout_seconds=1)
    view = finished(http, post)
    assert view["state"] == "RESOLVED", view
    assert view["result"]["status"] == "timed_out"
    assert view["approval"]["state"] == "REJECTED_TIMEDOUT"

    late = http.post(f"/approvals/{view['approval']['id']}/approve", headers=stack.as_("alice"))
    assert late.status_code == 409, late.text
    assert late.json()["approval"]["outcome"] == "timed_out"
    assert len(notifications(stack.outbox, post)) == 1


def test_concurrent_starts_make_one_execution(stack: Stack, http: httpx.Client) -> None:
    post = "post-10"
    with ThreadPoolExecutor(8) as pool:
        views = list(pool.map(lambda _: start(http, post), range(8)))
    assert {(v["workflow_id"], v["started_at"]) for v in views} == {
        ("publish-post-10", views[0]["started_at"])
    }
    # A start of the same post with another timeout is no repeat: 409, saying so.
    other = http.post(f"/posts/{post}/publish", json={"approval_timeout_seconds": 60})
    assert other.status_code == 409, other.text
    assert other.json()["reason"] == "WORKFLOW_ALREADY_EXISTS"
    assert "already exists as 'publish' with other arguments" in other.json()["detail"]
    approval = eventually(
        lambda: pending_approval(http, post), "the pending approval", detail=stack.describe
    )
    eventually(lambda: notifications(stack.outbox, post) or None, "the notification")
    approved = http.post(f"/approvals/{approval['id']}/approve", headers=stack.as_("alice"))
    assert approved.status_code == 200
    assert finished(http, post)["result"]["status"] == "approved"
    assert len(notifications(stack.outbox, post)) == 1, stack.describe()


def test_a_workflow_waiting_survives_its_worker(stack: Stack, http: httpx.Client) -> None:
    post = "post-11"
    start(http, post)
    approval = eventually(
        lambda: pending_approval(http, post), "the pending approval", detail=stack.describe
    )
    eventually(lambda: notifications(stack.outbox, post) or None, "the notification")
    # Kill it only once the notification step is recorded: until then, sending
    # again is the documented at-least-once behaviour, not what this test is about.
    with Client(stack.server.address, token=stack.tokens["gateway.token"]) as troth:

        def recorded() -> bool | None:
            # The step writes the notification, then its record is created: a moment
            # after the outbox shows it, the step promise may not exist yet.
            try:
                return troth.get(f"publish-{post}.1").is_settled or None
            except NotFoundError:
                return None

        eventually(recorded, "the notification step to be recorded")

    assert stack.worker is not None
    stack.worker.kill()  # SIGKILL while the workflow waits for the human
    stack.worker.wait(10)
    stack.start_worker()  # another worker of the group, sharing nothing with the first

    approved = http.post(f"/approvals/{approval['id']}/approve", headers=stack.as_("bob"))
    assert approved.status_code == 200
    assert finished(http, post)["result"]["approved_by"] == "bob"
    assert len(notifications(stack.outbox, post)) == 1, stack.describe()


def test_unknown_ids_are_404_and_only_approvals_can_be_settled(
    stack: Stack, http: httpx.Client
) -> None:
    assert http.get("/posts/never-started").status_code == 404
    assert http.post("/approvals/no-such-promise/approve").status_code == 404
    assert http.post("/approvals/no-such-promise/reject").status_code == 404

    post = "post-12"
    start(http, post)
    eventually(lambda: pending_approval(http, post), "the pending approval", detail=stack.describe)
    root = http.post(f"/approvals/publish-{post}/approve")  # a workflow's root is no approval
    assert root.status_code == 404, root.text
    assert http.get(f"/posts/{post}").json()["state"] == "PENDING"
    assert (
        http.post(f"/approvals/publish-{post}.0/reject", headers=stack.as_("bob")).status_code
        == 200
    )
    assert finished(http, post)["result"]["status"] == "rejected"


def test_four_eyes_the_author_may_not_approve_their_own_post(
    stack: Stack, http: httpx.Client
) -> None:
    # curl -X POST .../posts/post-bob/publish -H "$BOB": bob is the workflow's starter.
    post = "post-bob"
    response = http.post(f"/posts/{post}/publish", headers=stack.as_("bob"))
    assert response.status_code == 202, response.text
    approval = eventually(
        lambda: pending_approval(http, post), "the pending approval", detail=stack.describe
    )
    # Not in bob's inbox, in alice's.
    mine = [a["id"] for a in http.get("/approvals", headers=stack.as_("bob")).json()]
    theirs = [a["id"] for a in http.get("/approvals", headers=stack.as_("alice")).json()]
    assert approval["id"] not in mine and approval["id"] in theirs
    own = http.post(f"/approvals/{approval['id']}/approve", headers=stack.as_("bob"))
    assert own.status_code == 403, own.text
    assert own.json()["reason"] == "NOT_AN_APPROVER"
    assert "rule not_requester" in own.json()["detail"]
    other = http.post(f"/approvals/{approval['id']}/approve", headers=stack.as_("alice"))
    assert other.status_code == 200, other.text
    view = finished(http, post)
    assert view["result"]["approved_by"] == "alice"
    assert view["approval"]["settled_by"] == "alice"


def test_a_token_the_server_does_not_know_is_401(stack: Stack, http: httpx.Client) -> None:
    forged = {"authorization": "Bearer troth_0000000000000000_not-a-secret"}
    assert http.get("/approvals", headers=forged).status_code == 401
    assert http.get("/approvals", headers={"authorization": "Basic abc"}).status_code == 401
