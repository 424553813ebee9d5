"""`troth export` and `troth replay` of a workflow whose steps have explicit ids: export
finds them by record (`parent_id`), not by the `<root>.*` prefix they do not have, and
replay counts them (before: "0 steps replayed", and an ended run looked changed)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from _support import ServerProcess, settled, start_server, troth_cli
from _workers import WorkerFleet

from troth import Client

FIXTURES = Path(__file__).parent.parent / "fixtures" / "replay"
REVIEW = FIXTURES / "review_named.py"


@pytest.fixture(scope="module")
def reviewed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    """review-1 ran to the end; review-2 waits on its approval."""
    tmp = tmp_path_factory.mktemp("named")
    server = start_server(tmp / "server")
    fleet = WorkerFleet(tmp, str(REVIEW), server.address)
    try:
        fleet.start(env={"TROTH_SERVER": server.address})
        with Client(server.address) as client:
            done = client.start("review", "doc-1", id="review-1", group="review")
            parked = client.start("review", "doc-2", id="review-2", group="review")
            for doc in ("doc-1", "doc-2"):
                fleet.eventually(
                    lambda doc=doc: settled(client, f"notify-{doc}"), 30, f"{doc} notified"
                )
            client.resolve("approve-doc-1", {"ok": True})
            assert done.result(timeout=30) == {"doc": "doc-1", "decision": {"ok": True}}
            assert not parked.get().is_settled
        out = tmp / "histories"
        result = troth(server, "export", "review-1", "review-2", "-o", f"{out}/")
        assert result.returncode == 0, result.stderr
        yield server, out
    finally:
        fleet.stop_all()
        server.stop()


def troth(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return troth_cli(server.address, *args, cwd=FIXTURES)


def test_export_finds_named_steps_by_record(reviewed: tuple[ServerProcess, Path]) -> None:
    _, out = reviewed
    data = json.loads((out / "review-1.json").read_text())
    steps = {item["id"]: item for item in data["promises"]}
    assert set(steps) == {"approve-doc-1", "notify-doc-1"}
    assert {item["parent_id"] for item in steps.values()} == {"review-1"}


def test_replay_counts_named_steps(reviewed: tuple[ServerProcess, Path]) -> None:
    server, out = reviewed
    for source in ([str(out)], ["--id", "review-1", "review-2"]):
        result = troth(server, "replay", "--workflows", str(REVIEW), *source)
        assert result.returncode == 0, result.stdout + result.stderr
        lines = result.stdout.splitlines()
        assert "history review-1 (review): OK, 2 steps replayed; the workflow returns" in lines
        assert (
            "history review-2 (review): OK, 2 steps replayed; it waits on approve-doc-2"
        ) in lines
