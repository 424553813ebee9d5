"""Approver policy and settle tokens from a workflow, with a real server and Worker:
four-eyes and a distinct quorum on `ctx.promise(approvers=...)`, and a link minted
with `handle.settle_token(acts_for=...)` that is recorded once, works with no other
credential and counts as its approver's.
"""

from __future__ import annotations

import uuid
from collections.abc import Generator, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from _support import append, eventually, lines, start_server

from troth import Approvers, Client, Context, PermissionDeniedError, Worker
from troth.errors import Reason
from troth_server.settle_keys import new_keys_file

if TYPE_CHECKING:
    from pathlib import Path

    from _support import ServerProcess

LINKS: list[str] = []  # the file `send_link` appends to, set by the fixture


def send_link(promise_id: str, token: str) -> str:
    return append(LINKS[0], f"{promise_id} {token}")


def budget(ctx: Context, amount: int) -> Generator[Any, Any, list[Any]]:
    policy = Approvers(not_requester=True, distinct=True)
    approvals = []
    for _ in range(3):
        approvals.append((yield ctx.promise(approvers=policy, title=f"approve {amount}")))
    # A link for carol: the worker's principal (the local developer) is a gateway.
    token = yield approvals[0].settle_token(
        outcomes=["resolve"], ttl=timedelta(hours=1), acts_for="carol"
    )
    yield ctx.run(send_link, approvals[0].id, token)
    return (yield ctx.at_least(2, approvals, distinct=True))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("server")
    keys = workdir / "keys.json"
    keys.write_text(new_keys_file(["k1"]))
    proc = start_server(workdir, "--settle-token-keys", str(keys))
    yield proc
    assert proc.stop() == 0, proc.log()[-3000:]


@pytest.fixture(scope="module")
def links(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("links") / "links.txt"
    path.touch()
    LINKS[:] = [str(path)]
    return path


@pytest.fixture(scope="module")
def worker(server: ServerProcess, links: Path) -> Iterator[Worker]:
    with Client(server.address, timeout=10, principal="budget-worker") as client:
        w = Worker(client, group="budgets", lease=timedelta(seconds=5))
        w.workflow(budget)
        w.start()
        yield w
        w.stop()


def test_a_quorum_of_distinct_approvers_and_a_mailed_link(
    server: ServerProcess, worker: Worker, links: Path
) -> None:
    wid = f"budget-{uuid.uuid4().hex[:8]}"
    with (
        Client(server.address, timeout=10, principal="alice") as alice,
        Client(server.address, timeout=10, principal="bob") as bob,
        Client(server.address, timeout=10) as gateway,
    ):
        handle = alice.start("budget", 500, id=wid, group="budgets")
        eventually(lambda: any(line.startswith(f"{wid}.0 ") for line in lines(links)))
        token = next(line.split()[1] for line in lines(links) if line.startswith(f"{wid}.0 "))
        step = alice.get(f"{wid}.1")
        assert step.started_by == "alice"
        assert step.approvers == Approvers(not_requester=True, distinct=True)
        # Four-eyes: the starter may not approve.
        with pytest.raises(PermissionDeniedError) as refused:
            alice.resolve(f"{wid}.1", {"ok": True})
        assert (refused.value.reason, refused.value.metadata["rule"]) == (
            Reason.NOT_AN_APPROVER,
            "not_requester",
        )
        bob.resolve(f"{wid}.1", {"ok": True})
        # One person cannot fill the quorum.
        with pytest.raises(PermissionDeniedError) as refused:
            bob.resolve(f"{wid}.2", {"ok": True})
        assert refused.value.metadata["rule"] == "distinct"
        # The link: no principal, no role, only the token; the settle is carol's.
        settled = gateway.resolve(f"{wid}.0", {"ok": "by link"}, settle_token=token)
        assert settled.promise.settled_by.startswith("carol via settle-token k1:")
        assert handle.result(timeout=30) == [{"ok": True}, {"ok": "by link"}]
        # Replays did not mint another token: one link sent, the step holds it.
        sent = [line for line in lines(links) if line.startswith(f"{wid}.0 ")]
        assert sent == [f"{wid}.0 {token}"]
        assert gateway.decode(gateway.get(f"{wid}.3").value) == token
