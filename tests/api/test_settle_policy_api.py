"""Approver policy and settle tokens against a real server (issue 11 parts 3 and 4).

Every caller is the local developer (authentication off), named by its
`troth-principal` metadata: enough to show who may settle (principals,
four-eyes, distinct quorums) and every way a settle token is refused, each with
its own reason, on SQLite and PostgreSQL. Who may mint a token, and how its
settle is counted, with authentication on: test_settle_token_principal.py.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import struct
import time
import uuid
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from _pg import fresh_schema
from _support import error_info, eventually, start_server
from google.protobuf.duration_pb2 import Duration

from troth.errors import Reason
from troth.v1 import promises_pb2, promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc, types_pb2
from troth_server.settle_keys import new_keys_file

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from _support import ServerProcess

HOUR = Duration(seconds=3600)


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "settle-keys.json"
    path.write_text(new_keys_file(["k1"]))
    return path


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, keys_file: Path
) -> Iterator[ServerProcess]:
    with ExitStack() as stack:
        db_url = stack.enter_context(fresh_schema()) if request.param == "postgres" else None
        proc = start_server(
            tmp_path_factory.mktemp("server"),
            "--settle-token-keys",
            str(keys_file),
            db_url=db_url,
        )
        yield proc
        assert proc.stop() == 0, f"unclean shutdown:\n{proc.log()[-3000:]}"


@pytest.fixture(scope="module")
def stub(server: ServerProcess) -> Iterator[promises_pb2_grpc.PromiseServiceStub]:
    with server.channel() as channel:
        yield promises_pb2_grpc.PromiseServiceStub(channel)


def _id(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def _as(principal: str | None) -> list[tuple[str, str]]:
    return [] if principal is None else [("troth-principal", principal)]


def _refused(call: Any, *args: Any, **kwargs: Any) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    detail = error_info(info.value)
    return info.value.code(), detail.reason, dict(detail.metadata)


def _resolve(
    stub: promises_pb2_grpc.PromiseServiceStub,
    promise_id: str,
    by: str | None = None,
    **fields: Any,
) -> promises_pb2.SettlePromiseResponse:
    request = promises_pb2.ResolvePromiseRequest(id=promise_id, **fields)
    return stub.ResolvePromise(request, metadata=_as(by), timeout=10)  # type: ignore[no-any-return]


def _reject(
    stub: promises_pb2_grpc.PromiseServiceStub,
    promise_id: str,
    by: str | None = None,
    **fields: Any,
) -> promises_pb2.SettlePromiseResponse:
    request = promises_pb2.RejectPromiseRequest(id=promise_id, **fields)
    return stub.RejectPromise(request, metadata=_as(by), timeout=10)  # type: ignore[no-any-return]


def _create(
    stub: promises_pb2_grpc.PromiseServiceStub,
    promise_id: str,
    by: str | None = None,
    **fields: Any,
) -> types_pb2.Promise:
    request = promises_pb2.CreatePromiseRequest(id=promise_id, ttl=HOUR, **fields)
    return stub.CreatePromise(request, metadata=_as(by), timeout=10).promise  # type: ignore[no-any-return]


def _mint(
    stub: promises_pb2_grpc.PromiseServiceStub, promise_id: str, **fields: Any
) -> promises_pb2.MintSettleTokenResponse:
    request = promises_pb2.MintSettleTokenRequest(promise_id=promise_id, **fields)
    return stub.MintSettleToken(request, timeout=10)  # type: ignore[no-any-return]


class Workflow:
    """A workflow started by `starter`, its task taken by hand to write its steps."""

    def __init__(
        self, server: ServerProcess, stub: promises_pb2_grpc.PromiseServiceStub, starter: str
    ):
        self.id, group = _id("wf"), _id("g")
        self.stub = stub
        tags = {"troth:invoke": group, "troth:func": "approve"}
        self.root = _create(stub, self.id, starter, tags=tags)
        self.channel = grpc.insecure_channel(server.address)
        tasks = tasks_pb2_grpc.TaskServiceStub(self.channel)
        self.stream = tasks.Poll(tasks_pb2.PollRequest(group=group, worker_id="w1", capacity=1))
        task = next(self.stream).task
        self.fence = types_pb2.TaskFence(task_id=task.id, counter=task.counter, worker_id="w1")

    def step(self, n: int, **approvers: Any) -> types_pb2.Promise:
        return _create(
            self.stub,
            f"{self.id}.{n}",
            fence=self.fence,
            approvers=types_pb2.Approvers(**approvers),
        )

    def close(self) -> None:
        self.stream.cancel()
        self.channel.close()


@pytest.fixture
def workflow(
    server: ServerProcess, stub: promises_pb2_grpc.PromiseServiceStub
) -> Iterator[Workflow]:
    wf = Workflow(server, stub, starter="alice")
    yield wf
    wf.close()


# -- the approver policy -------------------------------------------------------------


def test_the_policy_and_the_starter_are_recorded_and_returned(
    stub: promises_pb2_grpc.PromiseServiceStub, workflow: Workflow
) -> None:
    step = workflow.step(0, principals=["carol", "bob"], not_requester=True)
    assert workflow.root.started_by == "alice"
    got = stub.GetPromise(promises_pb2.GetPromiseRequest(id=step.id), timeout=10).promise
    assert got.started_by == "alice"  # a step's starter is its workflow's
    assert list(got.approvers.principals) == ["bob", "carol"]
    assert got.approvers.not_requester
    _resolve(stub, step.id, "bob")
    got = stub.GetPromise(promises_pb2.GetPromiseRequest(id=step.id), timeout=10).promise
    assert got.settled_by == "bob"
    assert got.HasField("settle_time")


def test_only_a_listed_approver_settles(stub: promises_pb2_grpc.PromiseServiceStub) -> None:
    promise = _create(stub, _id("p"), "alice", approvers=types_pb2.Approvers(principals=["carol"]))
    for settle in (_resolve, _reject):
        code, reason, metadata = _refused(settle, stub, promise.id, "mallory")
        assert (code, reason, metadata["rule"]) == (
            grpc.StatusCode.PERMISSION_DENIED,
            Reason.NOT_AN_APPROVER,
            "approvers",
        )
    # An unnamed caller is nobody on the list either.
    assert _refused(_resolve, stub, promise.id)[1] == Reason.NOT_AN_APPROVER
    assert _resolve(stub, promise.id, "carol").applied


def test_a_role_that_the_caller_lacks_refuses_it(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    promise = _create(stub, _id("p"), approvers=types_pb2.Approvers(roles=["finance"]))
    assert _refused(_resolve, stub, promise.id, "bob")[2]["rule"] == "approvers"
    # The local developer holds every built-in role.
    other = _create(stub, _id("p"), approvers=types_pb2.Approvers(roles=["operator"]))
    assert _resolve(stub, other.id, "bob").applied


def test_cancel_is_not_checked_against_the_policy(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    promise = _create(stub, _id("p"), approvers=types_pb2.Approvers(principals=["carol"]))
    request = promises_pb2.CancelPromiseRequest(id=promise.id)
    cancelled = stub.CancelPromise(request, metadata=_as("ops"), timeout=10)
    assert cancelled.promise.state == types_pb2.PROMISE_STATE_REJECTED_CANCELED


def test_four_eyes_refuses_the_workflows_starter(
    stub: promises_pb2_grpc.PromiseServiceStub, workflow: Workflow
) -> None:
    step = workflow.step(0, not_requester=True)
    code, reason, metadata = _refused(_resolve, stub, step.id, "alice")
    assert (code, reason, metadata["rule"]) == (
        grpc.StatusCode.PERMISSION_DENIED,
        Reason.NOT_AN_APPROVER,
        "not_requester",
    )
    assert _resolve(stub, step.id, "bob").promise.settled_by == "bob"


def test_four_eyes_on_a_standalone_promise_refuses_its_creator(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    promise = _create(stub, _id("p"), "alice", approvers=types_pb2.Approvers(not_requester=True))
    assert _refused(_reject, stub, promise.id, "alice")[2]["rule"] == "not_requester"
    assert _reject(stub, promise.id, "bob").applied


def test_a_distinct_quorum_needs_a_different_principal_per_approval(
    stub: promises_pb2_grpc.PromiseServiceStub, workflow: Workflow
) -> None:
    steps = [workflow.step(n, distinct=True) for n in range(3)]
    other_quorum = workflow.step(3, distinct=True, quorum="legal")
    assert _resolve(stub, steps[0].id, "bob").applied
    code, reason, metadata = _refused(_resolve, stub, steps[1].id, "bob")
    assert (code, reason, metadata["rule"]) == (
        grpc.StatusCode.PERMISSION_DENIED,
        Reason.NOT_AN_APPROVER,
        "distinct",
    )
    assert _refused(_reject, stub, steps[2].id, "bob")[2]["rule"] == "distinct"
    assert _resolve(stub, steps[1].id, "carol").applied
    # Another quorum of the same workflow counts on its own.
    assert _resolve(stub, other_quorum.id, "bob").applied


# -- settle tokens ---------------------------------------------------------------------


def test_a_token_settles_its_promise_once_with_no_other_credential(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    # A link for the approver the policy names: the settle is carol's, by the token.
    promise = _create(stub, _id("p"), approvers=types_pb2.Approvers(principals=["carol"]))
    minted = _mint(stub, promise.id, acts_for="carol")
    assert (minted.key_id, minted.acts_for) == ("k1", "carol")
    assert minted.expire_time.ToMilliseconds() <= promise.expire_time.ToMilliseconds()
    settled = _resolve(stub, promise.id, settle_token=minted.token, idempotency_key="click-1")
    assert settled.applied
    assert settled.promise.settled_by == f"carol via settle-token k1:{minted.token_id}"
    # Once: a second use is refused, saying so; a retry of the same click is answered.
    code, reason, _ = _refused(_resolve, stub, promise.id, settle_token=minted.token)
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, Reason.SETTLE_TOKEN_USED)
    assert _refused(_reject, stub, promise.id, settle_token=minted.token)[1] == (
        Reason.SETTLE_TOKEN_USED
    )
    repeat = _resolve(stub, promise.id, settle_token=minted.token, idempotency_key="click-1")
    assert not repeat.applied


def test_a_second_token_of_a_settled_promise_finds_it_settled(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    promise = _create(stub, _id("p"))
    first, second = _mint(stub, promise.id), _mint(stub, promise.id)
    assert first.token_id != second.token_id
    _reject(stub, promise.id, settle_token=first.token)
    assert _refused(_resolve, stub, promise.id, settle_token=second.token)[1] == (
        Reason.ALREADY_SETTLED
    )


_HEAD = struct.Struct(">12sQBBQH")  # token id, expiry, outcomes, roles, instance, id length


def _parts(token: str) -> tuple[str, bytes, bytes]:
    prefix, key_id, payload, mac = token.split(".")
    assert prefix == "st2"
    return key_id, _unb64(payload), _unb64(mac)


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _token(key_id: str, payload: bytes, mac: bytes, prefix: str = "st2") -> str:
    return ".".join((prefix, key_id, _b64(payload), _b64(mac)))


def test_altered_tokens_are_refused_as_badly_signed(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    promise, other = _create(stub, _id("p")), _create(stub, _id("p"))
    minted = _mint(
        stub, promise.id, outcomes=[types_pb2.PROMISE_STATE_REJECTED], ttl=Duration(seconds=60)
    )
    key_id, payload, mac = _parts(minted.token)
    token_id, expire, bits, roles, instance, length = _HEAD.unpack_from(payload)
    rest = payload[_HEAD.size :]
    principal = rest[length:]
    assert (rest[:length], principal) == (promise.id.encode(), b"local-developer")

    def head(**changed: int) -> bytes:
        fields = {"expire": expire, "bits": bits, "roles": roles, "instance": instance}
        fields.update(changed)
        return _HEAD.pack(token_id, *fields.values(), length)

    altered = {
        "outcome": head(bits=3) + rest,
        "expiry": head(expire=expire + 86_400_000) + rest,
        "roles": head(roles=roles ^ 8) + rest,
        "instance": head(instance=instance ^ 1) + rest,
        "principal": payload[: _HEAD.size + length] + b"carol",
        "promise": _HEAD.pack(token_id, expire, bits, roles, instance, len(other.id))
        + other.id.encode()
        + principal,
    }
    for what, changed in altered.items():
        target = other.id if what == "promise" else promise.id
        code, reason, _ = _refused(
            _resolve, stub, target, settle_token=_token(key_id, changed, mac)
        )
        assert (code, reason) == (
            grpc.StatusCode.PERMISSION_DENIED,
            Reason.SETTLE_TOKEN_BAD_SIGNATURE,
        ), what
    # Forged outright: a mac made with a key that is not the server's.
    forged = hmac.new(b"x" * 32, b"troth-settle-token/2\0k1\0" + payload, hashlib.sha256).digest()
    assert _refused(_reject, stub, promise.id, settle_token=_token(key_id, payload, forged))[1] == (
        Reason.SETTLE_TOKEN_BAD_SIGNATURE
    )
    # Nothing was changed by any of them: the real token still works.
    assert _reject(stub, promise.id, settle_token=minted.token).applied


def test_a_token_is_refused_for_each_other_reason_distinctly(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    promise, other = _create(stub, _id("p")), _create(stub, _id("p"))
    minted = _mint(stub, promise.id, outcomes=[types_pb2.PROMISE_STATE_REJECTED])
    key_id, payload, mac = _parts(minted.token)
    cases = {
        "garbage": (
            "not-a-token", promise.id, _resolve,
            grpc.StatusCode.INVALID_ARGUMENT, Reason.SETTLE_TOKEN_MALFORMED,
        ),
        "cut short": (
            minted.token[:-10], promise.id, _reject,
            grpc.StatusCode.INVALID_ARGUMENT, Reason.SETTLE_TOKEN_MALFORMED,
        ),
        "unknown key": (
            _token("k9", payload, mac), promise.id, _reject,
            grpc.StatusCode.PERMISSION_DENIED, Reason.SETTLE_TOKEN_UNKNOWN_KEY,
        ),
        "wrong promise": (
            minted.token, other.id, _reject,
            grpc.StatusCode.PERMISSION_DENIED, Reason.SETTLE_TOKEN_WRONG_PROMISE,
        ),
        "outcome": (
            minted.token, promise.id, _resolve,
            grpc.StatusCode.PERMISSION_DENIED, Reason.SETTLE_TOKEN_OUTCOME_NOT_ALLOWED,
        ),
    }  # fmt: skip
    for what, (token, target, settle, code, reason) in cases.items():
        got_code, got_reason, _ = _refused(settle, stub, target, settle_token=token)
        assert (got_code, got_reason) == (code, reason), what
    assert key_id == "k1"


def test_a_token_of_an_older_server_is_refused_saying_so(
    stub: promises_pb2_grpc.PromiseServiceStub, keys_file: Path
) -> None:
    # An st1 token, signed with the server's own key: it acted for nobody.
    promise = _create(stub, _id("p"))
    secret = _unb64(json.loads(keys_file.read_text())["keys"]["k1"])
    payload = struct.pack(">12sQB", b"\0" * 12, int(time.time() * 1000) + 60_000, 3)
    payload += promise.id.encode()
    mac = hmac.new(secret, b"troth-settle-token/1\0k1\0" + payload, hashlib.sha256).digest()
    code, reason, _ = _refused(
        _resolve, stub, promise.id, settle_token=_token("k1", payload, mac, prefix="st1")
    )
    assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, Reason.SETTLE_TOKEN_OUTDATED)
    assert promise.state == types_pb2.PROMISE_STATE_PENDING


def test_an_expired_token_is_refused(stub: promises_pb2_grpc.PromiseServiceStub) -> None:
    promise = _create(stub, _id("p"))
    minted = _mint(stub, promise.id, ttl=Duration(nanos=300_000_000))
    # Time must pass (a sleep on purpose): until just after the token's expiry.
    time.sleep(max(0.0, minted.expire_time.ToMilliseconds() / 1000 - time.time()) + 0.1)
    code, reason, _ = _refused(_resolve, stub, promise.id, settle_token=minted.token)
    assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, Reason.SETTLE_TOKEN_EXPIRED)


def test_cancelling_the_workflow_voids_its_links(
    stub: promises_pb2_grpc.PromiseServiceStub, workflow: Workflow
) -> None:
    step = workflow.step(0, principals=["carol"])
    minted = _mint(stub, step.id, acts_for="carol")
    stub.CancelPromise(promises_pb2.CancelPromiseRequest(id=workflow.id), timeout=10)
    code, reason, metadata = _refused(_resolve, stub, step.id, settle_token=minted.token)
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, Reason.SETTLE_TOKEN_VOID)
    assert metadata["state"] == "REJECTED_CANCELED"
    # And no new link is minted for it.
    assert _refused(_mint, stub, step.id)[1] == Reason.ALREADY_SETTLED


def test_a_token_cannot_go_with_a_fence_or_create_if_missing(
    stub: promises_pb2_grpc.PromiseServiceStub, workflow: Workflow
) -> None:
    step = workflow.step(0)
    minted = _mint(stub, step.id)
    fenced = _refused(_resolve, stub, step.id, settle_token=minted.token, fence=workflow.fence)
    early = _refused(_resolve, stub, _id("nope"), settle_token=minted.token, create_if_missing=True)
    for code, _, metadata in (fenced, early):
        assert (code, metadata["field"]) == (grpc.StatusCode.INVALID_ARGUMENT, "settle_token")


def test_mint_refuses_unknown_and_settled_promises(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    assert _refused(_mint, stub, _id("missing"))[:2] == (
        grpc.StatusCode.NOT_FOUND,
        Reason.NOT_FOUND,
    )
    promise = _create(stub, _id("p"))
    _resolve(stub, promise.id)
    assert _refused(_mint, stub, promise.id)[1] == Reason.ALREADY_SETTLED
    bad = _refused(
        _mint,
        stub,
        _create(stub, _id("p")).id,
        outcomes=[types_pb2.PROMISE_STATE_REJECTED_CANCELED],
    )
    assert (bad[0], bad[2]["field"]) == (grpc.StatusCode.INVALID_ARGUMENT, "outcomes[0]")


def test_keys_rotate_without_breaking_links_already_sent(
    stub: promises_pb2_grpc.PromiseServiceStub, keys_file: Path, server: ServerProcess
) -> None:
    original = keys_file.read_text()
    first, second = _create(stub, _id("p")), _create(stub, _id("p"))
    old = [_mint(stub, first.id), _mint(stub, second.id)]
    body = json.loads(original)
    rotated = json.loads(new_keys_file(["k2"]))
    try:
        # k2 signs from now on; k1 still verifies.
        body["keys"]["k2"], body["active"] = rotated["keys"]["k2"], "k2"
        keys_file.write_text(json.dumps(body))
        deadline = time.monotonic() + 10
        while (new := _mint(stub, first.id)).key_id != "k2":
            assert time.monotonic() < deadline, "the keys file was not re-read"
            time.sleep(0.2)
        assert _resolve(stub, first.id, settle_token=old[0].token).applied
        # k1 retired: its links stop working.
        del body["keys"]["k1"]
        keys_file.write_text(json.dumps(body))
        deadline = time.monotonic() + 10
        # Probe with the spent k1 token on another promise: wrong promise while k1
        # verifies, unknown key once it is gone.
        while _refused(_resolve, stub, second.id, settle_token=old[0].token)[1] != (
            Reason.SETTLE_TOKEN_UNKNOWN_KEY
        ):
            assert time.monotonic() < deadline, "the keys file was not re-read"
            time.sleep(0.2)
        assert _refused(_resolve, stub, second.id, settle_token=old[1].token)[1] == (
            Reason.SETTLE_TOKEN_UNKNOWN_KEY
        )
        assert new.token_id
        assert "settle_tokens.keys_reloaded" in server.log()
    finally:
        keys_file.write_text(original)


def test_tokens_and_secrets_never_reach_the_log(
    stub: promises_pb2_grpc.PromiseServiceStub, server: ServerProcess, keys_file: Path
) -> None:
    promise = _create(stub, _id("p"))
    minted = _mint(stub, promise.id)
    _refused(_resolve, stub, _id("other"), settle_token=minted.token)
    _resolve(stub, promise.id, settle_token=minted.token)
    # The minted line names the token by its id (logs are written in batches).
    eventually(lambda: minted.token_id in server.log() and promise.id in server.log())
    log = server.log()
    assert minted.token.split(".")[3] not in log
    for secret in json.loads(keys_file.read_text())["keys"].values():
        assert secret not in log


def test_a_server_without_keys_mints_no_token(tmp_path: Path) -> None:
    proc = start_server(tmp_path)
    try:
        with proc.channel() as channel:
            stub = promises_pb2_grpc.PromiseServiceStub(channel)
            promise = _create(stub, _id("p"))
            assert _refused(_mint, stub, promise.id)[:2] == (
                grpc.StatusCode.FAILED_PRECONDITION,
                Reason.SETTLE_TOKENS_OFF,
            )
            assert _refused(_resolve, stub, promise.id, settle_token="st1.k1.AAAA.AAAA")[1] == (
                Reason.SETTLE_TOKENS_OFF
            )
    finally:
        assert proc.stop() == 0


def test_a_bad_keys_file_stops_the_start(tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text('{"active": "k1", "keys": {"k1": "c2hvcnQ"}}')
    with pytest.raises(RuntimeError, match="k1"):
        start_server(tmp_path, "--settle-token-keys", str(keys))
