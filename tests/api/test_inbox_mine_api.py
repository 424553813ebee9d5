"""The caller's inbox, `SearchPromises(mine=true)` / `troth approvals list --mine`, against
a real server with token-file authentication: each principal sees exactly the pending
promises it may settle now (approvers, four-eyes, distinct quorum, roles, prefixes),
and paging over the filtered rows neither loses nor repeats one.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Generator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from _auth import Grant, write_token_file
from _support import ServerProcess, eventually, start_server

from troth import Approvers, Client, Context, PromiseState, Worker
from troth._cli import main

GROUP = "inbox-mine"
PEOPLE = ("requester", "alice", "bob", "carol")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    workdir = tmp_path_factory.mktemp("inbox-mine")
    tokens = write_token_file(
        workdir / "tokens.toml",
        [
            Grant("inbox-worker", ("worker",), (GROUP,)),
            Grant("ops", ("operator",)),
            Grant("tenant", ("gateway",), prefixes=("acme-",)),
            *(Grant(name, ("gateway",)) for name in PEOPLE),
        ],
    )
    for name, token in tokens.items():
        (workdir / f"{name}.token").write_text(token + "\n")
    server = start_server(workdir, "--auth-tokens", str(workdir / "tokens.toml"))
    yield server, workdir
    assert server.stop() == 0, server.log()[-3000:]


def client(stack: tuple[ServerProcess, Path], name: str) -> Client:
    server, workdir = stack
    token = (workdir / f"{name}.token").read_text().strip()
    return Client(server.address, timeout=10, token=token)


def mine(c: Client, prefix: str, page_size: int | None = None) -> list[str]:
    return [p.id for p in c.search_all(f"{prefix}*", mine=True, page_size=page_size)]


def test_each_principal_sees_only_what_it_may_settle(stack: tuple[ServerProcess, Path]) -> None:
    run = f"acme-{uuid.uuid4().hex[:6]}-"
    with client(stack, "requester") as requester:
        made = {
            "open": None,
            "alice-only": Approvers(principals=["alice"]),
            "four-eyes": Approvers(not_requester=True),
            "alice-or-bob": Approvers(principals=["alice", "bob"], not_requester=True),
            "admins": Approvers(roles=["admin"]),
        }
        for name, policy in made.items():
            requester.create(run + name, ttl=timedelta(hours=1), approvers=policy)
        requester.create(run + "settled", ttl=timedelta(hours=1))
        requester.resolve(run + "settled", True)

        # Its own four-eyes promises are not its to settle; nor are those named for others.
        assert mine(requester, run) == [run + "open"]
    expected = {
        "alice": {"open", "alice-only", "four-eyes", "alice-or-bob"},
        "bob": {"open", "four-eyes", "alice-or-bob"},
        "carol": {"open", "four-eyes"},
        "tenant": {"open", "four-eyes"},  # its prefix holds them all
        "ops": set(),  # an operator may not resolve or reject at all
    }
    for name, names in expected.items():
        with client(stack, name) as who:
            assert set(mine(who, run)) == {run + n for n in names}, name
            # Without `mine`, search shows everything matching, settled ones too.
            assert len(list(who.search_all(f"{run}*"))) == len(made) + 1

    # Prefix scoping: outside its prefixes, nothing is the tenant's to settle.
    other = f"other-{uuid.uuid4().hex[:6]}-"
    with client(stack, "alice") as alice, client(stack, "tenant") as tenant:
        alice.create(other + "open", ttl=timedelta(hours=1))
        assert mine(alice, other) == [other + "open"]
        assert mine(tenant, other) == []


def test_paging_over_the_filtered_rows_loses_and_repeats_nothing(
    stack: tuple[ServerProcess, Path],
) -> None:
    run = f"page-{uuid.uuid4().hex[:6]}-"
    with client(stack, "requester") as requester, client(stack, "bob") as bob:
        ids = [f"{run}{i:02d}" for i in range(11)]
        for i, pid in enumerate(ids):
            # Every third is bob's; the others are alice's alone.
            who = ["bob"] if i % 3 == 0 else ["alice"]
            requester.create(pid, ttl=timedelta(hours=1), approvers=Approvers(principals=who))
        bobs = [pid for i, pid in enumerate(ids) if i % 3 == 0]
        for size in (1, 2, 5, 100):
            assert mine(bob, run, page_size=size) == bobs, size
        # A page can hold fewer than its size, even none, and still go on:
        # rows 0-1 hold bob's 0, rows 2-3 his 3, rows 4-5 none of his.
        pages, token = [], None
        for _ in range(3):
            page = bob.search(f"{run}*", mine=True, page_size=2, page_token=token)
            pages.append([p.id for p in page.promises])
            token = page.next_page_token
            assert token is not None
        assert pages == [[ids[0]], [ids[3]], []]


def vote(ctx: Context) -> Generator[Any, Any, list[str]]:
    policy = Approvers(principals=["alice", "bob", "carol"], not_requester=True, distinct=True)
    votes = []
    for _ in range(3):
        votes.append((yield ctx.promise(approvers=policy, title="vote")))
    quorum = yield ctx.at_least(2, votes, distinct=True, decisions=True)
    return [d.settled_by for d in quorum]


def test_a_distinct_quorum_leaves_the_inbox_of_who_already_voted(
    stack: tuple[ServerProcess, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    server, workdir = stack
    wid = f"vote-{uuid.uuid4().hex[:6]}"
    steps = [f"{wid}.{i}" for i in range(3)]
    with (
        client(stack, "inbox-worker") as worker_client,
        client(stack, "requester") as requester,
        client(stack, "bob") as bob,
    ):
        worker = Worker(worker_client, group=GROUP, lease=timedelta(seconds=5))
        worker.workflow(vote)
        worker.start()
        try:
            handle = requester.start("vote", id=wid, group=GROUP)
            eventually(lambda: mine(bob, f"{wid}.") == steps, what="bob's three votes in his inbox")
            assert mine(requester, f"{wid}.") == []  # four-eyes: it started the workflow
            bob.resolve(steps[0], "yes")
            assert mine(bob, f"{wid}.") == []  # he voted: the quorum's other steps are not his
            # The CLI, as an approver runs it with the token file.
            for name, expected in (("carol", steps[1:]), ("bob", [])):
                capsys.readouterr()
                argv = ["--server", server.address, "--token-file", str(workdir / f"{name}.token")]
                code = main([*argv, "--json", "approvals", "list", "--mine"])
                out, err = capsys.readouterr()
                assert code == 0, err
                listed = [json.loads(line)["id"] for line in out.splitlines()]
                assert [i for i in listed if i.startswith(wid)] == expected, (name, out, err)
            with client(stack, "carol") as carol:
                carol.resolve(steps[2], "fine")
            assert handle.result(timeout=30) == ["bob", "carol"]
        finally:
            worker.stop()
        assert requester.get(steps[1]).state is PromiseState.REJECTED_CANCELED
    # The text listing says when nothing is yours.
    capsys.readouterr()
    argv = ["--server", server.address, "--token-file", str(workdir / "ops.token")]
    assert main([*argv, "approvals", "list", "--mine"]) == 0
    assert capsys.readouterr().err == "nothing waits for you\n"
