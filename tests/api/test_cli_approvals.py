"""`troth approvals ...` against a real server: the inbox as an operator uses it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from _support import ServerProcess, reaped, start_server
from _support import run_cli as troth

from troth import Client, PromiseState

KIND = {"troth:kind": "promise"}
TROTH = str(Path(sys.executable).parent / "troth")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the module: the CLI is a client, the same for every back end."""
    proc = start_server(tmp_path_factory.mktemp("cli-approvals"))
    yield proc
    assert proc.stop() == 0, proc.log()[-3000:]


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.address) as c:
        yield c


def group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


def approval(client: Client, group: str, name: str, **create: object) -> str:
    pid = f"{group}.{name}"
    client.create(pid, tags={**KIND, "troth:group": group, **create.pop("tags", {})}, **create)  # type: ignore[arg-type]
    return pid


def test_list_shows_what_waits_in_a_group(
    server: ServerProcess, client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    g = group()
    first = approval(
        client,
        g,
        "publish",
        ttl=timedelta(hours=3),
        title="Publish post 7?",
        requested_by="publish/post-7",
        tags={"post": "7"},
    )
    second = approval(client, g, "refund", ttl=timedelta(hours=1))
    never = approval(client, g, "forever", never_expires=True)
    approval(client, g, "done")
    client.resolve(f"{g}.done", True)  # settled: not waiting any more
    client.create(f"{g}.step", tags={"troth:kind": "note", "troth:group": g})  # not an approval
    approval(client, group(), "elsewhere")  # another group

    code, out, err = troth(server, capsys, "approvals", "list", "--group", g)
    assert (code, err) == (0, "")
    header, *rows = out.splitlines()
    assert header.split()[:4] == ["ID", "TITLE", "AGE", "DEADLINE"]
    assert [row.split()[0] for row in rows] == [first, second, never]
    assert "Publish post 7?" in rows[0] and "publish/post-7" in rows[0] and "post=7" in rows[0]
    assert "in 2h59m" in rows[0] or "in 3h" in rows[0]
    assert rows[2].split()[3] == "never"

    code, out, _ = troth(server, capsys, "approvals", "list", "--group", g, "--order", "deadline")
    assert [row.split()[0] for row in out.splitlines()[1:]] == [second, first, never]
    code, out, _ = troth(server, capsys, "approvals", "list", "--group", g, "--order", "newest")
    assert [row.split()[0] for row in out.splitlines()[1:]] == [never, second, first]
    code, out, _ = troth(server, capsys, "approvals", "list", "--group", g, "--tag", "post=7")
    assert [row.split()[0] for row in out.splitlines()[1:]] == [first]

    code, out, err = troth(server, capsys, "approvals", "list", "--group", g, "--limit", "1")
    assert len(out.splitlines()) == 2
    assert "showing the first 1; pass --limit 0 for all" in err

    code, out, err = troth(server, capsys, "--json", "approvals", "list", "--group", g)
    listed = [json.loads(line) for line in out.splitlines()]
    assert [p["id"] for p in listed] == [first, second, never]
    assert listed[0]["title"] == "Publish post 7?"
    assert listed[0]["requested_by"] == "publish/post-7"
    assert listed[0]["state"] == "PENDING"


def test_older_than_keeps_those_waiting_longer(
    server: ServerProcess, client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    g = group()
    pid = approval(client, g, "a")
    created = client.get(pid).create_time.timestamp()
    while time.time() < created + 0.05:  # until it is 50 ms old by this machine's clock
        time.sleep(0.01)
    code, out, _ = troth(server, capsys, "approvals", "list", "--group", g, "--older-than", "20ms")
    assert [row.split()[0] for row in out.splitlines()[1:]] == [pid]
    code, out, err = troth(server, capsys, "approvals", "list", "--group", g, "--older-than", "1h")
    assert (code, out, err) == (0, "", "nothing waits for a human\n")


def test_approve_and_reject(
    server: ServerProcess, client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    g = group()
    a, b, c, d = (approval(client, g, name) for name in "abcd")

    code, out, _ = troth(server, capsys, "--principal", "alice", "approvals", "approve", a)
    assert code == 0 and out.startswith(f"{a} is now RESOLVED")
    settled = client.get(a)
    assert (client.decode(settled.value), settled.settled_by) == (True, "alice")

    code, _, _ = troth(server, capsys, "approvals", "approve", b, "--value", '{"level": 2}')
    assert client.decode(client.get(b).value) == {"level": 2}

    code, out, _ = troth(server, capsys, "approvals", "reject", c, "--reason", "too late")
    assert code == 0 and out.startswith(f"{c} is now REJECTED")
    assert client.decode(client.get(c).value) == {"reason": "too late"}

    args = ("approvals", "reject", d, "--key", "op-1")
    assert troth(server, capsys, "--json", *args)[0] == 0
    assert client.get(d).state is PromiseState.REJECTED and client.get(d).value.is_empty
    code, out, _ = troth(server, capsys, "--json", *args)  # the same command again: a no-op
    assert code == 0 and json.loads(out)["applied"] is False

    # Someone else got there first, or nobody by that id: one line, exit 1.
    code, out, err = troth(server, capsys, "approvals", "reject", a, "--reason", "no")
    assert (code, out) == (1, "")
    assert err.startswith("troth: error: already settled:") and err.count("\n") == 1
    code, _, err = troth(server, capsys, "approvals", "approve", f"{g}.missing")
    assert code == 1 and err.startswith("troth: error: not found:")


def test_approve_says_when_the_default_value_does_not_fit(
    server: ServerProcess, client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    g = group()
    pid = approval(
        client,
        g,
        "typed",
        schema={"type": "object", "properties": {"level": {"type": "integer"}}},
    )
    code, _, err = troth(server, capsys, "approvals", "approve", pid)
    assert code == 1
    assert "the default value True does not fit this approval; pass --value JSON" in err
    assert "invalid argument 'value'" in err
    code, _, _ = troth(server, capsys, "approvals", "approve", pid, "--value", '{"level": 1}')
    assert code == 0


def test_watch_prints_events_as_they_happen(server: ServerProcess, client: Client) -> None:
    g = group()
    env = {**os.environ, "TROTH_SERVER": server.address, "PYTHONUNBUFFERED": "1"}
    command = [TROTH, "--json", "approvals", "watch", "--group", g]
    with reaped(
        subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
    ) as proc:
        assert proc.stderr is not None and proc.stdout is not None
        try:
            # Printed once the server has the watch in place.
            assert proc.stderr.readline().startswith("watching for approvals")
            pid = approval(client, g, "live", ttl=timedelta(milliseconds=300))
            approval(client, group(), "not-ours")
            other = approval(client, g, "other")
            client.resolve(other, {"ok": True})
            events = [json.loads(proc.stdout.readline()) for _ in range(4)]
        finally:
            proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 130
    seen = sorted((e["promise"]["id"], e["type"]) for e in events)
    assert seen == [
        (pid, "CREATED"),
        (pid, "TIMED_OUT"),
        (other, "CREATED"),
        (other, "SETTLED"),
    ]
    settled = next(e for e in events if e["type"] == "SETTLED")["promise"]
    assert (settled["state"], settled["value"]) == ("RESOLVED", {"ok": True})
