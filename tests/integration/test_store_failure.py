"""The database's disk fills up: writes answer UNAVAILABLE, nothing acknowledged is lost,
and the server carries on by itself once there is room again."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from _support import error_info, start_server

from troth.v1 import promises_pb2 as pb
from troth.v1 import promises_pb2_grpc
from troth.v1 import types_pb2 as types


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs: small enough to fill, real enough for SQLite to hit ENOSPC."""
    mountpoint = tmp_path / "small"
    mountpoint.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mountpoint)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"needs permission to mount a tmpfs (run as root): {done.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def fill(directory: Path) -> Path:
    filler = directory / "filler"
    # Unbuffered: a buffered file would try its last block again on close, and raise.
    with filler.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
    return filler


def test_disk_full_answers_unavailable_and_recovers(small_disk: Path, tmp_path: Path) -> None:
    server = start_server(tmp_path / "logs", db_url=f"sqlite:///{small_disk / 'troth.db'}")
    try:
        with server.channel() as channel:
            stub = promises_pb2_grpc.PromiseServiceStub(channel)
            kept = f"kept-{uuid.uuid4().hex[:6]}"
            stub.CreatePromise(pb.CreatePromiseRequest(id=kept))
            stub.ResolvePromise(pb.ResolvePromiseRequest(id=kept, value=types.Payload(data=b"1")))

            filler = fill(small_disk)
            big = types.Payload(data=os.urandom(200_000))
            with pytest.raises(grpc.RpcError) as caught:
                for n in range(50):  # the WAL may still have room for a few
                    stub.CreatePromise(pb.CreatePromiseRequest(id=f"full-{n}", param=big))
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert error_info(caught.value).reason == "STORE_UNAVAILABLE"
            assert "retry later" in (caught.value.details() or "")

            got = stub.GetPromise(pb.GetPromiseRequest(id=kept)).promise
            assert got.state == types.PROMISE_STATE_RESOLVED and got.value.data == b"1"

            filler.unlink()
            after = stub.CreatePromise(pb.CreatePromiseRequest(id=f"after-{uuid.uuid4().hex[:6]}"))
            assert after.created
        assert server.proc.poll() is None, "the server died of a full disk"
    finally:
        server.stop()
