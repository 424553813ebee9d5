"""Credentials that live and die, on every road (DESIGN §4 rule 15, §7; issue 26).

A credential is checked per call, not per connection: a token removed from the
token file (then SIGHUP), a grant narrowed from one task group to another, or a
JWT past its `exp` (plus the leeway) stops working on open streams too — a call
on the `Calls` stream is refused, an open `Poll`, `WatchPromises` or `Calls`
stream is ended with the reason within a second, and a `Poll` stream never
receives a task its principal may no longer take. And only the stream's own
principal, after a call that succeeded, marks a stalled stream alive.

Each test has principals of its own in the module's token file, so that a
revocation touches nothing else; both stores.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from _auth import Grant, bearer, code_and_reason, make_jwt, make_jwt_keys
from _pg import fresh_schema
from _streams import HandCalls, ReadStream, StreamEnded, ended_with
from _support import PollStream, eventually, start_server
from google.protobuf.duration_pb2 import Duration

from troth.errors import Reason
from troth.v1 import promises_pb2, promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc, types_pb2
from troth_server.auth import mint

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from _support import ServerProcess

ENDED_WITHIN_S = 3.0
"""How soon an open stream must end after its credential changed: the server checks
at once after a reload and twice a second otherwise (1 s is the promise; the rest
is room for a loaded machine)."""

GRANTS = [
    Grant("admin-1", ("admin",)),
    Grant("gw-calls", ("gateway",)),
    Grant("op-watch", ("operator",)),
    Grant("wk-revoked", ("worker",), ("g-revoked",)),
    Grant("wk-narrowed", ("worker",), ("gq",)),
    Grant("wk-frozen", ("worker",), ("g-frozen",)),
    Grant("wk-other", ("worker",), ("g-other", "g-frozen")),
]


@dataclass
class Setup:
    server: ServerProcess
    channel: grpc.Channel
    tokens: dict[str, str]
    entries: dict[str, str]
    path: Path
    jwt_secret: bytes
    lock: threading.Lock

    def md(self, name: str) -> tuple[tuple[str, str], ...]:
        return bearer(self.tokens[name])

    @property
    def promises(self) -> promises_pb2_grpc.PromiseServiceStub:
        return promises_pb2_grpc.PromiseServiceStub(self.channel)

    @property
    def tasks(self) -> tasks_pb2_grpc.TaskServiceStub:
        return tasks_pb2_grpc.TaskServiceStub(self.channel)

    def rewrite(self, name: str, entry: str) -> None:
        """Replace `name`'s token-file entry, then SIGHUP."""
        with self.lock:
            self.entries[name] = entry
            self.path.write_text("\n".join(self.entries.values()))
            self.server.proc.send_signal(signal.SIGHUP)

    def start(self, group: str) -> str:
        root = f"wf-{uuid.uuid4().hex[:10]}"
        self.promises.CreatePromise(
            promises_pb2.CreatePromiseRequest(
                id=root,
                param=types_pb2.Payload(data=b"[]"),
                tags={"troth:invoke": group, "troth:func": "publish"},
            ),
            metadata=self.md("admin-1"),
            timeout=10,
        )
        return root

    def state(self, promise_id: str) -> int:
        got = self.promises.GetPromise(
            promises_pb2.GetPromiseRequest(id=promise_id), metadata=self.md("admin-1"), timeout=10
        )
        return int(got.promise.state)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def setup(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Setup]:
    workdir = tmp_path_factory.mktemp("revocation")
    keys = make_jwt_keys(workdir / "keys")
    entries, tokens = {}, {}
    for grant in GRANTS:
        minted = mint(grant.name, grant.roles, grant.groups, grant.prefixes)
        entries[grant.name], tokens[grant.name] = minted.entry, minted.token
    path = workdir / "tokens.toml"
    path.write_text("\n".join(entries.values()))
    with ExitStack() as stack:
        db_url = stack.enter_context(fresh_schema()) if request.param == "postgres" else None
        server = start_server(
            workdir,
            "--auth-tokens", str(path),
            "--jwt-key-file", str(keys.hs_file),
            "--jwt-algorithms", "HS256",
            "--sweep-interval", "200ms",
            db_url=db_url,
        )  # fmt: skip
        try:
            with server.channel() as channel:
                yield Setup(
                    server, channel, tokens, entries, path, keys.hs_secret, threading.Lock()
                )
        finally:
            assert server.stop() == 0, server.log()[-3000:]


def _reason(error: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    return ended_with(error)


def _ended_stream(reader: PollStream, within: float) -> grpc.RpcError:
    got = reader._queue.get(timeout=within)
    assert isinstance(got, grpc.RpcError), f"the stream was not ended but delivered {got}"
    return got


def _poll(setup: Setup, principal: str, group: str, worker_id: str, lease: int = 30) -> PollStream:
    stub, metadata = setup.tasks, setup.md(principal)

    class _WithToken:
        def Poll(self, request: tasks_pb2.PollRequest) -> Any:
            return stub.Poll(request, metadata=metadata, timeout=120)

    request = tasks_pb2.PollRequest(
        group=group, worker_id=worker_id, capacity=4, lease=Duration(seconds=lease)
    )
    return PollStream(_WithToken(), request, wait=20)  # type: ignore[arg-type]


def _watch(setup: Setup, principal: str, glob: str) -> ReadStream:
    request = promises_pb2.WatchPromisesRequest(id=glob)
    return ReadStream(
        setup.promises.WatchPromises(request, metadata=setup.md(principal), timeout=120)
    )


def _complete_on(calls: HandCalls, task: tasks_pb2.Task, worker_id: str) -> None:
    """A CompleteTask that would settle the root, on a stream that may have been ended
    meanwhile: refused either way."""
    request = tasks_pb2.CompleteTaskRequest(
        task_id=task.id,
        counter=task.counter,
        worker_id=worker_id,
        resolve_root=types_pb2.Payload(data=b"1"),
    )
    try:
        code, _ = calls.send("CompleteTask", request)
    except StreamEnded:
        return  # the stream was ended before the call could be answered
    assert code != grpc.StatusCode.OK


UNKNOWN = (grpc.StatusCode.UNAUTHENTICATED, Reason.TOKEN_UNKNOWN.value)


def test_a_revoked_token_stops_on_calls_poll_and_watch_streams_opened_before(
    setup: Setup,
) -> None:
    pending = f"rv-{uuid.uuid4().hex[:8]}"
    setup.promises.CreatePromise(
        promises_pb2.CreatePromiseRequest(id=pending), metadata=setup.md("admin-1"), timeout=10
    )
    gateway = HandCalls(setup.tasks, setup.md("gw-calls"))
    assert gateway.send("GetPromise", promises_pb2.GetPromiseRequest(id=pending))[0] == (
        grpc.StatusCode.OK
    )
    watch = _watch(setup, "op-watch", "rv-*")
    waiting = setup.promises.WaitPromise.future(
        promises_pb2.WaitPromiseRequest(id=pending, wait=Duration(seconds=50)),
        metadata=setup.md("gw-calls"),
        timeout=60,
    )
    # The worker holds a task, and its Calls stream is open, before the revocation.
    worker = _poll(setup, "wk-revoked", "g-revoked", "w-revoked")
    worker_calls = HandCalls(setup.tasks, setup.md("wk-revoked"))
    held_root = setup.start("g-revoked")
    task = worker.next_response().task
    assert task.root_promise_id == held_root

    with setup.lock:
        for name in ("gw-calls", "op-watch", "wk-revoked"):
            setup.entries.pop(name)
        setup.path.write_text("\n".join(setup.entries.values()))
        setup.server.proc.send_signal(signal.SIGHUP)
    sent = time.monotonic()
    later_root = setup.start("g-revoked")  # a new task, which the stream must not get

    assert _reason(gateway.ended(ENDED_WITHIN_S)) == UNKNOWN
    assert _reason(_ended_stream(worker, ENDED_WITHIN_S)) == UNKNOWN
    assert _reason(watch.ended(ENDED_WITHIN_S)) == UNKNOWN
    with pytest.raises(grpc.RpcError) as long_poll:
        waiting.result(timeout=ENDED_WITHIN_S)
    assert _reason(long_poll.value) == UNKNOWN
    _complete_on(worker_calls, task, "w-revoked")
    assert _reason(worker_calls.ended(ENDED_WITHIN_S)) == UNKNOWN
    assert time.monotonic() - sent < ENDED_WITHIN_S
    assert worker.empty()
    for root in (held_root, later_root):
        assert setup.state(root) == types_pb2.PROMISE_STATE_PENDING
    gateway.close()
    worker_calls.close()
    watch.call.cancel()
    _audited(setup, "wk-revoked", Reason.TOKEN_UNKNOWN)


def _audited(setup: Setup, principal: str, reason: Reason) -> None:
    eventually(
        lambda: any(
            "auth.refused" in line and reason.value in line
            for line in setup.server.log().splitlines()
        ),
        what=f"an auth.refused line for {principal}",
    )


def test_a_grant_narrowed_to_another_group_stops_its_open_poll_and_calls(setup: Setup) -> None:
    worker = _poll(setup, "wk-narrowed", "gq", "w-narrowed")
    calls = HandCalls(setup.tasks, setup.md("wk-narrowed"))
    root = setup.start("gq")
    task = worker.next_response().task
    beat = tasks_pb2.HeartbeatRequest(worker_id="w-narrowed", lease=Duration(seconds=30))
    assert calls.send("Heartbeat", beat)[0] == grpc.StatusCode.OK

    # The same key and secret: only the grant changed, gq -> gz.
    narrowed = setup.entries["wk-narrowed"].replace('groups = ["gq"]', 'groups = ["gz"]')
    assert narrowed != setup.entries["wk-narrowed"]
    setup.rewrite("wk-narrowed", narrowed)
    later = setup.start("gq")

    denied = (grpc.StatusCode.PERMISSION_DENIED, Reason.GROUP_NOT_ALLOWED.value)
    assert _reason(_ended_stream(worker, ENDED_WITHIN_S)) == denied

    # Its Calls stream stays open (every role may hold one), but each call is
    # authorized as its principal is now: the completion is refused.
    def refused() -> bool:
        request = tasks_pb2.CompleteTaskRequest(
            task_id=task.id,
            counter=task.counter,
            worker_id="w-narrowed",
            resolve_root=types_pb2.Payload(data=b"1"),
        )
        code, reason = calls.send("CompleteTask", request)
        assert (code, reason) in (
            denied,
            (grpc.StatusCode.FAILED_PRECONDITION, Reason.STALE_COUNTER.value),
        ), (code, reason)
        return True

    assert refused()
    for promise_id in (root, later):
        assert setup.state(promise_id) == types_pb2.PROMISE_STATE_PENDING
    assert worker.empty()
    calls.close()


def test_an_expired_jwt_stops_on_its_open_streams(setup: Setup) -> None:
    # exp 28 s ago: accepted within the server's 30 s leeway, for 2 s more.
    token = make_jwt(setup.jwt_secret, "HS256", "jwt-gateway", ["gateway"], ttl=-28)
    calls = HandCalls(setup.tasks, bearer(token))
    promise_id = f"jwt-{uuid.uuid4().hex[:8]}"
    create = promises_pb2.CreatePromiseRequest(id=promise_id)
    assert calls.send("CreatePromise", create)[0] == grpc.StatusCode.OK
    expired = (grpc.StatusCode.UNAUTHENTICATED, Reason.TOKEN_EXPIRED.value)
    assert _reason(calls.ended(2 + ENDED_WITHIN_S)) == expired
    assert (
        code_and_reason(
            lambda: setup.promises.ResolvePromise(
                promises_pb2.ResolvePromiseRequest(id=promise_id),
                metadata=bearer(token),
                timeout=10,
            )
        )
        == expired
    )
    assert setup.state(promise_id) == types_pb2.PROMISE_STATE_PENDING
    calls.close()


def test_only_the_streams_own_principal_wakes_a_stalled_stream(setup: Setup) -> None:
    """A worker frozen past its lease has its stream stalled: another principal's
    heartbeat naming its worker id, or a refused call, must not un-stall it (the
    frozen worker would be leased tasks again); its own heartbeat does."""
    frozen = _poll(setup, "wk-frozen", "g-frozen", "w-frozen", lease=1)
    first = setup.start("g-frozen")
    assert frozen.next_response().task.root_promise_id == first
    eventually(lambda: _stalled(setup, "w-frozen"), what="the frozen worker's stream stalled")
    seen = _worker(setup, "w-frozen").last_heartbeat_time.ToMilliseconds()
    time.sleep(0.05)

    beat = tasks_pb2.HeartbeatRequest(worker_id="w-frozen", lease=Duration(seconds=30))
    # (Answered OK, extending nothing; or refused, if it names a task leased to wk-frozen.)
    code_and_reason(lambda: setup.tasks.Heartbeat(beat, metadata=setup.md("wk-other"), timeout=10))
    fail = tasks_pb2.FailTaskRequest(
        task_id="no-such-task", counter=1, worker_id="w-frozen", error="E: e"
    )
    assert (
        code_and_reason(
            lambda: setup.tasks.FailTask(fail, metadata=setup.md("wk-other"), timeout=10)
        )[0]
        != grpc.StatusCode.OK
    )
    second = setup.start("g-frozen")
    assert frozen.nothing_within(1.5)  # nothing leased to the frozen worker
    assert _stalled(setup, "w-frozen")
    assert _worker(setup, "w-frozen").last_heartbeat_time.ToMilliseconds() == seen

    setup.tasks.Heartbeat(beat, metadata=setup.md("wk-frozen"), timeout=10)
    got = {frozen.next_response().task.root_promise_id}
    while second not in got:
        got.add(frozen.next_response().task.root_promise_id)
    assert _worker(setup, "w-frozen").last_heartbeat_time.ToMilliseconds() > seen
    frozen.cancel()


def _worker(setup: Setup, worker_id: str) -> Any:
    found = setup.tasks.SearchWorkers(
        tasks_pb2.SearchWorkersRequest(), metadata=setup.md("admin-1"), timeout=10
    )
    return next(w for w in found.workers if w.worker_id == worker_id)


def _stalled(setup: Setup, worker_id: str) -> bool:
    return bool(_worker(setup, worker_id).stalled)
