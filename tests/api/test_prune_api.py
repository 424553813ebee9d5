"""Retention against a real server on both stores: the sweeper's `--retention`, the
`PrunePromises` RPC and `troth promises prune`.

The pruning servers keep settled promises 2 s (`--retention 2s`); the other
one keeps them forever (`--retention 0`), so the RPC is what prunes there.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import grpc
import pytest
from _pg import fresh_schema
from _support import ServerProcess, error_info, start_server
from google.protobuf.duration_pb2 import Duration

from troth import Client, NotFoundError
from troth._cli import main
from troth.v1 import promises_pb2, promises_pb2_grpc


def _server(tmp: Path, backend: str, *flags: str) -> Iterator[ServerProcess]:
    with ExitStack() as stack:
        db_url = stack.enter_context(fresh_schema()) if backend == "postgres" else None
        proc = start_server(tmp, "--sweep-interval", "100ms", *flags, db_url=db_url)
        yield proc
        assert proc.stop() == 0, proc.log()[-3000:]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def keeping(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServerProcess]:
    """A server that keeps everything (`--retention 0`)."""
    yield from _server(tmp_path_factory.mktemp("keep"), request.param, "--retention", "0")


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def pruning(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServerProcess]:
    yield from _server(tmp_path_factory.mktemp("prune"), request.param, "--retention", "2s")


def _gone(client: Client, promise_id: str) -> bool:
    try:
        client.get(promise_id)
    except NotFoundError:
        return True
    return False


def test_the_sweeper_prunes_settled_promises_after_the_retention(pruning: ServerProcess) -> None:
    with Client(pruning.address) as client:
        key = uuid.uuid4().hex[:8]
        client.create(f"done-{key}", {"n": 1})
        client.resolve(f"done-{key}", {"ok": True})
        client.create(f"open-{key}", {"n": 2})
        deadline = time.monotonic() + 20
        while not _gone(client, f"done-{key}"):
            assert time.monotonic() < deadline, "the settled promise was never pruned"
            time.sleep(0.1)
        assert client.get(f"open-{key}").state.value == "PENDING"  # pending ones stay
        # A create of a pruned id creates a new promise: idempotency ends with the record.
        again = client.create(f"done-{key}", {"n": 1})
        assert again.created and again.promise.state.value == "PENDING"


def test_prune_promises_counts_then_deletes(keeping: ServerProcess) -> None:
    with Client(keeping.address) as client, grpc.insecure_channel(keeping.address) as channel:
        stub = promises_pb2_grpc.PromiseServiceStub(channel)
        key = uuid.uuid4().hex[:8]
        for n in range(3):
            client.create(f"{key}-{n}")
            client.resolve(f"{key}-{n}")
        time.sleep(0.05)  # settled strictly before the prune's cutoff
        dry = stub.PrunePromises(
            promises_pb2.PrunePromisesRequest(older_than=Duration(), dry_run=True)
        )
        assert dry.dry_run and dry.standalone >= 3 and dry.pruned == dry.standalone
        assert not _gone(client, f"{key}-0")
        # Settled less than an hour ago: nothing is that old.
        young = stub.PrunePromises(
            promises_pb2.PrunePromisesRequest(older_than=Duration(seconds=3600))
        )
        assert young.pruned == 0
        done = stub.PrunePromises(promises_pb2.PrunePromisesRequest(older_than=Duration()))
        assert done.pruned >= 3 and not done.dry_run
        assert all(_gone(client, f"{key}-{n}") for n in range(3))


@pytest.mark.parametrize(
    ("request_", "why"),
    [
        (promises_pb2.PrunePromisesRequest(), "is required"),
        (promises_pb2.PrunePromisesRequest(older_than=Duration(seconds=-1)), "0 or more"),
    ],
)
def test_prune_promises_refuses_a_missing_or_negative_age(
    keeping: ServerProcess, request_: promises_pb2.PrunePromisesRequest, why: str
) -> None:
    with grpc.insecure_channel(keeping.address) as channel, pytest.raises(grpc.RpcError) as caught:
        promises_pb2_grpc.PromiseServiceStub(channel).PrunePromises(request_)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info(caught.value)
    assert info.metadata["field"] == "older_than" and why in (caught.value.details() or "")


def test_the_cli_prunes_and_says_what_it_did(
    keeping: ServerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    with Client(keeping.address) as client:
        key = uuid.uuid4().hex[:8]
        client.create(f"cli-{key}")
        client.cancel(f"cli-{key}")
    time.sleep(1.1)  # time must pass (on purpose): older than --older-than 1s
    capsys.readouterr()
    argv = ["--server", keeping.address, "promises", "prune", "--older-than", "1s"]
    assert main([*argv, "--dry-run"]) == 0
    assert "would prune" in capsys.readouterr().out
    assert main(["--json", *argv]) == 0
    counts = json.loads(capsys.readouterr().out)
    assert counts["pruned"] >= 1 and counts["dry_run"] is False
