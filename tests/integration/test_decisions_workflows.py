"""The workflow reads who approved, with a real server (token-file authentication on)
and a real Worker: `ctx.decision(approval)` and `ctx.at_least(..., distinct=True,
decisions=True)` give each decision's authenticated `settled_by`, recorded by the
server, and a resumed (replayed) run reads the same.
"""

from __future__ import annotations

import uuid
from collections.abc import Generator, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from _auth import Grant, write_token_file
from _support import eventually, start_server

from troth import Approvers, Client, Context, PromiseState, Worker

if TYPE_CHECKING:
    from _support import ServerProcess

GROUP = "decisions"
EDITORS = ["alice", "bob", "carol"]


def sign_off(ctx: Context, amount: int) -> Generator[Any, Any, dict[str, Any]]:
    policy = Approvers(principals=EDITORS, not_requester=True, distinct=True)
    votes = []
    for _ in range(3):
        votes.append((yield ctx.promise(approvers=policy, title=f"approve {amount}")))
    quorum = yield ctx.at_least(2, votes, distinct=True, decisions=True)
    final = yield ctx.promise(approvers=Approvers(principals=["carol"]), title="release")
    release = yield ctx.decision(final)
    return {
        "quorum": [(d.promise_id, d.settled_by, d.value) for d in quorum],
        "released_by": release.settled_by,
        "released_at": release.settle_time.isoformat() if release.settle_time else None,
    }


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ServerProcess, dict[str, str]]]:
    workdir = tmp_path_factory.mktemp("decisions")
    tokens = write_token_file(
        workdir / "tokens.toml",
        [
            Grant("sign-off-worker", ("worker",), (GROUP,)),
            Grant("requester", ("gateway",)),
            *(Grant(name, ("gateway",)) for name in EDITORS),
        ],
    )
    server = start_server(workdir, "--auth-tokens", str(workdir / "tokens.toml"))
    yield server, tokens
    assert server.stop() == 0, server.log()[-3000:]


def test_the_workflow_reads_who_approved(stack: tuple[ServerProcess, dict[str, str]]) -> None:
    server, tokens = stack
    wid = f"sign-off-{uuid.uuid4().hex[:8]}"

    def client(name: str) -> Client:
        return Client(server.address, timeout=10, token=tokens[name])

    with (
        client("sign-off-worker") as worker_client,
        client("requester") as requester,
        client("alice") as alice,
        client("bob") as bob,
        client("carol") as carol,
    ):
        worker = Worker(worker_client, group=GROUP, lease=timedelta(seconds=5))
        worker.workflow(sign_off)
        worker.start()
        try:
            handle = requester.start("sign_off", 500, id=wid, group=GROUP)
            eventually(lambda: all(_pending(requester, f"{wid}.{i}") for i in range(3)))
            bob.resolve(f"{wid}.1", {"ok": True})
            carol.resolve(f"{wid}.2", "fine")
        finally:
            worker.stop()  # the run resumes on a new worker: a replay from the record

        worker = Worker(worker_client, group=GROUP, lease=timedelta(seconds=5))
        worker.workflow(sign_off)
        worker.start()
        try:
            eventually(lambda: _pending(requester, f"{wid}.3"))
            carol.resolve(f"{wid}.3", "go")
            result = handle.result(timeout=30)
        finally:
            worker.stop()
        # The vote nobody cast was cancelled with the run (DESIGN §4 rule 11).
        assert alice.get(f"{wid}.0").state is PromiseState.REJECTED_CANCELED

    assert result["quorum"] == [[f"{wid}.1", "bob", {"ok": True}], [f"{wid}.2", "carol", "fine"]]
    assert result["released_by"] == "carol"
    assert result["released_at"] is not None


def _pending(client: Client, promise_id: str) -> bool:
    try:
        return client.get(promise_id).state is PromiseState.PENDING
    except Exception:
        return False
