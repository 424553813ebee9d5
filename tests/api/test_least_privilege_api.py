"""Least privilege with authentication on (issue 26, items 5 and 7), on both stores.

One server per store with a token file: a gateway, two workers of two groups, a
principal that is both worker and gateway, an operator (and one scoped to
`acme-`), an admin. Shown here:

- a workflow's numbered step ids (`<id>.<n>`) are its own: nobody but the worker
  holding its task creates one, before the start or after, so a gateway cannot
  break `order-42` by creating `order-42.0` first;
- a worker reads and settles only the promises of workflows in its groups (and
  standalone promises it created itself);
- `SearchWorkers` shows a scoped operator neither workers' principals nor tasks;
- an `ALREADY_SETTLED` message never shows the winner's idempotency key.
"""

from __future__ import annotations

import uuid
from collections.abc import Generator
from contextlib import ExitStack
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from _auth import Grant, bearer, write_token_file
from _pg import fresh_schema
from _streams import HandCalls
from _support import error_info, eventually, start_server
from google.protobuf.duration_pb2 import Duration

from troth import Client, Context, Worker
from troth.errors import NotFoundError, Reason
from troth.v1 import promises_pb2, promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc, types_pb2

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from _support import ServerProcess

HOUR = Duration(seconds=3600)
GROUP_A, GROUP_B = "g-least-a", "g-least-b"
GRANTS = [
    Grant("gateway", ("gateway",)),
    Grant("worker-a", ("worker",), groups=(GROUP_A,)),
    Grant("worker-b", ("worker",), groups=(GROUP_B,)),
    Grant("worker-gateway", ("worker", "gateway"), groups=(GROUP_B,)),
    Grant("ops", ("operator",)),
    Grant("acme-ops", ("operator",), prefixes=("acme-",)),
    Grant("admin", ("admin",)),
]
Refusal = tuple[grpc.StatusCode, str, dict[str, str]]


class Site:
    """The server, and raw calls made as one principal or another."""

    def __init__(self, server: ServerProcess, channel: grpc.Channel, tokens: dict[str, str]):
        self.server = server
        self.tokens = tokens
        self.promises = promises_pb2_grpc.PromiseServiceStub(channel)
        self.tasks = tasks_pb2_grpc.TaskServiceStub(channel)

    def md(self, who: str) -> tuple[tuple[str, str], ...]:
        return bearer(self.tokens[who])

    def client(self, who: str) -> Client:
        return Client(self.server.address, timeout=10, token=self.tokens[who])

    def create(self, who: str, promise_id: str, **fields: Any) -> types_pb2.Promise:
        request = promises_pb2.CreatePromiseRequest(id=promise_id, ttl=HOUR, **fields)
        return self.promises.CreatePromise(request, metadata=self.md(who), timeout=10).promise  # type: ignore[no-any-return]

    def get(self, who: str, promise_id: str) -> types_pb2.Promise:
        request = promises_pb2.GetPromiseRequest(id=promise_id)
        return self.promises.GetPromise(request, metadata=self.md(who), timeout=10).promise  # type: ignore[no-any-return]

    def resolve(self, who: str, promise_id: str, **fields: Any) -> Any:
        request = promises_pb2.ResolvePromiseRequest(id=promise_id, **fields)
        return self.promises.ResolvePromise(request, metadata=self.md(who), timeout=10)

    def start(self, who: str, workflow_id: str, group: str) -> types_pb2.Promise:
        tags = {"troth:invoke": group, "troth:func": "f"}
        return self.create(who, workflow_id, tags=tags, param=types_pb2.Payload(data=b"[]"))


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def site(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Site]:
    workdir = tmp_path_factory.mktemp("least")
    tokens = write_token_file(workdir / "tokens.toml", GRANTS)
    with ExitStack() as stack:
        db_url = stack.enter_context(fresh_schema()) if request.param == "postgres" else None
        server = start_server(workdir, "--auth-tokens", str(workdir / "tokens.toml"), db_url=db_url)
        try:
            with server.channel() as channel:
                yield Site(server, channel, tokens)
        finally:
            assert server.stop() == 0, server.log()[-3000:]


def _id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def _refused(call: Callable[[], object]) -> Refusal:
    with pytest.raises(grpc.RpcError) as info:
        call()
    detail = error_info(info.value)
    return info.value.code(), detail.reason, dict(detail.metadata)  # type: ignore[attr-defined]


# -- item 5: a workflow's numbered step ids are its own --------------------------------


def _charge(order: str) -> str:
    return f"charged {order}"


def order(ctx: Context, order_id: str) -> Generator[Any, Any, dict[str, Any]]:
    receipt = yield ctx.run(_charge, order_id)
    approval = yield ctx.promise(title=f"ship {order_id}?")
    return {"receipt": receipt, "approval": (yield approval)}


def test_an_id_of_a_step_taken_in_advance_cannot_break_the_workflow(site: Site) -> None:
    wid = _id("order-")
    step, approval = f"{wid}.0", f"{wid}.1"
    denied = (grpc.StatusCode.PERMISSION_DENIED, Reason.RESERVED_FOR_WORKFLOW.value)
    attempts: dict[str, Callable[[], object]] = {
        "a create": lambda: site.create("gateway", step),
        "a create already settled": lambda: site.create(
            "gateway", step, resolved_with=types_pb2.Payload(data=b'"forged"')
        ),
        "an early settle": lambda: site.resolve("gateway", step, create_if_missing=True),
        "a start": lambda: site.start("gateway", step, GROUP_A),
        "a worker's create": lambda: site.create("worker-a", step),
        "an admin's create": lambda: site.create("admin", approval),
    }
    for what, attempt in attempts.items():
        code, reason, metadata = _refused(attempt)
        assert (code, reason) == denied, what
        assert metadata["promise_id"] in (step, approval), what
    with pytest.raises(grpc.RpcError) as again:
        site.create("gateway", step)
    assert "choose another id" in again.value.details()  # type: ignore[attr-defined]

    with site.client("worker-a") as worker_client, site.client("gateway") as gateway:
        worker = Worker(worker_client, group=GROUP_A, lease=timedelta(seconds=5))
        worker.workflow(order)
        worker.start()
        try:
            handle = gateway.start("order", wid, id=wid, group=GROUP_A)
            # After the start too: the approval it will create is its own.
            assert _refused(lambda: site.create("gateway", approval))[:2] == denied
            eventually(lambda: _pending(gateway, approval), what="the approval")
            assert gateway.resolve(approval, "yes").applied  # a human settles the latent step
            assert handle.result(timeout=30) == {"receipt": f"charged {wid}", "approval": "yes"}
        finally:
            worker.stop()
    assert site.get("gateway", step).parent_id == wid
    assert site.get("gateway", approval).parent_id == wid


def _pending(client: Client, promise_id: str) -> bool:
    try:
        return client.get(promise_id).state == "PENDING"
    except NotFoundError:  # not created yet
        return False


# -- item 7: idempotency keys only to their owner --------------------------------------


def test_an_already_settled_message_shows_the_winners_key_to_nobody(site: Site) -> None:
    promise_id = site.create("gateway", _id("keys-")).id
    site.resolve("gateway", promise_id, idempotency_key="the-winners-key")
    for who in ("worker-gateway", "admin"):
        with pytest.raises(grpc.RpcError) as lost:
            site.resolve(who, promise_id, idempotency_key="another-key")
        assert error_info(lost.value).reason == Reason.ALREADY_SETTLED
        details = lost.value.details()  # type: ignore[attr-defined]
        assert "the-winners-key" not in details and "the-winners-key" not in str(
            error_info(lost.value)
        )
        assert "by 'gateway'" in details and "with another idempotency key" in details
    # The winner's own strict repeat asking another state: its own key, not named either.
    with pytest.raises(grpc.RpcError) as strict:
        site.promises.RejectPromise(
            promises_pb2.RejectPromiseRequest(
                id=promise_id, idempotency_key="the-winners-key", strict=True
            ),
            metadata=site.md("gateway"),
            timeout=10,
        )
    assert "with this settle's idempotency key" in strict.value.details()  # type: ignore[attr-defined]
    # GetPromise shows it to its writer and admins only, as before.
    assert site.get("gateway", promise_id).idempotency_key_for_settle == "the-winners-key"
    assert site.get("ops", promise_id).idempotency_key_for_settle == ""


# -- item 7: a worker reads and settles only its groups' workflows ----------------------


class Held:
    """A workflow of `group` started by the gateway, its task polled by hand by `worker`
    (a raw Poll stream), to write steps with its fence."""

    def __init__(self, site: Site, group: str = GROUP_A, worker: str = "worker-a") -> None:
        self.site = site
        self.worker = worker
        self.id = _id("wf-")
        self.worker_id = _id("w-")
        site.start("gateway", self.id, group)
        self.stream = site.tasks.Poll(
            tasks_pb2.PollRequest(group=group, worker_id=self.worker_id, capacity=8),
            metadata=site.md(worker),
        )
        delivery = next(self.stream)
        while delivery.task.root_promise_id != self.id:  # an earlier test's leftover
            delivery = next(self.stream)
        self.task = delivery.task

    @property
    def fence(self) -> types_pb2.TaskFence:
        return types_pb2.TaskFence(
            task_id=self.task.id, counter=self.task.counter, worker_id=self.worker_id
        )

    def step(self, n: int, kind: str = "promise", **fields: Any) -> types_pb2.Promise:
        tags = {"troth:kind": kind}
        return self.site.create(
            self.worker, f"{self.id}.{n}", tags=tags, fence=self.fence, **fields
        )

    def close(self) -> None:
        self.stream.cancel()


@pytest.fixture
def held(site: Site) -> Iterator[Held]:
    workflow = Held(site)
    yield workflow
    workflow.close()


def _reads(site: Site, who: str, promise_id: str) -> dict[str, Callable[[], object]]:
    md = site.md(who)
    return {
        "GetPromise": lambda: site.get(who, promise_id),
        "WaitPromise": lambda: site.promises.WaitPromise(
            promises_pb2.WaitPromiseRequest(id=promise_id, wait=Duration(seconds=5)),
            metadata=md,
            timeout=10,
        ),
        "WatchPromise": lambda: next(
            site.promises.WatchPromise(
                promises_pb2.WatchPromiseRequest(id=promise_id), metadata=md, timeout=10
            )
        ),
        "ResolvePromise": lambda: site.resolve(who, promise_id),
        "RejectPromise": lambda: site.promises.RejectPromise(
            promises_pb2.RejectPromiseRequest(id=promise_id), metadata=md, timeout=10
        ),
    }


def test_a_worker_of_another_group_neither_reads_nor_settles_a_workflows_promises(
    site: Site, held: Held
) -> None:
    """worker-b (group b) and a latent approval of a group-a workflow with no policy:
    it used to resolve it, and to read any promise's param (issue 26)."""
    approval = held.step(0, param=types_pb2.Payload(data=b'"the param"'))
    standalone = site.create("gateway", _id("loose-"), param=types_pb2.Payload(data=b"1")).id
    for promise_id, why in (
        (approval.id, f"it belongs to a workflow of the group {GROUP_A}"),
        (held.id, f"it belongs to a workflow of the group {GROUP_A}"),
        (standalone, "it belongs to no workflow"),
    ):
        for rpc, attempt in _reads(site, "worker-b", promise_id).items():
            code, reason, metadata = _refused(attempt)
            assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "GROUP_NOT_ALLOWED"), (
                rpc,
                promise_id,
            )
            assert (metadata["principal"], metadata["promise_id"]) == ("worker-b", promise_id)
        with pytest.raises(grpc.RpcError) as refused:
            site.get("worker-b", promise_id)
        details = refused.value.details()  # type: ignore[attr-defined]
        assert f"may not read promise {promise_id!r}: {why}" in details
    # The same rule on the Calls stream, the road the SDK's client and worker take.
    calls = HandCalls(site.tasks, site.md("worker-b"))
    try:
        denied = (grpc.StatusCode.PERMISSION_DENIED, "GROUP_NOT_ALLOWED")
        assert calls.send("GetPromise", promises_pb2.GetPromiseRequest(id=approval.id)) == denied
        resolve = promises_pb2.ResolvePromiseRequest(id=approval.id)
        assert calls.send("ResolvePromise", resolve) == denied
    finally:
        calls.close()
    # Nothing was settled; the group's own worker and a gateway still reach them.
    assert site.get("gateway", approval.id).state == types_pb2.PROMISE_STATE_PENDING
    assert site.get("worker-a", approval.id).param.data == b'"the param"'
    assert site.get("worker-a", held.id).id == held.id
    assert site.resolve("worker-a", approval.id).applied  # unfenced, a latent step
    # A principal that is also a gateway keeps a gateway's reach.
    assert site.get("worker-gateway", standalone).id == standalone
    # A missing promise is NOT_FOUND, as for anyone: no early settle by a worker.
    missing = _id("missing-")
    assert _refused(lambda: site.get("worker-b", missing))[0] == grpc.StatusCode.NOT_FOUND
    assert _refused(lambda: site.resolve("worker-b", missing))[0] == grpc.StatusCode.NOT_FOUND
    code, reason, _ = _refused(lambda: site.resolve("worker-b", missing, create_if_missing=True))
    assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "GROUP_NOT_ALLOWED")


def test_a_worker_starts_workflows_only_in_its_groups_and_reaches_what_it_created(
    site: Site,
) -> None:
    code, reason, metadata = _refused(lambda: site.start("worker-b", _id("wf-"), GROUP_A))
    assert (code, reason, metadata["groups"]) == (
        grpc.StatusCode.PERMISSION_DENIED,
        "GROUP_NOT_ALLOWED",
        GROUP_A,
    )
    ours = site.start("worker-b", _id("wf-"), GROUP_B).id  # its own group: allowed
    assert site.get("worker-b", ours).id == ours
    mine = site.create("worker-b", _id("note-"), param=types_pb2.Payload(data=b"1")).id
    assert site.get("worker-b", mine).param.data == b"1"
    assert site.resolve("worker-b", mine).applied
    # Another worker's standalone promise is not its, even by repeating its create.
    assert _refused(lambda: site.get("worker-a", mine))[1] == "GROUP_NOT_ALLOWED"
    theirs = site.create("gateway", _id("note-")).id
    assert _refused(lambda: site.create("worker-b", theirs))[1] == "GROUP_NOT_ALLOWED"
    # Nor by repeating it and waiting for its settle: refused before the wait (a refusal
    # after a 30 s wait would come past the call's 10 s deadline).
    wait = Duration(seconds=30)
    refused = _refused(lambda: site.create("worker-b", theirs, wait=wait))
    assert refused[:2] == (grpc.StatusCode.PERMISSION_DENIED, "GROUP_NOT_ALLOWED")
    assert site.get("gateway", theirs).state == types_pb2.PROMISE_STATE_PENDING
    # Its own, created and waited for in one call, it reaches.
    waited = site.create("worker-b", _id("note-"), wait=Duration(seconds=0))
    assert waited.state == types_pb2.PROMISE_STATE_PENDING
    # The same on the Calls stream, the road the SDK's client takes.
    calls = HandCalls(site.tasks, site.md("worker-b"))
    try:
        create = promises_pb2.CreatePromiseRequest(id=theirs, wait=wait)
        assert calls.send("CreatePromise", create) == (
            grpc.StatusCode.PERMISSION_DENIED,
            "GROUP_NOT_ALLOWED",
        )
        own = promises_pb2.CreatePromiseRequest(id=_id("note-"), wait=Duration(seconds=0))
        assert calls.send("CreatePromise", own) == (grpc.StatusCode.OK, "")
    finally:
        calls.close()
    assert site.get("gateway", theirs).state == types_pb2.PROMISE_STATE_PENDING


def test_a_worker_is_answered_only_the_awaited_promises_of_its_groups(
    site: Site, held: Held
) -> None:
    own = held.step(0)
    site.resolve("gateway", own.id)
    foreign = site.create("gateway", _id("loose-")).id
    site.resolve("gateway", foreign, value=types_pb2.Payload(data=b'"secret"'))

    def register(promise_id: str) -> tasks_pb2.RegisterCallbacksResponse:
        return site.tasks.RegisterCallbacks(  # type: ignore[no-any-return]
            tasks_pb2.RegisterCallbacksRequest(
                task_id=held.task.id,
                counter=held.task.counter,
                worker_id=held.worker_id,
                promise_ids=[promise_id],
            ),
            metadata=site.md("worker-a"),
            timeout=10,
        )

    assert [p.id for p in register(own.id).settled] == [own.id]
    assert _refused(lambda: register(foreign))[1] == "GROUP_NOT_ALLOWED"


def test_an_sdk_worker_runs_its_workflows_within_its_reach(site: Site) -> None:
    """The worker's own calls (its steps, its root, a wait it names, a child in another
    group) stay within its groups: a whole run with named and numbered steps."""
    wid = _id("order-")
    with (
        site.client("worker-a") as worker_client,
        site.client("worker-b") as other_client,
        site.client("gateway") as gateway,
    ):
        worker = Worker(worker_client, group=GROUP_A, lease=timedelta(seconds=5))
        worker.workflow(order)
        worker.workflow(named_wait)
        worker.workflow(parent)
        other = Worker(other_client, group=GROUP_B, lease=timedelta(seconds=5))
        other.workflow(child)
        worker.start()
        other.start()
        try:
            first = gateway.start("order", wid, id=wid, group=GROUP_A)
            eventually(lambda: _pending(gateway, f"{wid}.1"), what="the approval")
            gateway.resolve(f"{wid}.1", "yes")
            assert first.result(timeout=30)["approval"] == "yes"
            named = _id("named-")
            gateway.resolve(f"approval-{named}", "early", create_if_missing=True)
            assert gateway.start("named_wait", named, id=named, group=GROUP_A).result(
                timeout=30
            ) == ["early", f"charged {named}"]
            kin = _id("parent-")
            assert gateway.start("parent", id=kin, group=GROUP_A).result(timeout=30) == (
                f"child of {kin} in {GROUP_B}"
            )
        finally:
            worker.stop()
            other.stop()


def named_wait(ctx: Context, name: str) -> Generator[Any, Any, tuple[Any, str]]:
    decision = yield (yield ctx.promise(id=f"approval-{name}"))
    receipt = yield ctx.run(_charge, name, id=f"{ctx.id}.charge")
    return decision, receipt


def parent(ctx: Context) -> Generator[Any, Any, Any]:
    return (yield ctx.rpc("child", ctx.id, group=GROUP_B))


def child(ctx: Context, parent_id: str) -> Generator[Any, Any, str]:
    yield ctx.sleep(0.01)
    return f"child of {parent_id} in {GROUP_B}"


# -- item 7: SearchWorkers honours prefixes ----------------------------------------------


def test_a_scoped_operator_sees_workers_without_their_principals_or_tasks(
    site: Site, held: Held
) -> None:
    def listed(who: str) -> list[tasks_pb2.Worker]:
        found = site.tasks.SearchWorkers(
            tasks_pb2.SearchWorkersRequest(group=GROUP_A), metadata=site.md(who), timeout=10
        )
        return [w for w in found.workers if w.worker_id == held.worker_id]

    (full,) = listed("ops")
    assert (full.principal, list(full.task_ids)) == ("worker-a", [held.task.id])
    (scoped,) = listed("acme-ops")
    assert (scoped.principal, list(scoped.task_ids)) == ("", [])
    assert (scoped.group, scoped.capacity, scoped.streams) == (GROUP_A, 8, 1)
    page = site.tasks.SearchWorkers(
        tasks_pb2.SearchWorkersRequest(page_size=1), metadata=site.md("acme-ops"), timeout=10
    )
    assert "worker-a" not in page.next_page_token and all(not w.principal for w in page.workers)


# -- issue 31: a workflow's state slots ------------------------------------------------


def test_who_reads_and_who_rewrites_a_workflows_state(site: Site) -> None:
    """Reading a slot needs what reading the workflow needs (a worker: its groups'
    workflows only; a scoped operator: inside its prefixes); rewriting it is an
    operator's or an admin's, never a gateway's or a worker's."""
    wid = _id("acme-chat-")
    site.start("gateway", wid, GROUP_A)

    def get(who: str) -> tasks_pb2.GetWorkflowStateResponse:
        request = tasks_pb2.GetWorkflowStateRequest(workflow_id=wid, name="thread")
        return site.tasks.GetWorkflowState(request, metadata=site.md(who), timeout=10)

    def replace(who: str, expected: int) -> tasks_pb2.ReplaceWorkflowStateResponse:
        request = tasks_pb2.ReplaceWorkflowStateRequest(
            workflow_id=wid,
            name="thread",
            value=types_pb2.Payload(data=b"[]"),
            expected_version=expected,
        )
        return site.tasks.ReplaceWorkflowState(request, metadata=site.md(who), timeout=10)

    for reader in ("gateway", "worker-a", "ops", "acme-ops", "admin"):
        assert get(reader).state.version == 0, reader
    assert _refused(lambda: get("worker-b"))[0] == grpc.StatusCode.PERMISSION_DENIED
    for writer in ("gateway", "worker-a"):
        code, reason, _ = _refused(lambda: replace(writer, 0))  # noqa: B023
        assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "ROLE_NOT_ALLOWED"), writer
    won = replace("acme-ops", 0)
    assert won.won and won.state.version == 1 and won.state.updated_by == "acme-ops"
    lost = replace("admin", 0)
    assert not lost.won and lost.lost_to == tasks_pb2.STATE_LOST_TO_VERSION_CHANGED
    assert "written by acme-ops" in lost.message
    other = _id("other-")
    site.start("gateway", other, GROUP_A)
    outside = tasks_pb2.GetWorkflowStateRequest(workflow_id=other, name="thread")
    code, reason, _ = _refused(
        lambda: site.tasks.GetWorkflowState(outside, metadata=site.md("acme-ops"), timeout=10)
    )
    assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "OUTSIDE_PREFIXES")
