"""Permission names in approver policies, on every road (issue 31 item 2; DESIGN §4
rules 15 and 16), on both stores.

`Approvers(permissions=["payouts:approve"])` admits a principal whose credential
grants that permission: a token-file entry's `permissions`, or a JWT's permissions
claim (here `--jwt-permissions-claim scope`, a space-separated string). The one
decision (`troth_server.guard`) holds for a unary settle, a settle on the `Calls`
stream, a settle token (minted only for a holder, carrying the permission, checked
again at settle) and the inbox's `mine`; four-eyes and distinct quorums count
permission holders as they count everyone. A grant narrowed in the token file
(SIGHUP) stops admitting on a `Calls` stream opened before, at once.
"""

from __future__ import annotations

import signal
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from _auth import Grant, bearer, make_jwt, make_jwt_keys
from _pg import fresh_schema
from _streams import HandCalls
from _support import error_info, eventually, start_server
from google.protobuf.duration_pb2 import Duration

from troth import Caller, Client
from troth.errors import Reason
from troth.v1 import promises_pb2, promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc, types_pb2
from troth_server.auth import mint
from troth_server.settle_keys import new_keys_file

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from _support import ServerProcess

HOUR = Duration(seconds=3600)
GROUP = "g-perms"
PAYOUTS = "payouts:approve"
NARROWED_WITHIN_S = 3.0
"""How soon a narrowed grant must stop admitting on an open stream: the server reloads
on SIGHUP at once (1 s is the promise; the rest is room for a loaded machine)."""
GRANTS = [
    Grant("ann", ("gateway",), permissions=(PAYOUTS,)),
    Grant("bob", ("gateway",), permissions=(PAYOUTS, "payouts:read")),
    Grant("carol", ("gateway",), permissions=("payouts:read",)),
    Grant("nick", ("gateway",), permissions=(PAYOUTS,)),
    Grant("root", ("admin",)),
    Grant("worker-a", ("worker",), (GROUP,)),
]


@dataclass
class Setup:
    server: ServerProcess
    channel: grpc.Channel
    md: dict[str, tuple[tuple[str, str], ...]]
    entries: dict[str, str]
    path: Path

    @property
    def promises(self) -> promises_pb2_grpc.PromiseServiceStub:
        return promises_pb2_grpc.PromiseServiceStub(self.channel)

    @property
    def tasks(self) -> tasks_pb2_grpc.TaskServiceStub:
        return tasks_pb2_grpc.TaskServiceStub(self.channel)

    def rewrite(self, name: str, entry: str) -> None:
        """Replace `name`'s token-file entry, then SIGHUP."""
        self.entries[name] = entry
        self.path.write_text("\n".join(self.entries.values()))
        self.server.proc.send_signal(signal.SIGHUP)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def setup(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Setup]:
    workdir = tmp_path_factory.mktemp("perms")
    (workdir / "settle-keys.json").write_text(new_keys_file(["k1"]))
    keys = make_jwt_keys(workdir / "jwt")
    entries, md = {}, {}
    for grant in GRANTS:
        minted = mint(grant.name, grant.roles, grant.groups, grant.prefixes, grant.permissions)
        entries[grant.name], md[grant.name] = minted.entry, bearer(minted.token)
    path = workdir / "tokens.toml"
    path.write_text("\n".join(entries.values()))
    jay = make_jwt(keys.hs_secret, "HS256", "jay", ["gateway"], ttl=600, scope=f"openid {PAYOUTS}")
    md["jay"] = bearer(jay)
    md["anyone"] = ()
    with ExitStack() as stack:
        db_url = stack.enter_context(fresh_schema()) if request.param == "postgres" else None
        server = start_server(
            workdir,
            "--auth-tokens", str(path),
            "--jwt-key-file", str(keys.hs_file),
            "--jwt-algorithms", "HS256",
            "--jwt-permissions-claim", "scope",
            "--settle-token-keys", str(workdir / "settle-keys.json"),
            db_url=db_url,
        )  # fmt: skip
        try:
            with server.channel() as channel:
                yield Setup(server, channel, md, entries, path)
        finally:
            assert server.stop() == 0, server.log()[-3000:]


def _id(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def _payouts(**more: Any) -> types_pb2.Approvers:
    return types_pb2.Approvers(permissions=[PAYOUTS], **more)


def _create(setup: Setup, promise_id: str, by: str = "root", **fields: Any) -> types_pb2.Promise:
    request = promises_pb2.CreatePromiseRequest(id=promise_id, ttl=HOUR, **fields)
    return setup.promises.CreatePromise(request, metadata=setup.md[by], timeout=10).promise  # type: ignore[no-any-return]


def _resolve(
    setup: Setup, promise_id: str, by: str = "anyone", **fields: Any
) -> promises_pb2.ResolvePromiseResponse:
    request = promises_pb2.ResolvePromiseRequest(id=promise_id, **fields)
    return setup.promises.ResolvePromise(request, metadata=setup.md[by], timeout=10)  # type: ignore[no-any-return]


def _mint(
    setup: Setup, promise_id: str, by: str, **fields: Any
) -> promises_pb2.MintSettleTokenResponse:
    request = promises_pb2.MintSettleTokenRequest(promise_id=promise_id, **fields)
    return setup.promises.MintSettleToken(request, metadata=setup.md[by], timeout=10)  # type: ignore[no-any-return]


def _refused(call: Any, *args: Any, **kwargs: Any) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    detail = error_info(info.value)
    return info.value.code(), detail.reason, dict(detail.metadata)


def _not_an_approver(refusal: tuple[grpc.StatusCode, str, dict[str, str]], rule: str) -> None:
    code, reason, metadata = refusal
    assert (code, reason, metadata.get("rule")) == (
        grpc.StatusCode.PERMISSION_DENIED,
        Reason.NOT_AN_APPROVER,
        rule,
    ), refusal


DENIED = (grpc.StatusCode.PERMISSION_DENIED, Reason.NOT_AN_APPROVER.value)


class Workflow:
    """A workflow started by `starter`, its task polled by hand by `worker-a`."""

    def __init__(self, setup: Setup, starter: str) -> None:
        self.setup = setup
        self.id = _id("wf")
        _create(
            setup,
            self.id,
            starter,
            param=types_pb2.Payload(data=b"[]"),
            tags={"troth:invoke": GROUP, "troth:func": "approve"},
        )
        self.channel = grpc.insecure_channel(setup.server.address)
        tasks = tasks_pb2_grpc.TaskServiceStub(self.channel)
        worker_id = _id("worker")
        md = setup.md["worker-a"]
        self.stream = tasks.Poll(
            tasks_pb2.PollRequest(group=GROUP, worker_id=worker_id, capacity=8),
            metadata=md,
            timeout=60,
        )
        while (task := next(self.stream).task).root_promise_id != self.id:
            tasks.CompleteTask(
                tasks_pb2.CompleteTaskRequest(
                    task_id=task.id, counter=task.counter, worker_id=worker_id
                ),
                metadata=md,
                timeout=10,
            )
        self.fence = types_pb2.TaskFence(task_id=task.id, counter=task.counter, worker_id=worker_id)

    def step(self, n: int, approvers: types_pb2.Approvers) -> types_pb2.Promise:
        return _create(
            self.setup, f"{self.id}.{n}", "worker-a", fence=self.fence, approvers=approvers
        )

    def close(self) -> None:
        self.stream.cancel()
        self.channel.close()


# -- a unary settle --------------------------------------------------------------------


def test_a_listed_permission_admits_its_holders_only(setup: Setup) -> None:
    promise = _create(setup, _id("pay"), approvers=_payouts())
    assert list(promise.approvers.permissions) == [PAYOUTS]
    # Another permission, and admin without the permission, are no approvers.
    _not_an_approver(_refused(_resolve, setup, promise.id, "carol"), "approvers")
    _not_an_approver(_refused(_resolve, setup, promise.id, "root"), "approvers")
    settled = _resolve(setup, promise.id, "ann")
    assert settled.applied and settled.promise.settled_by == "ann"


def test_a_jwt_s_permissions_come_from_the_configured_claim(setup: Setup) -> None:
    promise = _create(setup, _id("pay"), approvers=_payouts())
    assert _resolve(setup, promise.id, "jay").promise.settled_by == "jay"


def test_a_bad_permission_name_is_invalid_argument_naming_the_field(setup: Setup) -> None:
    for permissions, field in (
        ([PAYOUTS, "pay outs"], "approvers.permissions[1]"),
        (["x" * 129], "approvers.permissions[0]"),
        ([f"p{i}" for i in range(101)], "approvers.permissions"),
    ):
        code, reason, metadata = _refused(
            _create, setup, _id("bad"), approvers=types_pb2.Approvers(permissions=permissions)
        )
        assert (code, reason, metadata.get("field")) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            Reason.INVALID_ARGUMENT,
            field,
        ), (permissions, code, reason, metadata)


def test_four_eyes_and_a_distinct_quorum_hold_for_permission_holders(setup: Setup) -> None:
    workflow = Workflow(setup, starter="ann")
    try:
        four_eyes = workflow.step(0, _payouts(not_requester=True))
        _not_an_approver(_refused(_resolve, setup, four_eyes.id, "ann"), "not_requester")
        first, second = (workflow.step(n, _payouts(distinct=True, quorum="pay")) for n in (1, 2))
        assert _resolve(setup, first.id, "bob").applied
        _not_an_approver(_refused(_resolve, setup, second.id, "bob"), "distinct")
        assert _resolve(setup, second.id, "nick").applied
        assert _resolve(setup, four_eyes.id, "bob").applied
    finally:
        workflow.close()


# -- the Calls stream ------------------------------------------------------------------


def test_the_calls_stream_decides_as_a_unary_settle(setup: Setup) -> None:
    promise = _create(setup, _id("pay"), approvers=_payouts())
    carol = HandCalls(setup.tasks, setup.md["carol"])
    ann = HandCalls(setup.tasks, setup.md["ann"])
    try:
        resolve = promises_pb2.ResolvePromiseRequest(id=promise.id)
        assert carol.send("ResolvePromise", resolve) == DENIED
        assert ann.send("ResolvePromise", resolve) == (grpc.StatusCode.OK, "")
    finally:
        carol.close()
        ann.close()


def _mine(calls: HandCalls, glob: str) -> list[str]:
    request = promises_pb2.SearchPromisesRequest(id=glob, mine=True, page_size=10)
    answer = calls.ask("SearchPromises", request)
    assert answer.code == grpc.StatusCode.OK.value[0], answer.message
    response = promises_pb2.SearchPromisesResponse.FromString(answer.response)
    return [p.id for p in response.promises]


def test_a_narrowed_grant_stops_admitting_on_an_open_calls_stream(setup: Setup) -> None:
    prefix = _id("narrow")
    first = _create(setup, f"{prefix}.a", approvers=_payouts())
    second = _create(setup, f"{prefix}.b", approvers=_payouts())
    nick = HandCalls(setup.tasks, setup.md["nick"])
    try:
        assert nick.send("ResolvePromise", promises_pb2.ResolvePromiseRequest(id=first.id)) == (
            grpc.StatusCode.OK,
            "",
        )
        assert _mine(nick, f"{prefix}.*") == [second.id]  # the inbox: his to decide
        # The same entry (key and secret: the same token) without its permission.
        kept = setup.entries["nick"].replace(f'permissions = ["{PAYOUTS}"]\n', "")
        assert kept != setup.entries["nick"]
        began = time.monotonic()
        setup.rewrite("nick", kept)
        eventually(lambda: _mine(nick, f"{prefix}.*") == [], NARROWED_WITHIN_S, "narrowing")
        assert time.monotonic() - began < NARROWED_WITHIN_S
        resolve = promises_pb2.ResolvePromiseRequest(id=second.id)
        assert nick.send("ResolvePromise", resolve) == DENIED
        # The stream itself goes on: his grant still allows every RPC it did.
        get = promises_pb2.GetPromiseRequest(id=second.id)
        assert nick.send("GetPromise", get) == (grpc.StatusCode.OK, "")
    finally:
        nick.close()


# -- settle tokens ---------------------------------------------------------------------


def test_a_token_is_minted_only_for_a_holder_and_carries_the_permission(setup: Setup) -> None:
    promise = _create(setup, _id("pay"), approvers=_payouts())
    _not_an_approver(_refused(_mint, setup, promise.id, "carol"), "approvers")
    # A gateway's link for a named approver: the server cannot know that one's
    # permissions, so only a listed principal is admitted.
    refusal = _refused(_mint, setup, promise.id, "carol", acts_for="bob")
    _not_an_approver(refusal, "approvers")
    minted = _mint(setup, promise.id, "bob")
    assert minted.acts_for == "bob" and minted.token.startswith("st3.")
    # Used with no credential at all, as a mail's reader would: it acts for bob.
    settled = _resolve(setup, promise.id, settle_token=minted.token)
    assert settled.promise.settled_by == f"bob via settle-token k1:{minted.token_id}"


def test_a_token_s_settle_is_checked_again_as_its_principal_s(setup: Setup) -> None:
    workflow = Workflow(setup, starter="ann")
    try:
        first, second = (workflow.step(n, _payouts(distinct=True)) for n in (0, 1))
        link = _mint(setup, second.id, "bob")  # bob had approved nothing yet
        assert _resolve(setup, first.id, "bob").applied
        _not_an_approver(_refused(_resolve, setup, second.id, settle_token=link.token), "distinct")
        assert _resolve(setup, second.id, "ann").applied
    finally:
        workflow.close()


# -- who the caller is -----------------------------------------------------------------


def test_whoami_describes_the_principal_with_its_permissions(setup: Setup) -> None:
    got = setup.promises.WhoAmI(promises_pb2.WhoAmIRequest(), metadata=setup.md["bob"], timeout=10)
    assert (got.principal.name, list(got.principal.roles)) == ("bob", ["gateway"])
    assert list(got.principal.permissions) == [PAYOUTS, "payouts:read"]
    assert got.principal.authenticated
    jay = setup.promises.WhoAmI(promises_pb2.WhoAmIRequest(), metadata=setup.md["jay"], timeout=10)
    assert list(jay.principal.permissions) == ["openid", PAYOUTS]
    token = dict(setup.md["ann"])["authorization"].removeprefix("Bearer ")
    with Client(setup.server.address, token=token, timeout=10) as client:  # the Calls road
        assert client.whoami() == Caller(
            name="ann", roles=("gateway",), permissions=(PAYOUTS,), authenticated=True
        )
    worker = setup.promises.WhoAmI(
        promises_pb2.WhoAmIRequest(), metadata=setup.md["worker-a"], timeout=10
    )
    assert list(worker.principal.groups) == [GROUP] and not worker.principal.permissions
