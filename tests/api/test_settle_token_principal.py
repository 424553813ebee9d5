"""A settle acts for a principal (DESIGN §4 rule 16; issue 26 item 3), on both stores.

A settle token carries the principal it acts for and the promise's identity (id
and instance). It is minted only by someone the promise's approver policy would
let settle now (then it acts for the minter), or by a gateway for an approver the
policy names (`acts_for`); a settle with it is checked against the policy as that
principal's (four-eyes and distinct quorums count principals, never tokens) and
recorded as `<principal> via settle-token <key>:<id>`. A token for a promise that
was pruned and created again is void.

The server has authentication on (a token file): the links are used with no
credential at all, as a mail's reader would.
"""

from __future__ import annotations

import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from _auth import Grant, bearer, write_token_file
from _pg import fresh_schema
from _streams import HandCalls
from _support import error_info, start_server
from google.protobuf.duration_pb2 import Duration

from troth.errors import Reason
from troth.v1 import promises_pb2, promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc, types_pb2
from troth_server.settle_keys import new_keys_file

if TYPE_CHECKING:
    from collections.abc import Iterator

    from _support import ServerProcess

HOUR = Duration(seconds=3600)
GROUP = "g-approvals"
Metadata = tuple[tuple[str, str], ...]


@dataclass
class Setup:
    server: ServerProcess
    channel: grpc.Channel
    md: dict[str, Metadata]

    @property
    def promises(self) -> promises_pb2_grpc.PromiseServiceStub:
        return promises_pb2_grpc.PromiseServiceStub(self.channel)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def setup(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Setup]:
    workdir = tmp_path_factory.mktemp("acts-for")
    (workdir / "settle-keys.json").write_text(new_keys_file(["k1"]))
    tokens = write_token_file(
        workdir / "tokens.toml",
        [
            Grant("alice", ("gateway",)),
            Grant("bob", ("gateway",)),
            Grant("carol", ("gateway",)),
            Grant("root", ("admin",)),
            Grant("worker-a", ("worker",), (GROUP,)),
            Grant("worker-gw", ("worker", "gateway"), (GROUP,)),
        ],
    )
    md = {name: bearer(token) for name, token in tokens.items()}
    md["anyone"] = ()
    with ExitStack() as stack:
        db_url = stack.enter_context(fresh_schema()) if request.param == "postgres" else None
        server = start_server(
            workdir,
            "--auth-tokens", str(workdir / "tokens.toml"),
            "--settle-token-keys", str(workdir / "settle-keys.json"),
            db_url=db_url,
        )  # fmt: skip
        try:
            with server.channel() as channel:
                yield Setup(server, channel, md)
        finally:
            assert server.stop() == 0, server.log()[-3000:]


def _id(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def _create(setup: Setup, promise_id: str, by: str = "alice", **fields: Any) -> types_pb2.Promise:
    request = promises_pb2.CreatePromiseRequest(id=promise_id, ttl=HOUR, **fields)
    return setup.promises.CreatePromise(request, metadata=setup.md[by], timeout=10).promise  # type: ignore[no-any-return]


def _mint(
    setup: Setup, promise_id: str, by: str, **fields: Any
) -> promises_pb2.MintSettleTokenResponse:
    request = promises_pb2.MintSettleTokenRequest(promise_id=promise_id, **fields)
    return setup.promises.MintSettleToken(request, metadata=setup.md[by], timeout=10)  # type: ignore[no-any-return]


def _resolve(
    setup: Setup, promise_id: str, by: str = "anyone", **fields: Any
) -> promises_pb2.ResolvePromiseResponse:
    request = promises_pb2.ResolvePromiseRequest(id=promise_id, **fields)
    return setup.promises.ResolvePromise(request, metadata=setup.md[by], timeout=10)  # type: ignore[no-any-return]


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


class Workflow:
    """A workflow started by `starter`, its task polled by hand by `worker-a`."""

    def __init__(self, setup: Setup, starter: str = "alice", worker: str = "worker-a") -> None:
        self.setup = setup
        self.id = _id("wf")
        self.worker = worker
        _create(
            setup,
            self.id,
            starter,
            param=types_pb2.Payload(data=b"[]"),
            tags={"troth:invoke": GROUP, "troth:func": "approve"},
        )
        self.channel = grpc.insecure_channel(setup.server.address)
        tasks = tasks_pb2_grpc.TaskServiceStub(self.channel)
        worker_id = _id(worker)
        self.stream = tasks.Poll(
            tasks_pb2.PollRequest(group=GROUP, worker_id=worker_id, capacity=8),
            metadata=setup.md[worker],
            timeout=60,
        )
        # Earlier tests' roots are in the same group: finish what is not ours.
        while (task := next(self.stream).task).root_promise_id != self.id:
            tasks.CompleteTask(
                tasks_pb2.CompleteTaskRequest(
                    task_id=task.id, counter=task.counter, worker_id=worker_id
                ),
                metadata=setup.md[worker],
                timeout=10,
            )
        self.fence = types_pb2.TaskFence(task_id=task.id, counter=task.counter, worker_id=worker_id)

    def step(self, n: int, **approvers: Any) -> types_pb2.Promise:
        return _create(
            self.setup,
            f"{self.id}.{n}",
            self.worker,
            fence=self.fence,
            approvers=types_pb2.Approvers(**approvers),
        )

    def close(self) -> None:
        self.stream.cancel()
        self.channel.close()


@pytest.fixture
def workflow(setup: Setup) -> Iterator[Workflow]:
    wf = Workflow(setup)
    yield wf
    wf.close()


# -- the approvers list ----------------------------------------------------------------


def test_a_non_approver_can_neither_mint_nor_settle_with_a_token(setup: Setup) -> None:
    ap1 = _create(setup, _id("ap1"), approvers=types_pb2.Approvers(principals=["bob"]))
    _not_an_approver(_refused(_resolve, setup, ap1.id, "carol"), "approvers")
    # A token would act for carol: minting it is refused as her settle is.
    _not_an_approver(_refused(_mint, setup, ap1.id, "carol"), "approvers")
    # Nor may a gateway mint one for somebody else the policy does not name.
    _not_an_approver(_refused(_mint, setup, ap1.id, "carol", acts_for="dave"), "approvers")
    # The same on the Calls stream (the SDK's road): her settle and her mint.
    calls = HandCalls(tasks_pb2_grpc.TaskServiceStub(setup.channel), setup.md["carol"])
    try:
        denied = (grpc.StatusCode.PERMISSION_DENIED, "NOT_AN_APPROVER")
        resolve = promises_pb2.ResolvePromiseRequest(id=ap1.id)
        assert calls.send("ResolvePromise", resolve) == denied
    finally:
        calls.close()
    got = setup.promises.GetPromise(
        promises_pb2.GetPromiseRequest(id=ap1.id), metadata=setup.md["alice"], timeout=10
    ).promise
    assert got.state == types_pb2.PROMISE_STATE_PENDING


def test_a_gateway_mints_a_link_for_a_named_approver_counted_as_theirs(setup: Setup) -> None:
    ap1 = _create(setup, _id("ap1"), approvers=types_pb2.Approvers(principals=["bob"]))
    minted = _mint(setup, ap1.id, "carol", acts_for="bob")
    assert minted.acts_for == "bob"
    settled = _resolve(setup, ap1.id, settle_token=minted.token)
    assert settled.applied
    assert settled.promise.settled_by == f"bob via settle-token k1:{minted.token_id}"


def test_an_approver_mints_for_itself(setup: Setup) -> None:
    ap1 = _create(setup, _id("ap1"), approvers=types_pb2.Approvers(principals=["bob"]))
    minted = _mint(setup, ap1.id, "bob")
    assert minted.acts_for == "bob"
    settled = _resolve(setup, ap1.id, settle_token=minted.token)
    assert settled.promise.settled_by == f"bob via settle-token k1:{minted.token_id}"


def test_a_policy_of_roles_admits_no_named_approver(setup: Setup) -> None:
    by_role = _create(setup, _id("p"), approvers=types_pb2.Approvers(roles=["gateway"]))
    # The server cannot know a named principal's roles: only a listed name admits one.
    code, reason, metadata = _refused(_mint, setup, by_role.id, "carol", acts_for="bob")
    assert (code, reason, metadata["rule"]) == (
        grpc.StatusCode.PERMISSION_DENIED,
        Reason.NOT_AN_APPROVER,
        "approvers",
    )
    # Its own roles admit the minter; the token carries them.
    minted = _mint(setup, by_role.id, "carol")
    assert _resolve(setup, by_role.id, settle_token=minted.token).promise.settled_by == (
        f"carol via settle-token k1:{minted.token_id}"
    )


def test_only_a_gateway_mints_for_another_principal(setup: Setup) -> None:
    open_promise = _create(setup, _id("p"))
    listed = _create(setup, _id("p"), approvers=types_pb2.Approvers(principals=["bob"]))
    # An administrator may do everything but stand in for an approver.
    for target in (open_promise.id, listed.id):
        code, reason, _ = _refused(_mint, setup, target, "root", acts_for="bob")
        assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, Reason.ROLE_NOT_ALLOWED)
    _not_an_approver(_refused(_mint, setup, listed.id, "root"), "approvers")
    # With no policy, a token acts for its minter.
    minted = _mint(setup, open_promise.id, "root")
    assert minted.acts_for == "root"
    assert _resolve(setup, open_promise.id, settle_token=minted.token).promise.settled_by == (
        f"root via settle-token k1:{minted.token_id}"
    )


def test_a_worker_mints_for_its_step_as_itself(setup: Setup, workflow: Workflow) -> None:
    step = workflow.step(0, principals=["bob"])
    _not_an_approver(_refused(_mint, setup, step.id, "worker-a", fence=workflow.fence), "approvers")
    code, reason, _ = _refused(
        _mint, setup, step.id, "worker-a", fence=workflow.fence, acts_for="bob"
    )
    assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, Reason.ROLE_NOT_ALLOWED)
    open_step = workflow.step(1)
    minted = _mint(setup, open_step.id, "worker-a", fence=workflow.fence)
    assert minted.acts_for == "worker-a"


def test_a_worker_that_is_a_gateway_mints_for_a_named_approver(setup: Setup) -> None:
    workflow = Workflow(setup, worker="worker-gw")
    try:
        step = workflow.step(0, principals=["bob"])
        minted = _mint(setup, step.id, "worker-gw", fence=workflow.fence, acts_for="bob")
        settled = _resolve(setup, step.id, settle_token=minted.token)
        assert settled.promise.settled_by == f"bob via settle-token k1:{minted.token_id}"
    finally:
        workflow.close()


# -- four-eyes -------------------------------------------------------------------------


def test_four_eyes_the_starter_gets_no_link_to_its_own_approval(
    setup: Setup, workflow: Workflow
) -> None:
    step = workflow.step(0, not_requester=True)
    _not_an_approver(_refused(_resolve, setup, step.id, "alice"), "not_requester")
    _not_an_approver(_refused(_mint, setup, step.id, "alice"), "not_requester")
    _not_an_approver(_refused(_mint, setup, step.id, "carol", acts_for="alice"), "not_requester")
    minted = _mint(setup, step.id, "carol", acts_for="bob")
    assert _resolve(setup, step.id, settle_token=minted.token).promise.settled_by.startswith(
        "bob via settle-token k1:"
    )


# -- distinct quorums ------------------------------------------------------------------


def test_a_distinct_quorum_counts_principals_never_tokens(setup: Setup, workflow: Workflow) -> None:
    steps = [workflow.step(n, distinct=True) for n in range(3)]
    # Minted while bob had approved nothing of the quorum: the mint is allowed...
    early_link = _mint(setup, steps[1].id, "bob")
    assert _resolve(setup, steps[0].id, "bob").applied
    # ...but the settle is bob's second approval of the quorum.
    _not_an_approver(
        _refused(_resolve, setup, steps[1].id, settle_token=early_link.token), "distinct"
    )
    # Now bob may not mint another, nor have one minted for him.
    _not_an_approver(_refused(_mint, setup, steps[1].id, "bob"), "distinct")
    _not_an_approver(_refused(_mint, setup, steps[1].id, "carol", acts_for="bob"), "distinct")
    # A link settle counts as its principal's: carol's link, then carol directly.
    carols = _mint(setup, steps[1].id, "alice", acts_for="carol")
    assert _resolve(setup, steps[1].id, settle_token=carols.token).applied
    _not_an_approver(_refused(_resolve, setup, steps[2].id, "carol"), "distinct")
    assert _resolve(setup, steps[2].id, "alice").applied


# -- a link outlives its promise -------------------------------------------------------


def test_a_token_is_void_for_a_promise_pruned_and_created_again(setup: Setup) -> None:
    st7 = _id("st7")
    _create(setup, st7)
    minted = _mint(setup, st7, "alice")
    assert _resolve(setup, st7, "bob").applied
    pruned = setup.promises.PrunePromises(
        promises_pb2.PrunePromisesRequest(older_than=Duration(seconds=0)),
        metadata=setup.md["root"],
        timeout=30,
    )
    assert pruned.pruned >= 1
    _create(setup, st7)
    code, reason, metadata = _refused(_resolve, setup, st7, settle_token=minted.token)
    assert (code, reason) == (
        grpc.StatusCode.PERMISSION_DENIED,
        Reason.SETTLE_TOKEN_PROMISE_REPLACED,
    )
    assert metadata["promise_id"] == st7
    # A new link for the new promise works.
    fresh = _mint(setup, st7, "alice")
    assert _resolve(setup, st7, settle_token=fresh.token).applied
