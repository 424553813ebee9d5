"""`troth export` and `troth replay` end to end: a real server, a real worker, the real CLI.

A worker process runs version 1 of the shop's workflows
(tests/fixtures/replay/shop_v1.py); one `publish` runs to the end, one stays
parked on its approval. `troth export` writes their histories, and `troth
replay` checks them against v1 (exit 0) and against shop_v2.py, whose
`publish` texts instead of emailing at step 1 (exit 1, naming the step and
both commands), from the files and straight from the server.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from _support import ServerProcess, settled, start_server, troth_cli
from _workers import WorkerFleet

from troth import Client
from troth.testing import Done, Suspend, load_histories, replay_file

FIXTURES = Path(__file__).parent.parent / "fixtures" / "replay"
V1 = FIXTURES / "shop_v1.py"


@dataclass
class Shop:
    server: ServerProcess
    exported: Path
    """The directory `troth export` wrote, one file per workflow."""


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shop]:
    """v1 ran: publish-done ended, publish-parked waits on its approval, ping-1 ended."""
    tmp = tmp_path_factory.mktemp("replay")
    server = start_server(tmp / "server")
    fleet = WorkerFleet(tmp, str(V1), server.address)
    try:
        fleet.start(env={"TROTH_SERVER": server.address})
        with Client(server.address) as client:
            done = client.start("publish", "post-1", id="publish-done", group="shop")
            parked = client.start("publish", "post-2", id="publish-parked", group="shop")
            ping = client.start("ping", "ada", id="ping-1", group="shop")
            assert ping.result(timeout=15) == "hello ada"
            # Each publish waits on its approval only after its email step ran.
            for root in ("publish-done", "publish-parked"):
                fleet.eventually(
                    lambda root=root: settled(client, f"{root}.1"), 15, f"{root} to email"
                )
            client.resolve("publish-done.0", {"approved": True})
            assert done.result(timeout=15) == {"post": "post-1", "decision": {"approved": True}}
            assert not parked.get().is_settled
        exported = tmp / "histories"
        result = troth(server, "export", "--search", "*", "-o", f"{exported}/")
        assert result.returncode == 0, result.stderr
        assert "exported 3 workflows" in result.stderr
        yield Shop(server, exported)
    finally:
        fleet.stop_all()
        server.stop()


def troth(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return troth_cli(server.address, *args, cwd=FIXTURES)


def test_export_writes_one_history_per_workflow(shop: Shop) -> None:
    files = sorted(path.name for path in shop.exported.iterdir())
    assert files == ["ping-1.json", "publish-done.json", "publish-parked.json"]
    data = json.loads((shop.exported / "publish-parked.json").read_text())
    assert data["format"] == "troth.history/1"
    assert (data["workflow"], data["root_id"], data["args"]) == (
        "publish",
        "publish-parked",
        ["post-2"],
    )
    assert data["root"]["state"] == "PENDING"
    steps = {item["id"]: item for item in data["promises"]}
    assert steps["publish-parked.0"]["state"] == "PENDING"
    assert steps["publish-parked.1"]["value"] == "emailed about post-2"
    assert steps["publish-parked.1"]["tags"]["troth:func"] == "send_email"


def test_replay_of_the_same_code_exits_0(shop: Shop) -> None:
    result = troth(shop.server, "replay", "--workflows", str(V1), str(shop.exported))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "history publish-done (publish): OK, 3 steps replayed; the workflow returns" in lines
    assert (
        "history publish-parked (publish): OK, 2 steps replayed; it waits on publish-parked.0"
    ) in lines
    assert "history ping-1 (ping): OK, 1 step replayed; the workflow returns" in lines
    assert lines[-1] == "3 histories checked: 3 OK, 0 diverged"


def test_replay_of_a_changed_workflow_exits_1_naming_the_step_and_both_commands(
    shop: Shop,
) -> None:
    # v2 as a module name found through --path, as a project's package would be.
    result = troth(
        shop.server, "replay", "--path", str(FIXTURES), "--workflows", "shop_v2",
        str(shop.exported),
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for root in ("publish-done", "publish-parked"):
        assert (
            f"history {root} (publish): step 1 diverges: recorded run(send_email) "
            f"(id {root}.1), the code now yields run(send_sms)"
        ) in lines
    assert "history ping-1 (ping): OK, 1 step replayed; the workflow returns" in lines
    assert lines[-1] == "3 histories checked: 1 OK, 2 diverged"


def test_replay_straight_from_the_server(shop: Shop) -> None:
    changed = troth(
        shop.server, "--json", "replay", "--workflows", str(FIXTURES / "shop_v2.py"),
        "--id", "publish-parked",
    )  # fmt: skip
    assert changed.returncode == 1, changed.stdout + changed.stderr
    (record,) = [json.loads(line) for line in changed.stdout.splitlines()]
    assert record["ok"] is False
    assert record["source"] == "server"
    assert record["divergence"] == {
        "position": 1,
        "step_id": "publish-parked.1",
        "recorded": "run(send_email)",
        "yielded": "run(send_sms)",
    }

    # The in-flight ones: what a deploy must not break.
    same = troth(
        shop.server, "replay", "--workflows", str(V1), "--search", "*", "--state", "PENDING",
    )  # fmt: skip
    assert same.returncode == 0, same.stdout + same.stderr
    assert "history publish-parked (publish): OK" in same.stdout
    assert "1 history checked: 1 OK, 0 diverged" in same.stdout


def test_replay_of_an_unknown_id_exits_2(shop: Shop) -> None:
    result = troth(shop.server, "replay", "--workflows", str(V1), "--id", "no-such-workflow")
    assert result.returncode == 2
    assert "cannot read the histories from the server" in result.stderr
    assert "no-such-workflow" in result.stderr


def test_exported_file_replays_with_the_testing_api(shop: Shop, tmp_path: Path) -> None:
    path = tmp_path / "all.json"
    result = troth(shop.server, "export", "publish-done", "publish-parked", "-o", str(path))
    assert result.returncode == 0, result.stderr
    assert [h.root_id for h in load_histories(path)] == ["publish-done", "publish-parked"]

    sys.path.insert(0, str(FIXTURES))
    try:
        import shop_v1  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(FIXTURES))
    assert replay_file(path, shop_v1.worker) == [
        Done({"post": "post-1", "decision": {"approved": True}}),
        Suspend(("publish-parked.0",)),
    ]


def test_replay_of_changed_step_arguments_exits_1_naming_both_digests(shop: Shop) -> None:
    # shop_v3's `ping` runs the same function at step 0 with other arguments.
    data = json.loads((shop.exported / "ping-1.json").read_text())
    (step,) = data["promises"]
    recorded = step["tags"]["troth:args"]
    result = troth(
        shop.server, "replay", "--workflows", str(FIXTURES / "shop_v3.py"), str(shop.exported),
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    (ping,) = [line for line in lines if line.startswith("history ping-1 ")]
    assert ping.startswith(
        f"history ping-1 (ping): step 0 diverges: recorded run(greet) with arguments digest "
        f"{recorded} (id ping-1.0), the code now yields run(greet) with arguments "
        "('dear ada',), digest "
    ), ping
    assert "history publish-done (publish): OK" in result.stdout
    assert lines[-1] == "3 histories checked: 2 OK, 1 diverged"

    from_server = troth(
        shop.server, "--json", "replay", "--workflows", str(FIXTURES / "shop_v3.py"),
        "--id", "ping-1",
    )  # fmt: skip
    assert from_server.returncode == 1, from_server.stdout + from_server.stderr
    (record,) = [json.loads(line) for line in from_server.stdout.splitlines()]
    assert record["divergence"]["position"] == 0
    assert record["divergence"]["recorded"] == f"run(greet) with arguments digest {recorded}"
    assert record["divergence"]["yielded"].startswith("run(greet) with arguments ('dear ada',)")
