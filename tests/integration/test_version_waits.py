"""A run waiting for a version no connected worker runs is shown as such and can be moved
(issue 27 item 8). Real server, worker and console processes, on SQLite and PostgreSQL.

Two workflows park on v1's code, and v1 is stopped; v2 (the same commands up to the
approval) is deployed. The approvals are settled: the settle's reply, `troth workflows
show`, the console's workflow page (after the settle, through the console) and the
metrics say the runs wait for a worker of v1 (none connected since ...). One run is
moved to the current version with the console's button and finishes on v2; the other
is moved with `troth workflows move --to-version` to v3, whose code does not fit its
history, pauses there with a `NonDeterminismError`, and is failed.

This file, run as a script, is the worker (`python test_version_waits.py ADDRESS v1|v2|v3`).
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import socket
import sys
import urllib.request
from collections.abc import Generator, Iterator
from contextlib import ExitStack, redirect_stderr, redirect_stdout
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from troth import Client, Context, PromiseState, Worker
from troth._cli import main as troth_cli
from troth._versions import code_version

sys.path.insert(0, str(Path(__file__).parent.parent))

from _console import start_console
from _pg import fresh_schema
from _support import ServerProcess, eventually, start_server
from _workers import WorkerFleet, effect

GROUP = "moving"


def shout(line: str) -> str:
    return effect(line.upper())


def publish_v1(ctx: Context, post: str) -> Generator[Any, Any, dict[str, Any]]:
    approval = yield ctx.promise(timeout=timedelta(minutes=5))
    yield ctx.run(effect, f"{ctx.id} asked")
    decision = yield approval
    yield ctx.run(effect, f"{ctx.id} v1 published")
    return {"code": "v1", "post": post, "decision": decision}


def publish_v2(ctx: Context, post: str) -> Generator[Any, Any, dict[str, Any]]:
    # The same commands as v1 up to the approval: v1's histories replay on it.
    approval = yield ctx.promise(timeout=timedelta(minutes=5))
    yield ctx.run(effect, f"{ctx.id} asked")
    decision = yield approval
    yield ctx.run(effect, f"{ctx.id} v2 published")
    return {"code": "v2", "post": post, "decision": decision}


def publish_v3(ctx: Context, post: str) -> Generator[Any, Any, dict[str, Any]]:
    # Another function at step 1: v1's histories do not fit it.
    approval = yield ctx.promise(timeout=timedelta(minutes=5))
    yield ctx.run(shout, f"{ctx.id} asked")
    decision = yield approval
    return {"code": "v3", "post": post, "decision": decision}


CODE = {"v1": publish_v1, "v2": publish_v2, "v3": publish_v3}
V1, V2, V3 = (code_version(f) for f in (publish_v1, publish_v2, publish_v3))


def main(address: str, code: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with Client(address) as client:
        worker = Worker(
            client,
            group=GROUP,
            worker_id=f"{code}-{os.getpid()}",
            lease=timedelta(seconds=5),
            shutdown_grace=timedelta(seconds=5),
        )
        worker.workflow(name="publish")(CODE[code])
        worker.run()


# -- the test ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[ServerProcess, int]]:
    port = free_port()
    with ExitStack() as stack:
        db_url = stack.enter_context(fresh_schema()) if request.param == "postgres" else None
        proc = start_server(
            tmp_path / "server", "--sweep-interval", "200ms",
            "--metrics-listen", f"127.0.0.1:{port}", db_url=db_url,
        )  # fmt: skip
        yield proc, port
        proc.stop()


def logged(server: ServerProcess, event: str, worker_id: str) -> bool:
    for line in server.log().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == event and entry.get("worker_id") == worker_id:
            return True
    return False


def cli(server: ServerProcess, *args: str) -> tuple[int, str]:
    """Run `troth ARGS` against the server: its exit status, and its output and errors."""
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        status = troth_cli(["--server", server.address, *args])
    return status, out.getvalue()


def waiting_version(port: int, version: str) -> float | None:
    """`troth_tasks_waiting_for_version` for (GROUP, publish, version), or None if absent."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    wanted = {"group": GROUP, "workflow": "publish", "version": version}
    found = [
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "troth_tasks_waiting_for_version"
        for sample in family.samples
        if sample.labels == wanted
    ]
    return found[0] if found else None


def form_fields(page: str) -> dict[str, str]:
    return dict(re.findall(r'name="(csrf|key)" value="([^"]+)"', page))


WAITS_FOR_V1 = re.compile(
    rf"waiting for a worker of group {GROUP!r} running workflow 'publish' version {V1!r} "
    r"\(none connected since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ; connected here: 'publish' "
    rf"versions {V2!r}\)"
)


def test_a_run_waiting_for_its_version_is_shown_and_moved(
    server: tuple[ServerProcess, int], tmp_path: Path
) -> None:
    proc, metrics_port = server
    assert len({V1, V2, V3}) == 3
    fleet = WorkerFleet(tmp_path, __file__, proc.address)
    with ExitStack() as stack:
        stack.callback(fleet.stop_all)
        client = stack.enter_context(Client(proc.address, timeout=10))
        v1 = fleet.start("v1")
        ids = ["fits", "misfits"]
        handles = {i: client.start("publish", f"post {i}", id=i, group=GROUP) for i in ids}
        fleet.eventually(
            lambda: (
                all(fleet.counts()[f"{i} asked"] == 1 for i in ids)
                and all(client.get(i).workflow_version == V1 for i in ids)
            ),
            20,
            "both workflows to park on v1",
        )
        assert fleet.terminate(v1) == 0  # from here on, `eventually`: v1 exited (cleanly)
        eventually(lambda: logged(proc, "worker.disconnected", f"v1-{v1.pid}"), 15, "v1 gone")
        v2 = fleet.start("v2")
        eventually(lambda: logged(proc, "worker.connected", f"v2-{v2.pid}"), 15, "v2")

        # The settle's reply: recorded, and the run waits for a worker of v1.
        settled = client.resolve("fits.0", "approved")
        assert settled.applied and settled.promise.state is PromiseState.RESOLVED
        assert settled.workflow_waiting is not None, "the reply says nothing of the wait"
        assert WAITS_FOR_V1.fullmatch(settled.workflow_waiting), settled.workflow_waiting

        # `troth workflows show`.
        status, out = cli(proc, "workflows", "show", "fits")
        assert status == 0
        (waiting,) = [line for line in out.splitlines() if line.startswith("waiting:")]
        assert WAITS_FOR_V1.fullmatch(waiting.removeprefix("waiting:").strip()), out
        assert "troth workflows move fits --to-current" in out
        status, out = cli(proc, "--json", "workflows", "show", "fits")
        assert json.loads(out)["task"]["version_absent_since"] is not None

        # The metric (the live counts are read at most every 5 s).
        eventually(lambda: waiting_version(metrics_port, V1) == 1, 15, "the metric")

        # The console: a decision made there lands on the workflow page, which says so.
        console = start_console(tmp_path / "console", proc.address)
        stack.callback(console.stop)
        http = stack.enter_context(console.http())
        signin = http.get("/signin").text
        assert (
            http.post(
                "/signin", data={"name": "ops", "csrf": form_fields(signin)["csrf"]}
            ).status_code
            == 303
        )
        fields = form_fields(http.get("/promises/misfits.0").text)
        answer = http.post(
            "/settle/misfits.0",
            data={**fields, "action": "approve", "troth.raw": '"approved"'},
        )
        assert answer.status_code == 303, answer.text
        assert answer.headers["location"] == "/workflows/misfits?settled=misfits.0"
        page = http.get(answer.headers["location"]).text
        assert "Your decision on <code>misfits.0</code> was recorded." in page
        shown = re.search(r'<div class="waiting" id="version-wait"[^>]*>(.*?)</div>', page, re.S)
        assert shown, page
        words = " ".join(re.sub(r"<[^>]+>", " ", shown.group(1)).split())
        assert "The workflow cannot go on yet: waiting for a worker of group" in words, words
        assert f"version &#39;{V1}&#39; (none connected since" in words, words
        assert 'action="/move/misfits"' in page  # the operator's button
        eventually(lambda: waiting_version(metrics_port, V1) == 2, 15, "the metric, two")

        # Moved to the current version (the console's button): it runs on v2.
        fields = form_fields(http.get("/workflows/fits").text)
        moved = http.post("/move/fits", data={"csrf": fields["csrf"], "action": "to_current"})
        assert moved.status_code == 303, moved.text
        assert handles["fits"].result(timeout=30) == {
            "code": "v2", "post": "post fits", "decision": "approved",
        }  # fmt: skip
        assert client.get("fits").workflow_version == V2
        counts = fleet.counts()
        assert (counts["fits asked"], counts["fits v2 published"]) == (1, 1)
        assert counts["fits v1 published"] == 0

        # Moved to code that does not fit its history: it pauses, and is failed.
        v3 = fleet.start("v3")
        eventually(lambda: logged(proc, "worker.connected", f"v3-{v3.pid}"), 15, "v3")
        status, out = cli(proc, "workflows", "move", "misfits", "--to-version", V3)
        assert status == 0, out
        assert f"workflow misfits moved to version {V3!r}" in out

        def paused() -> bool:
            _, shown = cli(proc, "--json", "workflows", "show", "misfits")
            task = json.loads(shown)["task"]
            return bool(task and task["failed_attempts"] and "NonDeterminism" in task["last_error"])

        eventually(paused, 20, "the misfit to pause with a NonDeterminismError")
        assert client.get("misfits").state is PromiseState.PENDING
        assert fleet.counts()["MISFITS ASKED"] == 0  # v3 ran no step of it
        status, out = cli(proc, "workflows", "fail", "misfits", "--reason", "does not fit v3")
        assert status == 0, out
        assert client.get("misfits").state is PromiseState.REJECTED
        eventually(lambda: not waiting_version(metrics_port, V1), 15, "no run waits for v1")


def test_a_workflow_that_is_over_or_not_a_workflow_is_not_moved(
    server: tuple[ServerProcess, int],
) -> None:
    proc, _ = server
    with Client(proc.address, timeout=10) as client:
        client.create("plain", None)
        status, out = cli(proc, "workflows", "move", "plain", "--to-current")
        assert status != 0 and "is not a workflow" in out, out
        client.start("publish", "post x", id="over", group=GROUP)
        client.cancel("over")
        status, out = cli(proc, "workflows", "move", "over", "--to-version", "v9")
        assert status != 0 and "workflow 'over' is over (REJECTED_CANCELED)" in out, out


if __name__ == "__main__":
    main(*sys.argv[1:])
