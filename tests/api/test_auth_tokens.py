"""Token-file authentication on a real server: who settles, SIGHUP reload, refusals to
start, the warning without auth, and no token or secret in any log line or message."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from _auth import Grant, bearer, code_and_reason, write_token_file
from _support import eventually, reaped, spawn, start_server, wait_serving

from troth.v1 import promises_pb2, promises_pb2_grpc
from troth_server.auth import mint

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from _support import ServerProcess

SEEN_MESSAGES: list[str] = []
"""Every error message the server sent in this module, for the secret grep."""


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("auth-tokens")
    path = workdir / "tokens.toml"
    grants = [
        Grant("gateway-1", ("gateway",)),
        Grant("operator-1", ("operator",)),
        Grant("worker-1", ("worker",), ("billing",)),
    ]
    tokens = write_token_file(path, grants)
    server = start_server(workdir, "--auth-tokens", str(path))
    try:
        with server.channel() as channel:
            yield {"server": server, "channel": channel, "tokens": tokens, "path": path}
    finally:
        assert server.stop() == 0, server.log()[-3000:]


def _call(fn: Any) -> tuple[grpc.StatusCode, str]:
    try:
        fn()
    except grpc.RpcError as error:
        SEEN_MESSAGES.append(error.details() or "")  # type: ignore[attr-defined]
    return code_and_reason(fn)


def test_troth_principal_is_ignored_with_auth_on(setup: dict[str, Any]) -> None:
    stub = promises_pb2_grpc.PromiseServiceStub(setup["channel"])
    metadata = (*bearer(setup["tokens"]["gateway-1"]), ("troth-principal", "mallory"))
    stub.CreatePromise(promises_pb2.CreatePromiseRequest(id="who-1"), metadata=metadata, timeout=10)
    settled = stub.ResolvePromise(
        promises_pb2.ResolvePromiseRequest(id="who-1"), metadata=metadata, timeout=10
    )
    assert settled.promise.settled_by == "gateway-1"
    got = stub.GetPromise(promises_pb2.GetPromiseRequest(id="who-1"), metadata=metadata, timeout=10)
    assert got.promise.settled_by == "gateway-1"


def test_a_call_without_a_token_is_told_how_to_send_one(setup: dict[str, Any]) -> None:
    # Issue 28: the refusal spoke of gRPC metadata only; it names what to do from the
    # CLI, a worker and Python first, and the metadata for grpcurl users.
    stub = promises_pb2_grpc.PromiseServiceStub(setup["channel"])
    with pytest.raises(grpc.RpcError) as refused:
        stub.GetPromise(promises_pb2.GetPromiseRequest(id="who-1"), timeout=10)
    assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
    message = refused.value.details()  # type: ignore[attr-defined]
    SEEN_MESSAGES.append(message)
    for what_to_do in ("--token-file PATH", "TROTH_TOKEN_FILE", "Client(token=",
                       "authorization: Bearer <token>"):  # fmt: skip
        assert what_to_do in message, message


def test_a_repeated_token_is_answered_from_the_cache(setup: dict[str, Any]) -> None:
    stub = promises_pb2_grpc.PromiseServiceStub(setup["channel"])
    metadata = bearer(setup["tokens"]["operator-1"])
    stub.SearchPromises(promises_pb2.SearchPromisesRequest(id="*"), metadata=metadata, timeout=10)
    started = time.perf_counter()
    for _ in range(20):
        stub.SearchPromises(
            promises_pb2.SearchPromisesRequest(id="none-*"), metadata=metadata, timeout=10
        )
    # 20 scrypt checks (16 MiB, tens of ms each) would take far longer.
    assert time.perf_counter() - started < 2.0


def test_sighup_reload_adds_and_revokes_tokens(setup: dict[str, Any]) -> None:
    server: ServerProcess = setup["server"]
    path: Path = setup["path"]
    stub = promises_pb2_grpc.PromiseServiceStub(setup["channel"])
    old = setup["tokens"]["operator-1"]

    def search(token: str) -> tuple[grpc.StatusCode, str]:
        return _call(
            lambda: stub.SearchPromises(
                promises_pb2.SearchPromisesRequest(id="*"), metadata=bearer(token), timeout=10
            )
        )

    assert search(old)[0] == grpc.StatusCode.OK
    kept = path.read_text()
    new = mint("operator-2", ["operator"])
    # operator-1 revoked (its entry removed), operator-2 added.
    entries = [e for e in kept.split("\n[[principal]]") if "operator-1" not in e]
    path.write_text("\n[[principal]]".join(entries) + "\n" + new.entry)
    server.proc.send_signal(signal.SIGHUP)
    eventually(lambda: search(new.token)[0] == grpc.StatusCode.OK, what="the new token works")
    assert search(old) == (grpc.StatusCode.UNAUTHENTICATED, "TOKEN_UNKNOWN")

    # A file that does not parse keeps the old table, and the error is logged.
    path.write_text("[[principal]\nname = ")
    server.proc.send_signal(signal.SIGHUP)
    eventually(lambda: "auth.reload_failed" in server.log(), what="the reload error")
    assert search(new.token)[0] == grpc.StatusCode.OK
    path.write_text(kept)


def test_no_authentication_configured_refuses_to_start(tmp_path: Path) -> None:
    done = _serve(tmp_path, "--listen", "127.0.0.1:0")
    assert done.returncode == 2
    assert "authentication is not configured" in done.stderr
    for flag in ("--auth-tokens FILE", "--jwt-key-file", "--jwt-jwks-file", "--no-auth"):
        assert flag in done.stderr


def test_no_auth_on_a_public_address_refuses_to_start(tmp_path: Path) -> None:
    done = _serve(tmp_path, "--no-auth", "--listen", "0.0.0.0:0")
    assert done.returncode == 2
    assert "not a loopback address" in done.stderr
    assert "--allow-public-without-auth" in done.stderr


def test_a_bad_token_file_refuses_to_start_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text('[[principal]]\nname = "x"\nroles = ["wizard"]\n')
    done = _serve(tmp_path, "--listen", "127.0.0.1:0", "--auth-tokens", str(path))
    assert done.returncode == 1
    assert str(path) in done.stderr
    assert "unknown role 'wizard'" in done.stderr


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "troth_server", "serve", "--db", f"sqlite:///{tmp_path}/x.db",
         *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_every_start_without_auth_warns_first(tmp_path: Path) -> None:
    server = start_server(tmp_path / "local", "--no-auth")
    try:
        first = server.log().splitlines()[0]
        assert "authentication is off" in first
    finally:
        server.stop()


def test_the_loud_flag_serves_a_public_address_without_auth_and_says_so(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        proc = spawn(
            [sys.executable, "-m", "troth_server", "serve", "--no-auth",
             "--allow-public-without-auth", "--listen", "0.0.0.0:0",
             "--db", f"sqlite:///{tmp_path}/x.db", "--port-file", str(port_file)],
            stdout=log, stderr=log, env=dict(os.environ),
        )  # fmt: skip
    with reaped(proc):
        eventually(lambda: port_file.exists() or proc.poll() is not None, timeout=30)
        assert proc.poll() is None, log_path.read_text()
        wait_serving(f"127.0.0.1:{port_file.read_text()}", 30)
        first = log_path.read_text().splitlines()[0]
        assert "authentication is off on 0.0.0.0:0, a PUBLIC address" in first


def test_no_token_or_secret_in_any_log_line_or_message(setup: dict[str, Any]) -> None:
    """Last in the module: after every refusal above, and a few more."""
    server: ServerProcess = setup["server"]
    stub = promises_pb2_grpc.PromiseServiceStub(setup["channel"])
    tokens: dict[str, str] = setup["tokens"]
    key_id = tokens["gateway-1"].split("_")[1]
    forged = f"troth_{key_id}_forgedsecretforgedsecret"
    attempts = [
        forged,
        "troth_0123456789abcdef_unknownsecretunknown",
        "not-a-token-at-all-secretish",
        "aaaa.bbbb.cccc",
    ]
    before = server.log().count("auth.refused")
    for token in attempts:
        _call(
            lambda token=token: stub.GetPromise(
                promises_pb2.GetPromiseRequest(id="x"), metadata=bearer(token), timeout=10
            )
        )
    # A worker refused for its role, and for a group.
    _call(
        lambda: stub.CancelPromise(
            promises_pb2.CancelPromiseRequest(id="x"),
            metadata=bearer(tokens["worker-1"]),
            timeout=10,
        )
    )
    secrets = [*tokens.values(), *(t.split("_", 2)[2] for t in tokens.values()), *attempts]
    # The server writes its log out every 0.2 s: wait for the refusals to be in it.
    eventually(
        lambda: server.log().count("auth.refused") >= before + len(attempts), what="refusals"
    )
    log = server.log()
    for secret in secrets:
        assert secret not in log
        for message in SEEN_MESSAGES:
            assert secret not in message
    assert SEEN_MESSAGES
