"""A long-lived `Client` renews its token without restarting (issue 26 item 2), against
a real server (token file and HS256 JWTs, SQLite and PostgreSQL):

- with a token callable, across a rotation (the old token revoked from the token
  file, SIGHUP): its unary calls, its `Calls` stream, a wait and a watch go on, and
  what it settles after is settled by the new principal;
- with a callable whose token the server refuses as expired: the call is made again
  at once with the fresh JWT the callable gives then;
- with a token file the SDK re-reads, rewritten with a new token.

Each test rotates principals of its own, named after it, on the module's server.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc
import pytest
from _auth import bearer, code_and_reason, make_jwt, make_jwt_keys
from _pg import fresh_schema
from _support import eventually, start_server

from troth import Client
from troth._credentials import TOKEN_CHECK_S
from troth.errors import Reason, RpcError
from troth.v1 import promises_pb2, promises_pb2_grpc
from troth_server.auth import mint

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from _support import ServerProcess

    from troth import PromiseEvent

JWT_ISSUER = "https://idp.example.test"
JWT_CLAIMS = {"iss": JWT_ISSUER, "aud": "troth"}


@dataclass
class TokenFile:
    """The server's token file: entries added, re-minted and removed, each change
    reloaded (SIGHUP) and waited for."""

    server: ServerProcess
    path: Path
    entries: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def grant(self, name: str, *roles: str) -> str:
        """A new token for `name` (replacing any it had: the old one is revoked)."""
        with self.lock:
            minted = mint(name, list(roles))
            self.entries[name] = minted.entry
            self._reload()
            eventually(lambda: _works(self.server, minted.token), what=f"{name}'s token works")
            return minted.token

    def revoke(self, name: str, token: str) -> None:
        with self.lock:
            del self.entries[name]
            self._reload()
            eventually(lambda: not _works(self.server, token), what=f"{name}'s token refused")

    def _reload(self) -> None:
        staged = self.path.with_suffix(".new")
        staged.write_text("\n".join(self.entries.values()))
        os.replace(staged, self.path)
        self.server.proc.send_signal(signal.SIGHUP)


def _works(server: ServerProcess, token: str) -> bool:
    with server.channel() as channel:
        stub = promises_pb2_grpc.PromiseServiceStub(channel)
        code, _ = code_and_reason(
            lambda: stub.GetPromise(
                promises_pb2.GetPromiseRequest(id="no-such-promise"),
                metadata=bearer(token),
                timeout=10,
            )
        )
    return code is not grpc.StatusCode.UNAUTHENTICATED


@dataclass
class Setup:
    server: ServerProcess
    tokens: TokenFile
    hs_secret: bytes


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def setup(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Setup]:
    workdir = tmp_path_factory.mktemp("sdk-credentials")
    keys = make_jwt_keys(workdir / "keys")
    path = workdir / "tokens.toml"
    seed = mint("seed-operator", ["operator"])
    path.write_text(seed.entry)
    with ExitStack() as stack:
        db_url = stack.enter_context(fresh_schema()) if request.param == "postgres" else None
        server = start_server(
            workdir,
            "--auth-tokens", str(path),
            "--jwt-key-file", str(keys.hs_file),
            "--jwt-algorithms", "HS256",
            "--jwt-issuer", JWT_ISSUER,
            "--jwt-audience", "troth",
            db_url=db_url,
        )  # fmt: skip
        try:
            yield Setup(
                server, TokenFile(server, path, {"seed-operator": seed.entry}), keys.hs_secret
            )
        finally:
            assert server.stop() == 0, server.log()[-3000:]


def _names(tag: str) -> tuple[str, str]:
    run = uuid.uuid4().hex[:6]
    return f"{tag}-old-{run}", f"{tag}-new-{run}"


def _settled_by(client: Client, promise_id: str) -> str:
    client.create(promise_id)
    return client.resolve(promise_id, {"ok": True}).promise.settled_by


class Events:
    """A `watch_promises` stream read on a thread of its own."""

    def __init__(self, client: Client, glob: str) -> None:
        self.stream = client.watch_promises(glob)
        self.seen: list[PromiseEvent] = []
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for event in self.stream:
                self.seen.append(event)
        except BaseException as exc:  # (the test reports it)
            self.failure = exc

    def ids(self) -> set[str]:
        assert self.failure is None, self.failure
        return {event.promise.id for event in self.seen}

    def close(self) -> None:
        self.stream.close()
        self.thread.join(10)


@pytest.mark.parametrize("multiplex", [True, False], ids=["calls-stream", "unary"])
def test_a_client_with_a_token_callable_goes_on_across_a_rotation(
    setup: Setup, multiplex: bool
) -> None:
    old_name, new_name = _names("gw")
    tokens = setup.tokens
    old = tokens.grant(old_name, "gateway")
    current = [old]
    run = uuid.uuid4().hex[:6]
    with Client(
        setup.server.address, token=lambda: current[0], multiplex_calls=multiplex
    ) as client:
        assert _settled_by(client, f"rot-{run}-1") == old_name
        waited = f"rot-{run}-waited"
        client.create(waited)
        events = Events(client, f"rot-{run}-*")
        try:
            # The rotation: a new token (another principal, to tell them apart) is
            # given to the callable, then the old one is revoked on the server.
            current[0] = tokens.grant(new_name, "gateway")
            renewed_at = time.monotonic()
            tokens.revoke(old_name, old)
            time.sleep(max(0.0, renewed_at + TOKEN_CHECK_S - time.monotonic()))
            assert _settled_by(client, f"rot-{run}-2") == new_name
            assert client.get(f"rot-{run}-1").settled_by == old_name
            settler = threading.Timer(0.5, lambda: client.resolve(waited, "late"))
            settler.start()
            assert client.wait(waited, timeout=30).settled_by == new_name
            settler.join()
            # The watch goes on: opened with the old token, it sees what happens after.
            # (A server that ends it as the token is revoked has it reopened with the
            # new one; events in between are missed, so keep making them.)
            made = iter(range(1, 1000))

            def seen_after() -> bool:
                client.create(f"rot-{run}-after-{next(made)}")
                return any(i.startswith(f"rot-{run}-after-") for i in events.ids())

            eventually(seen_after, what="an event after the rotation")
        finally:
            events.close()


@pytest.mark.parametrize("multiplex", [True, False], ids=["calls-stream", "unary"])
def test_a_jwt_refused_as_expired_is_renewed_by_the_callable(setup: Setup, multiplex: bool) -> None:
    """The process slept past its JWT's `exp` (and the server's leeway): the first call
    is refused TOKEN_EXPIRED, the callable asked again gives a fresh JWT, and the call
    is made again with it."""
    sub = f"jwt-gw-{uuid.uuid4().hex[:6]}"

    def jwt(ttl: float) -> str:
        return make_jwt(setup.hs_secret, "HS256", sub, ["gateway"], ttl=ttl, **JWT_CLAIMS)

    expired = jwt(-120)
    assert code_and_reason(lambda: _raw_get(setup.server, expired)) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "TOKEN_EXPIRED",
    )
    fresh = jwt(300)
    asked: list[str] = []

    def supplier() -> str:  # as if renewed while the process slept
        asked.append(expired if not asked else fresh)
        return asked[-1]

    with Client(setup.server.address, token=supplier, multiplex_calls=multiplex) as client:
        assert asked == [expired]
        promise_id = f"jwt-{uuid.uuid4().hex[:6]}"
        assert _settled_by(client, promise_id) == sub
        assert asked[:2] == [expired, fresh]  # asked again at the refusal


def test_a_token_file_is_re_read_when_it_changes(setup: Setup, tmp_path: Path) -> None:
    old_name, new_name = _names("file-gw")
    tokens = setup.tokens
    old = tokens.grant(old_name, "gateway")
    path = tmp_path / "token"
    path.write_text(old + "\n")
    run = uuid.uuid4().hex[:6]
    with Client(setup.server.address, token_file=path) as client:
        assert _settled_by(client, f"file-{run}-1") == old_name
        staged = tmp_path / "token.new"
        staged.write_text(tokens.grant(new_name, "gateway") + "\n")
        os.replace(staged, path)
        tokens.revoke(old_name, old)
        made = iter(range(2, 1000))
        eventually(
            lambda: _settled_by(client, f"file-{run}-{next(made)}") == new_name,
            timeout=10,
            what="a settle by the file's new token",
        )


def _raw_get(server: ServerProcess, token: str) -> object:
    with server.channel() as channel:
        return promises_pb2_grpc.PromiseServiceStub(channel).GetPromise(
            promises_pb2.GetPromiseRequest(id="no-such-promise"), metadata=bearer(token), timeout=10
        )


@pytest.mark.parametrize("multiplex", [True, False], ids=["calls-stream", "unary"])
def test_a_call_cut_off_by_its_revoked_token_says_why(setup: Setup, multiplex: bool) -> None:
    """A wait in flight when its token is revoked ends with the server's reason
    (TOKEN_UNKNOWN), whether it was sent on the `Calls` stream (which the server ends
    for that reason) or alone: the stream's end carries the reason to every call on it."""
    name, _ = _names("cut")
    token = setup.tokens.grant(name, "gateway")
    waited = f"cut-{uuid.uuid4().hex[:6]}"
    with Client(setup.server.address, token=token, multiplex_calls=multiplex) as client:
        client.create(waited)
        failures: list[BaseException] = []

        def wait() -> None:
            try:
                client.wait(waited, timeout=60)
            except BaseException as exc:  # (the test reads it)
                failures.append(exc)

        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        time.sleep(0.5)  # the wait is on its way (on the stream, when multiplexed)
        setup.tokens.revoke(name, token)
        waiter.join(30)
        assert not waiter.is_alive()
    [failure] = failures
    assert isinstance(failure, RpcError), repr(failure)
    assert (failure.code, failure.reason) == (
        grpc.StatusCode.UNAUTHENTICATED,
        Reason.TOKEN_UNKNOWN,
    ), repr(failure)
