"""examples/agent_approval, run as its README says: a server, `python worker.py`,
`python start.py`, approvals settled with the `troth` CLI, `python report.py`.

What it shows, each claim checked on the journal the example's side effects
append to (one line per model call, tool run and published post):

- after an approval, the model is not called again for the turns recorded
  before it, even by a new worker that replays the run from scratch;
- the tools that ran beside the waiting `publish` in its turn are not run again;
- a rejection reaches the model as a declined tool result, and the model adapts;
- the turn count and the token budget survive the wait: a run that resumes
  with its budget (or its turns) spent stops on that rule, without calling the model;
- two approvals in one turn both wait, and both must be settled before the next model call;
- with authentication on, as the README sets it up: only the editor named by the
  approvals' policy may decide (the gateway's token is refused), the editor's
  inbox (`--mine`) lists them, and the report says who approved each post.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest
from _support import ServerProcess, reap, spawn, start_server, stop

from troth import Client, Promise, PromiseState

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "agent_approval"
BIN = Path(sys.executable).parent
TOPIC = "troth 1.0"

pytestmark = pytest.mark.e2e

T = TypeVar("T")


def _load_scripted_model() -> ModuleType:
    # The model is pure, so the test can ask it what a turn costs.
    spec = importlib.util.spec_from_file_location(
        "agent_approval_scripted_model", EXAMPLE / "scripted_model.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def eventually(probe: Callable[[], T | None], what: str, detail: Callable[[], str] = str) -> T:
    """Call `probe` until it returns something other than None; fail after 15 s."""
    deadline = time.monotonic() + 15
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{detail()}")
        time.sleep(0.02)


PARTIES = (
    # troth tokens new --name NAME --roles ROLES [--groups G] --token-out FILE >> tokens.toml
    ("agent-worker", "worker", "agents", "worker.token"),
    ("agent-gateway", "gateway", None, "gateway.token"),
    ("editor", "gateway", None, "editor.token"),
)


def mint_tokens(workdir: Path) -> dict[str, str]:
    """The README's `troth tokens new` lines; returns token file name -> token."""
    tokens: dict[str, str] = {}
    with (workdir / "tokens.toml").open("ab") as toml:
        for name, roles, groups, out in PARTIES:
            command = [str(BIN / "troth"), "tokens", "new", "--name", name, "--roles", roles]
            command += ["--groups", groups] if groups else []
            subprocess.run(
                [*command, "--token-out", out], cwd=workdir, stdout=toml, timeout=60, check=True
            )
            tokens[out] = (workdir / out).read_text().strip()
    return tokens


@dataclass
class Stack:
    """The server and a worker, started with the README's commands; the scripts and the
    CLI (`troth approvals ...`) run against them as the README runs them."""

    workdir: Path
    server: ServerProcess
    client: Client
    tokens: dict[str, str]
    worker: subprocess.Popen[bytes] | None = None
    logs: list[Path] = field(default_factory=list)

    @property
    def journal(self) -> Path:
        return self.workdir / "journal.jsonl"

    @property
    def env(self) -> dict[str, str]:
        # export TROTH_TOKEN=$(cat gateway.token): the scripts run as the gateway
        return {
            **os.environ,
            "TROTH_TOKEN": self.tokens["gateway.token"],
            "TROTH_SERVER": self.server.address,
            "AGENT_JOURNAL": str(self.journal),
        }

    def start_worker(self) -> None:
        # cd examples/agent_approval
        # TROTH_TOKEN=$(cat worker.token) TROTH_SERVER=... AGENT_JOURNAL=... python worker.py
        log = self.workdir / f"worker-{len(self.logs)}.log"
        self.logs.append(log)
        env = {**self.env, "TROTH_TOKEN": self.tokens["worker.token"]}
        with log.open("wb") as out:
            self.worker = spawn(
                [sys.executable, "worker.py"], cwd=EXAMPLE, stdout=out, stderr=out, env=env
            )

    def kill_worker(self) -> None:
        """SIGKILL: the worker's cache of suspended runs dies with it; a new one must replay."""
        assert self.worker is not None
        self.worker.send_signal(signal.SIGKILL)
        reap(self.worker)

    def python(self, script: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, script, *args],
            cwd=EXAMPLE,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
        )

    def start(self, run_id: str, *channels: str, extra: tuple[str, ...] = ()) -> None:
        # python start.py agent-1 "troth 1.0" --channel blog --channel newsletter
        flags = [arg for channel in channels for arg in ("--channel", channel)]
        done = self.python("start.py", run_id, TOPIC, *flags, *extra)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"started {run_id}"), done.stdout

    def troth(self, *args: str, token: str = "editor.token") -> subprocess.CompletedProcess[str]:
        # troth --token-file editor.token approvals ...: the editor decides
        token_file = str(self.workdir / token)
        return subprocess.run(
            [
                str(BIN / "troth"),
                "--server",
                self.server.address,
                "--token-file",
                token_file,
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )

    def approve(self, approval_id: str, decision: dict[str, Any]) -> None:
        # troth approvals approve ID --value '{"approved": true, "channel": "blog"}'
        done = self.troth("approvals", "approve", approval_id, "--value", json.dumps(decision))
        assert done.returncode == 0, done.stderr

    def reject(self, approval_id: str, reason: str) -> None:
        # troth approvals reject ID --reason "off-brand"
        done = self.troth("approvals", "reject", approval_id, "--reason", reason)
        assert done.returncode == 0, done.stderr

    def report(self, run_id: str) -> dict[str, Any]:
        # python report.py agent-1 --wait 30 --json
        done = self.python("report.py", run_id, "--wait", "20", "--json")
        assert done.returncode == 0, f"{done.stderr}\n{self.describe()}"
        report: dict[str, Any] = json.loads(done.stdout)
        return report

    def events(self, run_id: str) -> list[dict[str, Any]]:
        if not self.journal.exists():
            return []
        lines = self.journal.read_text(encoding="utf-8").splitlines()
        return [e for e in map(json.loads, lines) if e["agent"] == run_id]

    def model_turns(self, run_id: str) -> list[int]:
        """The turns for which the model was really called, in call order."""
        return [e["turn"] for e in self.events(run_id) if e["event"] == "model"]

    def tool_runs(self, run_id: str) -> collections.Counter[tuple[str, str]]:
        """How often each tool call really ran: (call id, tool) -> runs."""
        return collections.Counter(
            (e["call"], e["tool"]) for e in self.events(run_id) if e["event"] == "tool"
        )

    def published(self, run_id: str) -> list[tuple[str, str]]:
        return [(e["call"], e["channel"]) for e in self.events(run_id) if e["event"] == "published"]

    def pending_approvals(self, run_id: str, count: int) -> list[Promise]:
        """Wait until `count` approvals of the run are pending; they are the run's
        publish gates (`troth promises search 'RUN.*' --tag approval=publish --state PENDING`)."""

        def probe() -> list[Promise] | None:
            page = self.client.search(
                f"{run_id}.*", tags={"approval": "publish"}, states=[PromiseState.PENDING]
            )
            return list(page.promises) if len(page.promises) == count else None

        return eventually(probe, f"{count} pending approvals of {run_id}", self.describe)

    def settled(self, promise_id: str) -> Promise:
        promise = self.client.wait(promise_id, timeout=15)
        assert promise.state is PromiseState.RESOLVED, promise
        return promise

    def parked(self, run_id: str) -> bool:
        """Whether run `run_id` is suspended: it waits on callbacks and no task of it is
        pending or leased (read-only, from the server's SQLite file; for tests only)."""
        path = self.server.db_url.removeprefix("sqlite:///")
        query = """
            SELECT EXISTS (SELECT 1 FROM callbacks WHERE root_promise_id = :root)
               AND NOT EXISTS (SELECT 1 FROM tasks WHERE root_promise_id = :root
                               AND state IN ('PENDING', 'CLAIMED'))
        """
        with contextlib.closing(
            sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
        ) as db:
            (answer,) = db.execute(query, {"root": run_id}).fetchone()
        return bool(answer)

    def describe(self) -> str:
        parts = [
            f"--- {log.name} ---\n{log.read_text(errors='replace')[-3000:]}" for log in self.logs
        ]
        parts.append(f"--- server ---\n{self.server.log()[-2000:]}")
        if self.journal.exists():
            parts.append(f"--- journal ---\n{self.journal.read_text()[-3000:]}")
        return "\n".join(parts)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("agent-approval")
    tokens = mint_tokens(workdir)
    # troth serve --auth-tokens tokens.toml --listen ... --db sqlite:///...
    server = start_server(workdir, "--auth-tokens", str(workdir / "tokens.toml"))
    worker_code: int | None = None
    with Client(server.address, token=tokens["gateway.token"]) as client:
        running = Stack(workdir, server, client, tokens)
        try:
            running.start_worker()
            yield running
        finally:
            try:
                if running.worker is not None:  # SIGTERM: Ctrl-C in the README's terminal
                    worker_code = stop(running.worker, 30)
            finally:
                server_code = server.stop()
    assert worker_code == 0, f"worker exit {worker_code}\n{running.describe()}"
    assert server_code == 0, server.log()[-3000:]


def test_after_an_approval_no_recorded_turn_or_finished_tool_runs_again(stack: Stack) -> None:
    run = "agent-a"
    stack.start(run, "blog")
    [approval] = stack.pending_approvals(run, 1)
    assert approval.id == f"{run}.call-2-1.approval"
    assert approval.title == "Publish on blog?"
    assert approval.message.startswith(f"{TOPIC}: what changed this week")
    # Its sibling in the same turn (the blog's audience) finished while it waits.
    assert stack.client.wait(f"{run}.call-2-2", timeout=15).state is PromiseState.RESOLVED
    assert stack.model_turns(run) == [1, 2]
    # python report.py agent-1: still running, and what it waits for, with the draft.
    running = stack.python("report.py", run)
    assert running.returncode == 3, running.stderr
    assert f"waiting: {approval.id}  Publish on blog?\n    {TOPIC}: what" in running.stdout

    # The editor's inbox lists it; the gateway's token may not decide it.
    inbox = stack.troth("--json", "approvals", "list", "--mine")
    assert inbox.returncode == 0, inbox.stderr
    assert approval.id in [json.loads(line)["id"] for line in inbox.stdout.splitlines()]
    assert approval.approvers is not None and list(approval.approvers.principals) == ["editor"]
    refused = stack.troth(
        "approvals", "approve", approval.id, "--value", '{"approved": true, "channel": "blog"}',
        token="gateway.token",
    )  # fmt: skip
    assert refused.returncode == 1, refused.stderr
    assert "rule approvers" in refused.stderr and "agent-gateway" in refused.stderr
    theirs = stack.troth("--json", "approvals", "list", "--mine", token="gateway.token")
    assert approval.id not in theirs.stdout

    # A new worker, sharing nothing with the first, takes the run over.
    stack.kill_worker()
    stack.start_worker()

    # The approval is typed: a decision of the wrong shape is refused, naming the field.
    wrong = stack.troth(
        "approvals", "approve", approval.id, "--value", '{"approved": "yes", "channel": "blog"}'
    )
    assert wrong.returncode == 1, wrong.stderr
    assert "value.approved" in wrong.stderr and "boolean" in wrong.stderr, wrong.stderr
    stack.approve(approval.id, {"approved": True, "channel": "blog", "note": "ship it"})

    report = stack.report(run)
    assert report["status"] == "done", report
    assert report["turns"] == 3
    assert report["published"] == [
        {"channel": "blog", "url": f"https://example.com/blog/{run}", "approved_by": "editor"}
    ]
    assert report["answer"].startswith(f"Published on blog: https://example.com/blog/{run}")

    # Turns 1 and 2 were recorded before the wait: the model was called for
    # each turn exactly once, though the new worker replayed the whole run.
    assert stack.model_turns(run) == [1, 2, 3], stack.describe()
    assert stack.tool_runs(run) == {
        ("call-1-1", "search_web"): 1,
        ("call-1-2", "fetch_stats"): 1,
        ("call-2-2", "fetch_stats"): 1,  # the sibling of the publish that waited
    }, stack.describe()
    assert stack.published(run) == [("call-2-1", "blog")]


def test_a_rejection_reaches_the_model_which_revises_the_draft(stack: Stack) -> None:
    run = "agent-c"
    stack.start(run, "blog")
    [first] = stack.pending_approvals(run, 1)
    stack.reject(first.id, "off-brand")

    [second] = stack.pending_approvals(run, 1)
    assert second.id == f"{run}.call-3-1.approval"  # the model asked again, in turn 3
    assert second.message.endswith("Revised after review: off-brand."), second.message
    assert stack.published(run) == []
    stack.approve(second.id, {"approved": True, "channel": "blog"})

    report = stack.report(run)
    assert report["status"] == "done", report
    publishes = [m for m in report["transcript"] if m["role"] == "tool" and m["name"] == "publish"]
    assert [m["content"].get("declined") for m in publishes] == ["off-brand", None]
    assert report["answer"].startswith("Published on blog after a revision (off-brand)")
    assert stack.model_turns(run) == [1, 2, 3, 4]
    assert stack.published(run) == [("call-3-1", "blog")]


def test_the_budget_and_the_turn_count_survive_the_wait(stack: Stack) -> None:
    model = _load_scripted_model()
    first_turn = model.ScriptedModel().respond(model.opening(TOPIC, ["blog"]))["usage"]
    # Enough for turn 1 only: the turn that asks to publish spends the rest.
    budget = first_turn["input_tokens"] + first_turn["output_tokens"] + 1
    stack.start("agent-budget", "blog", extra=("--token-budget", str(budget)))
    stack.start("agent-turns", "blog", extra=("--max-turns", "2"))
    approvals = [stack.pending_approvals(run, 1)[0] for run in ("agent-budget", "agent-turns")]

    # Nothing of the runs stays in memory: the new worker recomputes both
    # limits from the recorded model answers.
    stack.kill_worker()
    stack.start_worker()
    for approval in approvals:
        stack.approve(approval.id, {"approved": True, "channel": "blog"})

    spent = stack.report("agent-budget")
    assert spent["status"] == "budget_exhausted", spent
    assert spent["turns"] == 2 and spent["tokens"] >= budget
    assert spent["stopped"] == f"token budget exhausted: {spent['tokens']} of {budget} tokens used"
    turns = stack.report("agent-turns")
    assert turns["status"] == "turn_limit", turns
    assert turns["stopped"] == "turn limit reached: 2 of 2 turns"
    for run, report in (("agent-budget", spent), ("agent-turns", turns)):
        # The turn's tools still ran (the editor approved); the model was not called after.
        assert report["published"] == [
            {"channel": "blog", "url": f"https://example.com/blog/{run}", "approved_by": "editor"}
        ]
        assert stack.model_turns(run) == [1, 2], stack.describe()


def test_two_approvals_in_one_turn_both_wait_and_both_must_settle(stack: Stack) -> None:
    run = "agent-e"
    stack.start(run, "blog", "newsletter")
    blog, newsletter = sorted(stack.pending_approvals(run, 2), key=lambda p: p.id)
    assert (blog.tags["channel"], newsletter.tags["channel"]) == ("blog", "newsletter")

    stack.approve(blog.id, {"approved": True, "channel": "blog"})
    stack.settled(f"{run}.call-2-1")  # the blog's publish tool finished...
    # ...and the run, resumed by it, is parked again on the other approval:
    # no model call, nothing published on the newsletter.
    eventually(lambda: stack.parked(run) or None, f"{run} to wait again", stack.describe)
    assert stack.model_turns(run) == [1, 2]
    assert stack.client.get(run).state is PromiseState.PENDING
    assert stack.client.get(newsletter.id).state is PromiseState.PENDING
    assert stack.published(run) == [("call-2-1", "blog")]

    # A decision that says no is a declined tool result too; the model revises.
    no = {"approved": False, "channel": "newsletter", "note": "too long for a newsletter"}
    done = stack.troth("promises", "resolve", newsletter.id, "--value", json.dumps(no))
    assert done.returncode == 0, done.stderr
    [again] = stack.pending_approvals(run, 1)
    assert again.id == f"{run}.call-3-1.approval" and again.tags["channel"] == "newsletter"
    assert stack.model_turns(run) == [1, 2, 3]
    stack.reject(again.id, "not this week")

    report = stack.report(run)
    assert report["status"] == "done", report
    assert report["answer"].startswith(f"Published on blog: https://example.com/blog/{run}")
    assert report["answer"].endswith("Not published on newsletter: not this week.")
    assert stack.model_turns(run) == [1, 2, 3, 4]
    assert stack.published(run) == [("call-2-1", "blog")]


def test_an_approval_nobody_decides_in_time_is_declined(stack: Stack) -> None:
    run = "agent-t"
    stack.start(run, "blog", extra=("--approval-timeout", "1"))
    report = stack.report(run)  # nobody decides, neither on the draft nor on its revision
    assert report["status"] == "done", report
    publishes = [m for m in report["transcript"] if m["role"] == "tool" and m["name"] == "publish"]
    assert [m["content"] for m in publishes] == [{"declined": "nobody decided in time"}] * 2
    assert report["answer"].endswith("Not published on blog: nobody decided in time.")
    assert stack.client.get(f"{run}.call-2-1.approval").state is PromiseState.REJECTED_TIMEDOUT
    assert stack.published(run) == []
