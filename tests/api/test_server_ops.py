"""The server as an operator runs it: flags and TROTH_* variables, logs, signals, shutdown."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from _support import error_info, start_server

from troth.v1 import promises_pb2 as pb
from troth.v1 import promises_pb2_grpc


def log_records(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def wait_for(predicate: object, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_logs_signals_and_graceful_shutdown(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    with server.channel() as channel:
        stub = promises_pb2_grpc.PromiseServiceStub(channel)
        stub.CreatePromise(pb.CreatePromiseRequest(id="ops-1"))
        stub.ResolvePromise(
            pb.ResolvePromiseRequest(id="ops-1"), metadata=[("troth-principal", "alice")]
        )
        with pytest.raises(grpc.RpcError):
            stub.RejectPromise(pb.RejectPromiseRequest(id="ops-1"))
        with pytest.raises(grpc.RpcError) as caught:
            stub.ResolvePromise(
                pb.ResolvePromiseRequest(id="ops-1"), metadata=[("troth-principal", "troth:x")]
            )
        assert error_info(caught.value).metadata["field"] == "troth-principal"

    server.proc.send_signal(signal.SIGUSR1)
    wait_for(lambda: any(r["event"] == "stats" for r in log_records(server.log())))
    assert server.stop() == 0
    records = log_records(server.log())

    rpcs = [r for r in records if r["event"] == "rpc"]
    assert [(r["method"], r["code"]) for r in rpcs if r.get("promise_id") == "ops-1"] == [
        ("CreatePromise", "OK"),
        ("ResolvePromise", "OK"),
        ("RejectPromise", "FAILED_PRECONDITION"),
        ("ResolvePromise", "INVALID_ARGUMENT"),
    ]
    assert all("duration_ms" in r for r in rpcs)
    changes = [r for r in records if r["event"] == "promise.state_changed"]
    assert [(c["promise_id"], c["old_state"], c["new_state"], c["principal"]) for c in changes] == [
        ("ops-1", None, "PENDING", None),
        ("ops-1", "PENDING", "RESOLVED", "alice"),
    ]
    stats = [r for r in records if r["event"] == "stats"]
    assert stats[-1]["commits"] >= 1 and stats[-1]["requests"] >= 3
    events = [r["event"] for r in records]
    assert events.index("server.stopping") < events.index("server.stopped")


def test_environment_variables_and_flags(tmp_path: Path) -> None:
    server = start_server(
        tmp_path, "--max-tags", "2", env={"TROTH_DEFAULT_TTL": "1h", "TROTH_MAX_TAGS": "9"}
    )
    try:
        with server.channel() as channel:
            stub = promises_pb2_grpc.PromiseServiceStub(channel)
            p = stub.CreatePromise(pb.CreatePromiseRequest(id="env-1")).promise
            assert p.expire_time.ToMilliseconds() - p.create_time.ToMilliseconds() == 3_600_000
            with pytest.raises(grpc.RpcError) as caught:  # the flag (2) wins over the variable (9)
                stub.CreatePromise(
                    pb.CreatePromiseRequest(id="env-2", tags={"a": "1", "b": "2", "c": "3"})
                )
            assert error_info(caught.value).metadata["field"] == "tags"
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--default-ttl", "soon"], "--default-ttl: 'soon' is not a duration"),
        (["--max-page-size", "0"], "max-page-size must be positive"),
        (["--sqlite-synchronous", "SOMETIMES"], "sqlite synchronous must be one of"),
        (["--db", "sqlite:///:memory:"], "in-memory SQLite database would lose"),
        (["--db", "mysql://x/y"], "unsupported database URL"),
        (["--grpc-mode", "thread"], "thread mode was removed"),
    ],
)
def test_bad_configuration_is_refused_with_a_clear_message(
    tmp_path: Path, args: list[str], message: str
) -> None:
    command = [
        sys.executable,
        "-m",
        "troth_server",
        "serve",
        "--no-auth",
        "--listen",
        "127.0.0.1:0",
    ]
    if "--db" not in args:
        command += ["--db", f"sqlite:///{tmp_path / 'x.db'}"]
    done = subprocess.run(command + args, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_an_address_in_use_is_refused(tmp_path: Path) -> None:
    first = start_server(tmp_path / "a")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "troth_server", "serve", "--no-auth", "--listen", first.address,
             "--db", f"sqlite:///{tmp_path / 'b.db'}"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 1
        assert f"cannot listen on {first.address}" in done.stderr
    finally:
        first.stop()
