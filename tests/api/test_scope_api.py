"""What each principal may see and touch, with authentication on (issue 11 part 2).

One server per store with a token file: a tenant gateway scoped to `acme-`, two
unscoped gateways, an operator (and one scoped to `acme-`), an admin, a worker
of the group `g-scope`, a worker of another group and a worker scoped to
`acme-`. Shown here, each allowed and refused:

- id-prefix scoping: every call naming an id outside the prefixes is
  PERMISSION_DENIED `OUTSIDE_PREFIXES` (the same whether the promise exists or
  not); searches and watches return only ids inside, narrowed in the query
  (a page is full of inside ids however many outside ones match); a scoped
  worker may not Poll;
- idempotency keys only for their writer and admins;
- a settle-token step's value only for the workflow's workers and admins;
- a settle before the promise exists (`create_if_missing`) checked against the
  approver policy of the create that adopts it.
"""

from __future__ import annotations

import uuid
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from _auth import Grant, bearer, write_token_file
from _pg import fresh_schema
from _streams import HandCalls, details_info
from _support import error_info, eventually, start_server
from google.protobuf.duration_pb2 import Duration

from troth.errors import Reason
from troth.v1 import promises_pb2, promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc, types_pb2
from troth_server.settle_keys import new_keys_file

if TYPE_CHECKING:
    from collections.abc import Iterator

    from _support import ServerProcess

HOUR = Duration(seconds=3600)
GROUP = "g-scope"
GRANTS = [
    Grant("tenant", ("gateway",), prefixes=("acme-",)),
    # Refused once only, by the audit test: `auth.refused` lines are rate-limited per
    # principal, and `tenant` is refused over and over by the others.
    Grant("audited", ("gateway",), prefixes=("acme-",)),
    Grant("gateway", ("gateway",)),
    Grant("gateway-2", ("gateway",)),
    Grant("ops", ("operator",)),
    Grant("acme-ops", ("operator",), prefixes=("acme-",)),
    Grant("admin", ("admin",)),
    Grant("worker", ("worker",), groups=(GROUP,)),
    Grant("worker-other", ("worker",), groups=("g-other",)),
    Grant("acme-worker", ("worker",), groups=(GROUP,), prefixes=("acme-",)),
]


class Calls:
    """Raw calls made as one principal or another."""

    def __init__(self, server: ServerProcess, channel: grpc.Channel, tokens: dict[str, str]):
        self.server = server
        self.channel = channel
        self.tokens = tokens
        self.promises = promises_pb2_grpc.PromiseServiceStub(channel)
        self.tasks = tasks_pb2_grpc.TaskServiceStub(channel)

    def md(self, who: str) -> tuple[tuple[str, str], ...]:
        return bearer(self.tokens[who])

    def create(
        self, who: str, promise_id: str, **fields: Any
    ) -> promises_pb2.CreatePromiseResponse:
        request = promises_pb2.CreatePromiseRequest(id=promise_id, ttl=HOUR, **fields)
        return self.promises.CreatePromise(request, metadata=self.md(who), timeout=10)  # type: ignore[no-any-return]

    def get(self, who: str, promise_id: str) -> types_pb2.Promise:
        request = promises_pb2.GetPromiseRequest(id=promise_id)
        return self.promises.GetPromise(request, metadata=self.md(who), timeout=10).promise  # type: ignore[no-any-return]

    def resolve(
        self, who: str, promise_id: str, **fields: Any
    ) -> promises_pb2.SettlePromiseResponse:
        request = promises_pb2.ResolvePromiseRequest(id=promise_id, **fields)
        return self.promises.ResolvePromise(request, metadata=self.md(who), timeout=10)  # type: ignore[no-any-return]

    def search(self, who: str, glob: str = "", **fields: Any) -> list[types_pb2.Promise]:
        request = promises_pb2.SearchPromisesRequest(id=glob, **fields)
        found = self.promises.SearchPromises(request, metadata=self.md(who), timeout=10)
        return list(found.promises)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def calls(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Calls]:
    workdir = tmp_path_factory.mktemp("scope")
    tokens = write_token_file(workdir / "tokens.toml", GRANTS)
    (workdir / "settle-keys.json").write_text(new_keys_file(["k1"]))
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
                yield Calls(server, channel, tokens)
        finally:
            assert server.stop() == 0, server.log()[-3000:]


def _id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def _refused(call: Any) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    detail = error_info(info.value)
    return info.value.code(), detail.reason, dict(detail.metadata)


# -- prefix scoping: single ids ------------------------------------------------------


def test_a_scoped_gateway_touches_only_ids_inside_its_prefixes(calls: Calls) -> None:
    inside = calls.create("tenant", _id("acme-"), idempotency_key="c1").promise
    assert calls.get("tenant", inside.id).id == inside.id
    assert calls.resolve("tenant", inside.id).applied
    outside_existing = calls.create("gateway", _id("globex-")).promise.id
    outside_missing = _id("globex-")
    p = calls.promises
    md = calls.md("tenant")

    def attempts(target: str) -> dict[str, Any]:
        return {
            "CreatePromise": lambda: p.CreatePromise(
                promises_pb2.CreatePromiseRequest(id=target), metadata=md, timeout=10
            ),
            "GetPromise": lambda: calls.get("tenant", target),
            "ResolvePromise": lambda: calls.resolve("tenant", target),
            "RejectPromise": lambda: p.RejectPromise(
                promises_pb2.RejectPromiseRequest(id=target), metadata=md, timeout=10
            ),
            "ResolvePromise early": lambda: calls.resolve("tenant", target, create_if_missing=True),
            "MintSettleToken": lambda: p.MintSettleToken(
                promises_pb2.MintSettleTokenRequest(promise_id=target), metadata=md, timeout=10
            ),
            "WatchPromise": lambda: next(
                p.WatchPromise(promises_pb2.WatchPromiseRequest(id=target), metadata=md, timeout=10)
            ),
            "WaitPromise": lambda: p.WaitPromise(
                promises_pb2.WaitPromiseRequest(id=target), metadata=md, timeout=10
            ),
            "CreatePromise and wait": lambda: p.CreatePromise(
                promises_pb2.CreatePromiseRequest(id=target, wait=Duration(seconds=30)),
                metadata=md,
                timeout=10,
            ),
        }

    for target in (outside_existing, outside_missing):
        for name, attempt in attempts(target).items():
            code, reason, metadata = _refused(attempt)
            # The same answer whether the promise exists or not: nothing is revealed.
            assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, Reason.OUTSIDE_PREFIXES), (
                name
            )
            assert metadata["prefixes"] == "'acme-'", name
            assert metadata["promise_id"] == target, name
    # The refused writes changed nothing; an unscoped gateway still reads it pending.
    assert calls.get("gateway", outside_existing).state == types_pb2.PROMISE_STATE_PENDING
    with pytest.raises(grpc.RpcError) as missing:
        calls.get("gateway", outside_missing)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_scoped_gateway_touches_only_ids_inside_its_prefixes_on_the_calls_stream(
    calls: Calls,
) -> None:
    """The same refusals, with the same metadata, for each call on a `Calls` stream (the
    road the SDK's `Client` takes), a create that waits among them; the stream stays
    open and serves the calls inside the prefixes."""
    outside_existing = calls.create("gateway", _id("globex-")).promise.id
    outside_missing = _id("globex-")
    stream = HandCalls(calls.tasks, calls.md("tenant"))
    try:
        for target in (outside_existing, outside_missing):
            attempts = {
                "CreatePromise": promises_pb2.CreatePromiseRequest(id=target),
                "CreatePromise and wait": promises_pb2.CreatePromiseRequest(
                    id=target, wait=Duration(seconds=30)
                ),
                "GetPromise": promises_pb2.GetPromiseRequest(id=target),
                "ResolvePromise": promises_pb2.ResolvePromiseRequest(id=target),
                "ResolvePromise early": promises_pb2.ResolvePromiseRequest(
                    id=target, create_if_missing=True
                ),
                "RejectPromise": promises_pb2.RejectPromiseRequest(id=target),
                "WaitPromise": promises_pb2.WaitPromiseRequest(id=target),
            }
            for name, request in attempts.items():
                method = name.split()[0]
                answer = stream.ask(method, request)
                code = next(c for c in grpc.StatusCode if c.value[0] == answer.code)
                info = details_info(answer.status_details)
                assert info is not None, (name, answer)
                assert (code, info.reason) == (
                    grpc.StatusCode.PERMISSION_DENIED,
                    Reason.OUTSIDE_PREFIXES,
                ), name
                assert info.metadata["prefixes"] == "'acme-'", name
                assert info.metadata["promise_id"] == target, name
        inside = _id("acme-")
        created = stream.ask("CreatePromise", promises_pb2.CreatePromiseRequest(id=inside))
        assert created.code == 0, created
    finally:
        stream.close()
    assert calls.get("gateway", outside_existing).state == types_pb2.PROMISE_STATE_PENDING
    with pytest.raises(grpc.RpcError) as missing:
        calls.get("gateway", outside_missing)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert calls.get("tenant", inside).id == inside


def test_a_scoped_operator_cancels_only_inside(calls: Calls) -> None:
    inside = calls.create("gateway", _id("acme-")).promise.id
    outside = calls.create("gateway", _id("globex-")).promise.id
    md = calls.md("acme-ops")
    code, reason, _ = _refused(
        lambda: calls.promises.CancelPromise(
            promises_pb2.CancelPromiseRequest(id=outside), metadata=md, timeout=10
        )
    )
    assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, Reason.OUTSIDE_PREFIXES)
    done = calls.promises.CancelPromise(
        promises_pb2.CancelPromiseRequest(id=inside), metadata=md, timeout=10
    )
    assert done.promise.state == types_pb2.PROMISE_STATE_REJECTED_CANCELED


def test_a_refusal_is_audited_once(calls: Calls) -> None:
    target = _id("globex-")
    _refused(lambda: calls.get("audited", target))
    eventually(
        lambda: any(
            "auth.refused" in line and "OUTSIDE_PREFIXES" in line and target in line
            for line in calls.server.log().splitlines()
        ),
        what="an auth.refused line for the refused read",
    )


# -- prefix scoping: searches and watches --------------------------------------------


def test_searches_return_only_ids_inside_narrowed_in_the_query(calls: Calls) -> None:
    run = uuid.uuid4().hex[:8]
    tags = {"run": run}
    # Outside ones first: a filter after the query would fill the page with them.
    outside = [calls.create("gateway", f"globex-{run}-{i}", tags=tags).promise.id for i in range(4)]
    inside = [calls.create("gateway", f"acme-{run}-{i}", tags=tags).promise.id for i in range(2)]
    assert {p.id for p in calls.search("gateway", f"*{run}*")} == {*outside, *inside}
    # A `*` search is narrowed to the prefixes, in the query: one page of 2 has both.
    page = calls.search("tenant", "*", tags=tags, page_size=2)
    assert [p.id for p in page] == inside
    assert [p.id for p in calls.search("tenant", f"*{run}-1")] == [inside[1]]
    assert all(p.id.startswith("acme-") for p in calls.search("tenant"))
    # A glob outside every prefix matches nothing, whatever exists.
    assert calls.search("tenant", f"globex-{run}-*") == []
    assert calls.search("tenant", outside[0]) == []
    # A glob inside is answered as it is.
    assert [p.id for p in calls.search("tenant", f"acme-{run}-*")] == inside
    assert len(calls.search("acme-ops", "*", tags=tags)) == 2
    assert len(calls.search("admin", "*", tags=tags)) == 6


def test_watch_promises_hears_only_ids_inside(calls: Calls) -> None:
    run = uuid.uuid4().hex[:8]
    md = calls.md("tenant")
    stream = calls.promises.WatchPromises(
        promises_pb2.WatchPromisesRequest(id="*", tags={"run": run}), metadata=md, timeout=20
    )
    stream.initial_metadata()  # subscribed
    try:
        calls.create("gateway", f"globex-{run}", tags={"run": run})
        inside = calls.create("gateway", f"acme-{run}", tags={"run": run}).promise.id
        first = next(stream)
        assert (first.type, first.promise.id) == (promises_pb2.PROMISE_EVENT_TYPE_CREATED, inside)
    finally:
        stream.cancel()
    # Outside every prefix: the stream ends at once, with nothing.
    outside = calls.promises.WatchPromises(
        promises_pb2.WatchPromisesRequest(id="globex-*"), metadata=md, timeout=10
    )
    assert list(outside) == []


def test_a_scoped_worker_may_not_poll(calls: Calls) -> None:
    stream = calls.tasks.Poll(
        tasks_pb2.PollRequest(group=GROUP, worker_id="w-acme", capacity=1),
        metadata=calls.md("acme-worker"),
        timeout=10,
    )
    code, reason, metadata = _refused(lambda: next(stream))
    assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, Reason.OUTSIDE_PREFIXES)
    assert metadata["principal"] == "acme-worker"


# -- idempotency keys ----------------------------------------------------------------


def test_idempotency_keys_go_only_to_their_writer_and_admins(calls: Calls) -> None:
    promise_id = _id("keys-")
    created = calls.create("gateway", promise_id, idempotency_key="create-key")
    assert created.promise.idempotency_key_for_create == "create-key"  # the writer's answer
    settled = calls.resolve("gateway-2", promise_id, idempotency_key="settle-key")
    # The settler's answer: its own key, not the creator's.
    assert settled.promise.idempotency_key_for_settle == "settle-key"
    assert settled.promise.idempotency_key_for_create == ""
    # A repeat of the settle is recognised by its key, and answered with it.
    again = calls.resolve("gateway-2", promise_id, idempotency_key="settle-key")
    assert (again.applied, again.promise.idempotency_key_for_settle) == (False, "settle-key")
    seen = {
        who: (p.idempotency_key_for_create, p.idempotency_key_for_settle)
        for who in ("gateway", "gateway-2", "ops", "admin")
        for p in [calls.get(who, promise_id)]
    }
    assert seen == {
        "gateway": ("create-key", ""),
        "gateway-2": ("", "settle-key"),
        "ops": ("", ""),
        "admin": ("create-key", "settle-key"),
    }
    # A worker does not read a promise of no workflow at all (issue 26).
    assert _refused(lambda: calls.get("worker", promise_id))[1] == Reason.GROUP_NOT_ALLOWED
    by_search = {
        who: [(p.idempotency_key_for_create, p.idempotency_key_for_settle) for p in found]
        for who in ("gateway", "ops", "admin")
        for found in [calls.search(who, promise_id)]
    }
    assert by_search == {
        "gateway": [("create-key", "")],
        "ops": [("", "")],
        "admin": [("create-key", "settle-key")],
    }
    # A watch shows what a read shows.
    watch = calls.promises.WatchPromise(
        promises_pb2.WatchPromiseRequest(id=promise_id), metadata=calls.md("gateway-2"), timeout=10
    )
    try:
        watched = next(watch).promise
    finally:
        watch.cancel()
    assert (watched.idempotency_key_for_create, watched.idempotency_key_for_settle) == (
        "",
        "settle-key",
    )


def test_a_different_key_is_refused_without_learning_the_winners(calls: Calls) -> None:
    promise_id = calls.create("gateway", _id("keys-")).promise.id
    calls.resolve("gateway", promise_id, idempotency_key="winner")
    code, reason, _ = _refused(lambda: calls.resolve("gateway-2", promise_id, idempotency_key="x"))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, Reason.ALREADY_SETTLED)
    assert calls.get("gateway-2", promise_id).idempotency_key_for_settle == ""


# -- a workflow's steps --------------------------------------------------------------


class Workflow:
    """A workflow started by `gateway`, its task held by `worker` to write steps by hand."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.id = _id("wf-")
        self.worker_id = _id("w-")  # a worker with a free slot: one task each
        tags = {"troth:invoke": GROUP, "troth:func": "f"}
        calls.create("gateway", self.id, tags=tags, idempotency_key=f"start-{self.id}")
        self.stream = calls.tasks.Poll(
            tasks_pb2.PollRequest(group=GROUP, worker_id=self.worker_id, capacity=8),
            metadata=calls.md("worker"),
        )
        self.delivery = next(self.stream)
        while self.delivery.task.root_promise_id != self.id:  # an earlier test's leftover
            self.delivery = next(self.stream)
        task = self.delivery.task
        self.fence = types_pb2.TaskFence(
            task_id=task.id, counter=task.counter, worker_id=self.worker_id
        )

    def step(self, n: int, kind: str, **fields: Any) -> types_pb2.Promise:
        tags = {"troth:kind": kind}
        return self.calls.create(
            "worker", f"{self.id}.{n}", tags=tags, fence=self.fence, **fields
        ).promise

    def close(self) -> None:
        self.stream.cancel()


@pytest.fixture
def workflow(calls: Calls) -> Iterator[Workflow]:
    wf = Workflow(calls)
    yield wf
    wf.close()


def test_a_settle_token_step_shows_its_token_only_to_the_workflows_workers(
    calls: Calls, workflow: Workflow
) -> None:
    approval = workflow.step(0, "promise")
    token = calls.promises.MintSettleToken(
        promises_pb2.MintSettleTokenRequest(promise_id=approval.id, fence=workflow.fence),
        metadata=calls.md("worker"),
        timeout=10,
    ).token
    value = types_pb2.Payload(
        headers={"content-type": "application/json"}, data=f'"{token}"'.encode()
    )
    step = workflow.step(1, "settle_token", resolved_with=value, idempotency_key="step-key")
    assert step.value.data == value.data  # the writer's answer
    for who in ("worker", "admin"):
        got = calls.get(who, step.id)
        assert got.value.data == value.data, who
        assert got.idempotency_key_for_create == "step-key", who
    for who in ("gateway", "ops"):
        got = calls.get(who, step.id)
        assert got.value.data == b"", who
        assert dict(got.value.headers) == {"troth-redacted": "settle_token"}, who
        assert got.idempotency_key_for_create == "", who
    # A worker of another group does not read the step at all (issue 26).
    code, reason, _ = _refused(lambda: calls.get("worker-other", step.id))
    assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, Reason.GROUP_NOT_ALLOWED)
    for who in ("gateway", "ops"):
        (found,) = calls.search(who, step.id)
        assert found.value.data == b"" and token not in str(found), who
    # Other steps' values are the workflow's data, read by whoever may read it.
    plain = workflow.step(2, "run", resolved_with=types_pb2.Payload(data=b"42"))
    assert calls.get("ops", plain.id).value.data == b"42"
    # The token still works for whoever it was mailed to.
    assert calls.promises.ResolvePromise(
        promises_pb2.ResolvePromiseRequest(id=approval.id, settle_token=token), timeout=10
    ).applied


# -- settles before the promise exists -----------------------------------------------


def test_an_early_settle_counts_only_if_the_adopting_policy_allows_its_settler(
    calls: Calls,
) -> None:
    def early_then_create(settler: str, **policy: Any) -> types_pb2.Promise:
        promise_id = _id("early-")
        assert calls.resolve(settler, promise_id, create_if_missing=True).applied
        approvers = types_pb2.Approvers(**policy) if policy else None
        fields = {} if approvers is None else {"approvers": approvers}
        return calls.create("gateway", promise_id, **fields).promise

    # No policy: adopted as it was settled (as before).
    assert early_then_create("gateway-2").state == types_pb2.PROMISE_STATE_RESOLVED
    # A policy that names the early settler: adopted.
    named = early_then_create("gateway-2", principals=["gateway-2"])
    assert (named.state, named.settled_by) == (types_pb2.PROMISE_STATE_RESOLVED, "gateway-2")
    # A policy that does not: the early settle never counts; the promise is pending,
    # and its approver settles it.
    refused = early_then_create("gateway-2", principals=["admin"])
    assert refused.state == types_pb2.PROMISE_STATE_PENDING
    assert calls.get("gateway", refused.id).state == types_pb2.PROMISE_STATE_PENDING
    code, reason, _ = _refused(lambda: calls.resolve("gateway-2", refused.id))
    assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, Reason.NOT_AN_APPROVER)
    assert calls.resolve("admin", refused.id).promise.settled_by == "admin"
    # Roles cannot be checked after the fact: only a named principal settles early.
    by_role = early_then_create("gateway-2", roles=["gateway"])
    assert by_role.state == types_pb2.PROMISE_STATE_PENDING
    # Four-eyes: the early settler is the creator.
    promise_id = _id("early-")
    calls.resolve("gateway", promise_id, create_if_missing=True)
    own = calls.create(
        "gateway",
        promise_id,
        approvers=types_pb2.Approvers(principals=["gateway"], not_requester=True),
    ).promise
    assert own.state == types_pb2.PROMISE_STATE_PENDING
    eventually(
        lambda: (
            refused.id in calls.server.log()
            and "promise.early_settle_refused" in calls.server.log()
        ),
        what="the early_settle_refused line",
    )


def test_a_worker_gets_its_workflow_without_the_starters_key(
    calls: Calls, workflow: Workflow
) -> None:
    root = workflow.delivery.root
    assert root.id == workflow.id
    assert root.idempotency_key_for_create == ""  # the gateway's, not the worker's
    assert calls.get("gateway", workflow.id).idempotency_key_for_create == f"start-{workflow.id}"
    assert calls.get("admin", workflow.id).idempotency_key_for_create == f"start-{workflow.id}"


def test_a_scoped_operator_lists_only_the_tasks_of_its_workflows(calls: Calls) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"  # no worker polls it: its tasks stay pending
    tags = {"troth:invoke": group, "troth:func": "f"}
    inside = calls.create("gateway", _id("acme-wf-"), tags=tags).promise.id
    outside = calls.create("gateway", _id("globex-wf-"), tags=tags).promise.id

    def roots(who: str) -> set[str]:
        found = calls.tasks.SearchTasks(
            tasks_pb2.SearchTasksRequest(group=group), metadata=calls.md(who), timeout=10
        )
        return {t.root_promise_id for t in found.tasks}

    assert roots("ops") == {inside, outside}
    assert roots("acme-ops") == {inside}


def test_a_workflows_approval_settled_early_by_someone_else_waits_for_its_approver(
    calls: Calls, workflow: Workflow
) -> None:
    # `ctx.promise(id=...)`: an id of the caller's choosing, outside the step namespace.
    def approval(approvers: types_pb2.Approvers) -> types_pb2.Promise:
        promise_id = _id("approval-")
        assert calls.resolve("gateway-2", promise_id, create_if_missing=True).applied
        return calls.create(
            "worker",
            promise_id,
            tags={"troth:kind": "promise"},
            fence=workflow.fence,
            approvers=approvers,
        ).promise

    step = approval(types_pb2.Approvers(principals=["admin"]))
    assert (step.state, step.parent_id) == (types_pb2.PROMISE_STATE_PENDING, workflow.id)
    assert calls.resolve("admin", step.id).promise.settled_by == "admin"
    # Named by the policy: the early settle is adopted, as without one.
    named = approval(types_pb2.Approvers(principals=["gateway-2"]))
    assert (named.state, named.settled_by, named.parent_id) == (
        types_pb2.PROMISE_STATE_RESOLVED,
        "gateway-2",
        workflow.id,
    )
