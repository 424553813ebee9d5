"""SearchWorkflows and RetryWorkflowNow against a real server, on SQLite and PostgreSQL
(issue 28): workflows listed by every filter and their combinations, page by page,
each with its task (paused: the error, the attempts, the next retry) and the human
decisions it waits on; only what the caller may see (a tenant's prefixes, a worker's
groups); a paused workflow retried now is delivered at once, not after its backoff;
a workflow's root cancelled ends its steps and, once its worker hears of it, its
task; every bad request refused naming its field. Through the SDK's
`Client.search_workflows` / `iter_workflows` / `retry_workflow_now`, and raw where
the wire matters (tokens, refusals)."""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Generator, Iterator
from contextlib import ExitStack, redirect_stderr, redirect_stdout
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest
from _auth import Grant, bearer, write_token_file
from _pg import fresh_schema
from _support import PollStream, ServerProcess, error_info, start_server
from google.protobuf.timestamp_pb2 import Timestamp

from troth import Client, Context, PromiseState, TaskState, Worker, WorkflowInfo
from troth._cli import main as troth_cli
from troth.errors import FailedPreconditionError, NotFoundError, PermissionDeniedError
from troth.v1 import promises_pb2 as pb
from troth.v1 import promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc
from troth.v1 import types_pb2 as types

WAIT = 15.0
Stubs = tuple[promises_pb2_grpc.PromiseServiceStub, tasks_pb2_grpc.TaskServiceStub]
V1 = [tasks_pb2.WorkflowVersion(name="publish", version="v1"),
      tasks_pb2.WorkflowVersion(name="review", version="v1")]  # fmt: skip


@pytest.fixture
def stubs(channel: grpc.Channel) -> Stubs:
    return promises_pb2_grpc.PromiseServiceStub(channel), tasks_pb2_grpc.TaskServiceStub(channel)


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.address) as c:
        yield c


@pytest.fixture
def group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def poller(stubs: Stubs, group: str) -> Iterator[PollStream]:
    request = tasks_pb2.PollRequest(group=group, worker_id="w1", capacity=50, workflows=V1)
    stream = PollStream(stubs[1], request, WAIT)
    yield stream
    stream.cancel()


def start(
    promises: promises_pb2_grpc.PromiseServiceStub,
    group: str,
    workflow_id: str,
    name: str,
    **fields: Any,
) -> str:
    promises.CreatePromise(
        pb.CreatePromiseRequest(
            id=workflow_id,
            param=types.Payload(data=b"[]"),
            tags={"troth:invoke": group, "troth:func": name},
            **fields,
        ),
        timeout=10,
    )
    return workflow_id


def fence(task: tasks_pb2.Task) -> types.TaskFence:
    return types.TaskFence(task_id=task.id, counter=task.counter, worker_id="w1")


def held(task: tasks_pb2.Task) -> dict[str, Any]:
    return {"task_id": task.id, "counter": task.counter, "worker_id": "w1"}


def fail(tasks: tasks_pb2_grpc.TaskServiceStub, task: tasks_pb2.Task) -> tasks_pb2.Task:
    request = tasks_pb2.FailTaskRequest(
        **held(task),
        error="NameError: name 'x' is not defined",
        traceback='Traceback (most recent call last):\n  File "wf.py", line 3\nNameError: x\n',
    )
    answer: tasks_pb2.Task = tasks.FailTask(request, timeout=10).task
    return answer


def step(
    promises: promises_pb2_grpc.PromiseServiceStub, task: tasks_pb2.Task, step_id: str, kind: str
) -> str:
    promises.CreatePromise(
        pb.CreatePromiseRequest(id=step_id, fence=fence(task), tags={"troth:kind": kind}),
        timeout=10,
    )
    return step_id


def suspend(tasks: tasks_pb2_grpc.TaskServiceStub, task: tasks_pb2.Task, on: str) -> None:
    tasks.CompleteTask(tasks_pb2.CompleteTaskRequest(**held(task), suspend_on=[on]), timeout=10)


def ids(found: list[WorkflowInfo]) -> list[str]:
    return [w.id for w in found]


def stamp(moment: datetime) -> Timestamp:
    out = Timestamp()
    out.FromDatetime(moment)
    return out


def test_each_filter_alone_and_combined(
    stubs: Stubs, client: Client, group: str, poller: PollStream
) -> None:
    promises, tasks = stubs
    p = group  # ids of this test's own
    # w1: waits for a human, at a step with an id of its own.
    w1 = start(promises, group, f"{p}-w1", "publish")
    t1 = poller.next_response().task
    approval = step(promises, t1, f"approval-{p}", "promise")
    suspend(tasks, t1, approval)
    # w2: waits on a `run` step, which its worker settles: no human.
    w2 = start(promises, group, f"{p}-w2", "publish")
    t2 = poller.next_response().task
    suspend(tasks, t2, step(promises, t2, f"{w2}.0", "run"))
    # w3: paused by a bug.
    w3 = start(promises, group, f"{p}-w3", "review")
    t3 = poller.next_response().task
    time.sleep(0.01)
    middle = datetime.now(UTC)
    time.sleep(0.01)
    failed = fail(tasks, t3)
    # w4: finished.
    w4 = start(promises, group, f"{p}-w4", "review")
    t4 = poller.next_response().task
    tasks.CompleteTask(
        tasks_pb2.CompleteTaskRequest(**held(t4), resolve_root=types.Payload(data=b"1")),
        timeout=10,
    )
    # w5: a workflow the worker does not register: it takes it, recording no version.
    w5 = start(promises, group, f"{p}-w5", "other")
    # w6: timed out (expired, whether or not the sweeper got to it yet).
    w6 = start(promises, group, f"{p}-w6", "other", ttl=types_duration_ms(300))
    # Another group's workflow, never listed with this group's.
    start(promises, f"{group}-x", f"{p}-x1", "publish")
    time.sleep(0.4)

    every = client.search_workflows(group=group)
    assert ids(every) == [w6, w5, w4, w3, w2, w1]  # newest first
    by_id = {w.id: w for w in every}
    assert (by_id[w1].group, by_id[w1].workflow, by_id[w1].version) == (group, "publish", "v1")
    assert by_id[w5].version is None
    assert by_id[w6].state is PromiseState.REJECTED_TIMEDOUT
    # The human decision w1 waits on, found by its parent link (its id is its own).
    assert [s.id for s in by_id[w1].waiting_on] == [approval]
    assert by_id[w1].task is None and not by_id[w1].paused
    assert by_id[w2].waiting_on == []
    # The paused one: its error, attempts, traceback and next retry.
    paused = by_id[w3]
    assert paused.paused and paused.task is not None
    assert paused.task.failed_attempts == 1
    assert paused.task.last_error == "NameError: name 'x' is not defined"
    assert paused.task.last_traceback is not None
    assert paused.task.last_traceback.endswith("NameError: x\n")
    assert paused.task.next_attempt_time is not None
    retry_ms = paused.task.next_attempt_time.timestamp() * 1000
    assert abs(retry_ms - failed.next_attempt_time.ToMilliseconds()) < 2
    running = by_id[w5].task
    assert running is not None and (running.state, running.worker_id) == (TaskState.CLAIMED, "w1")

    def listed(**filters: Any) -> list[str]:
        return ids(client.search_workflows(group=group, **filters))

    assert listed(newest_first=False) == [w1, w2, w3, w4, w5, w6]
    assert listed(id=f"{p}-w1") == [w1]
    assert listed(id="*-w1") == [w1]
    assert listed(id=f"{p}-w*") == [w6, w5, w4, w3, w2, w1]
    assert listed(states=["PENDING"]) == [w5, w3, w2, w1]
    assert listed(states=["RESOLVED"]) == [w4]
    assert listed(states=[PromiseState.REJECTED_TIMEDOUT, "RESOLVED"]) == [w6, w4]
    assert listed(workflow="review") == [w4, w3]
    assert listed(version="v1") == [w4, w3, w2, w1]
    assert listed(paused=True) == [w3]
    assert listed(waiting_for_human=True) == [w1]
    assert listed(created_before=middle) == [w3, w2, w1]
    assert listed(created_after=middle) == [w6, w5, w4]
    # Combined: every filter narrows.
    assert listed(workflow="publish", states=["PENDING"]) == [w2, w1]
    assert listed(workflow="publish", paused=True) == []
    assert listed(workflow="review", created_after=middle) == [w4]
    assert listed(version="v1", states=["PENDING"], newest_first=False) == [w1, w2, w3]
    assert listed(waiting_for_human=True, created_after=middle) == []
    assert listed(limit=2) == [w6, w5]
    # No group: every group's, this one's among them.
    assert f"{p}-x1" in ids(client.search_workflows(id=f"{p}-*"))
    assert ids(client.search_workflows(group=f"{group}-x")) == [f"{p}-x1"]


def types_duration_ms(ms: int) -> Any:
    from google.protobuf.duration_pb2 import Duration

    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def test_pages_follow_each_other_in_both_orders(stubs: Stubs, client: Client, group: str) -> None:
    promises, tasks = stubs
    started = [start(promises, group, f"{group}-{n:02d}", "other") for n in range(7)]

    for newest_first in (True, False):
        expected = started[::-1] if newest_first else started
        walked = client.iter_workflows(group=group, newest_first=newest_first, page_size=2)
        assert [w.id for w in walked] == expected
        assert (
            ids(client.search_workflows(group=group, newest_first=newest_first, limit=5))
            == (expected[:5])
        )
    # On the wire: a token per page, none on the last, bound to its search.
    request = tasks_pb2.SearchWorkflowsRequest(group=group, page_size=3)
    pages, token = [], ""
    while True:
        request.page_token = token
        answer = tasks.SearchWorkflows(request, timeout=10)
        pages.append([w.root.id for w in answer.workflows])
        token = answer.next_page_token
        if not token:
            break
    assert pages == [started[6:3:-1], started[3:0:-1], started[:1]]
    first = tasks.SearchWorkflows(request.__class__(group=group, page_size=3), timeout=10)
    other = tasks_pb2.SearchWorkflowsRequest(
        group=group, page_size=3, workflow="publish", page_token=first.next_page_token
    )
    refused = refusal(lambda: tasks.SearchWorkflows(other, timeout=10))
    assert refused == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAGE_TOKEN")
    with pytest.raises(grpc.RpcError) as caught:
        tasks.SearchWorkflows(other, timeout=10)
    assert "repeat the id, states, group, workflow, workflow_version" in str(caught.value.details())
    # A SearchPromises token is not one of these.
    promise_page = promises.SearchPromises(pb.SearchPromisesRequest(page_size=1), timeout=10)
    assert promise_page.next_page_token
    borrowed = tasks_pb2.SearchWorkflowsRequest(page_token=promise_page.next_page_token)
    refused = refusal(lambda: tasks.SearchWorkflows(borrowed, timeout=10))
    assert refused == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAGE_TOKEN")


def refusal(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value.code(), error_info(caught.value).reason


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"id": "bad id!"}, "id"),
        ({"id": "x" * 300}, "id"),
        ({"page_size": -1}, "page_size"),
        ({"page_size": 100_000}, "page_size"),
        ({"page_token": "not-a-token"}, "page_token"),
        ({"page_token": "!!"}, "page_token"),
        ({"group": "bad group!"}, "group"),
        ({"workflow": "w" * 257}, "workflow"),
        ({"workflow_version": "v" * 129}, "workflow_version"),
        ({"states": [99]}, "states"),
        ({"order": pb.PROMISE_ORDER_EXPIRE_TIME_ASC}, "order"),
        ({"order": 42}, "order"),
        ({"created_after": Timestamp(seconds=-5)}, "created_after"),
        ({"created_before": Timestamp(seconds=1, nanos=-1)}, "created_before"),
        ({"created_before": Timestamp(seconds=10**15)}, "created_before"),
        (
            {
                "created_after": Timestamp(seconds=2_000_000_000),
                "created_before": Timestamp(seconds=1_000_000_000),
            },
            "created_after",
        ),
    ],
)
def test_a_bad_search_is_refused_naming_its_field(
    stubs: Stubs, fields: dict[str, Any], field: str
) -> None:
    _, tasks = stubs
    with pytest.raises(grpc.RpcError) as caught:
        tasks.SearchWorkflows(tasks_pb2.SearchWorkflowsRequest(**fields), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info(caught.value)
    if field == "page_token":
        assert info.reason == "INVALID_PAGE_TOKEN"
    else:
        assert (info.reason, info.metadata["field"]) == ("INVALID_ARGUMENT", field)


def test_a_paused_workflow_retried_now_is_delivered_at_once(
    stubs: Stubs, client: Client, group: str, poller: PollStream
) -> None:
    promises, tasks = stubs
    root = start(promises, group, f"{group}-buggy", "publish")
    task = poller.next_response().task
    # Three failures: its backoff is now 2 to 4 s.
    for attempt in (1, 2, 3):
        failed = fail(tasks, task)
        assert failed.failed_attempts == attempt
        if attempt < 3:
            task = poller.next_response().task
    due = failed.next_attempt_time.ToMilliseconds() / 1000
    assert due - time.time() > 1.5
    [listed] = client.search_workflows(group=group, paused=True)
    assert listed.id == root and listed.task is not None

    retried = client.retry_workflow_now(root)
    asked = time.time()
    assert retried.state is TaskState.PENDING and retried.id == failed.id
    assert retried.failed_attempts == 3  # its failures stay until an attempt succeeds
    assert retried.last_error == "NameError: name 'x' is not defined"
    assert retried.next_attempt_time is not None
    assert abs(retried.next_attempt_time.timestamp() - asked) < 2
    again = poller.next_response().task
    assert time.time() < due - 0.5, "delivered only after its backoff, not at once"
    assert (again.id, again.failed_attempts) == (failed.id, 3)
    # Held by the worker now: paused still (being retried), but not retryable now.
    assert ids(client.search_workflows(group=group, paused=True)) == [root]
    with pytest.raises(FailedPreconditionError) as caught:
        client.retry_workflow_now(root)
    assert caught.value.reason == "WORKFLOW_NOT_PAUSED"
    assert "is running" in str(caught.value)


def test_retry_now_refuses_what_is_not_a_paused_workflow(
    stubs: Stubs, client: Client, group: str
) -> None:
    promises, tasks = stubs
    waiting = start(promises, group, f"{group}-waits", "other")  # PENDING, never failed
    client.create(f"{group}-plain", {"n": 1})
    client.cancel(start(promises, group, f"{group}-over", "other"))

    with pytest.raises(FailedPreconditionError) as caught:
        client.retry_workflow_now(waiting)
    assert caught.value.reason == "WORKFLOW_NOT_PAUSED"
    assert "failed no attempt" in str(caught.value)
    with pytest.raises(FailedPreconditionError) as caught:
        client.retry_workflow_now(f"{group}-over")
    assert caught.value.reason == "WORKFLOW_NOT_PAUSED"
    assert "is over (REJECTED_CANCELED)" in str(caught.value)
    with pytest.raises(FailedPreconditionError) as caught:
        client.retry_workflow_now(f"{group}-plain")
    assert caught.value.reason == "NOT_A_WORKFLOW"
    with pytest.raises(NotFoundError):
        client.retry_workflow_now(f"{group}-nobody")
    bad = tasks_pb2.RetryWorkflowNowRequest(id="bad id!")
    assert refusal(lambda: tasks.RetryWorkflowNow(bad, timeout=10)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
    )
    empty = tasks_pb2.RetryWorkflowNowRequest()
    assert refusal(lambda: tasks.RetryWorkflowNow(empty, timeout=10))[0] == (
        grpc.StatusCode.INVALID_ARGUMENT
    )


def test_a_cancelled_root_ends_its_steps_and_then_its_task(
    stubs: Stubs, client: Client, group: str, poller: PollStream
) -> None:
    """CancelPromise on a workflow's root: the root and its PENDING steps are cancelled
    in one transaction; its task is not ended behind the workflow's back (DESIGN §4.10:
    the workflow sees `Cancelled` at its next yield, and may compensate): a waiting one
    is resumed, a paused one is offered at once, and each ends when its worker reports."""
    promises, tasks = stubs
    human = start(promises, group, f"{group}-human", "publish")
    t1 = poller.next_response().task
    decision = step(promises, t1, f"decision-{group}", "promise")
    suspend(tasks, t1, decision)
    buggy = start(promises, group, f"{group}-bug", "publish")
    t2 = poller.next_response().task
    for _ in range(2):
        fail(tasks, t2)
        t2 = poller.next_response().task
    failed = fail(tasks, t2)  # 3 failures: 2 to 4 s of backoff
    due = failed.next_attempt_time.ToMilliseconds() / 1000

    for root in (human, buggy):
        client.cancel(root)
        assert client.get(root).state is PromiseState.REJECTED_CANCELED
    assert client.get(decision).state is PromiseState.REJECTED_CANCELED
    assert [s.id for s in client.workflow_steps(human)] == [decision]

    # Each workflow's task comes to its worker now (the paused one not after its backoff).
    delivered = {}
    for _ in range(2):
        task = poller.next_response().task
        delivered[task.root_promise_id] = task
    assert set(delivered) == {human, buggy}
    assert time.time() < due - 0.5
    tasks.CompleteTask(tasks_pb2.CompleteTaskRequest(**held(delivered[human])), timeout=10)
    fail(tasks, delivered[buggy])  # the bug is still there: it fails again, and ends
    [shown] = client.search_workflows(group=group, id=human)
    assert (shown.state, shown.task, shown.waiting_on) == (PromiseState.REJECTED_CANCELED, None, [])
    [shown] = client.search_workflows(group=group, id=buggy)
    assert (shown.state, shown.task) == (PromiseState.REJECTED_CANCELED, None)
    assert client.search_workflows(group=group, paused=True) == []


def test_a_workflow_cancelled_before_any_worker_took_it_ends_its_task_at_once(
    stubs: Stubs, client: Client, group: str
) -> None:
    """No code of it ran, so there is nothing for it to hear or compensate: its task
    ends with the cancel (as FailWorkflow ends a waiting one), not whenever a worker of
    its group next connects, which may be never."""
    _, tasks = stubs
    root = start(stubs[0], group, f"{group}-unstarted", "publish")
    [before] = client.search_workflows(group=group)
    assert before.task is not None and before.task.state is TaskState.PENDING
    client.cancel(root)
    [after] = client.search_workflows(group=group)
    assert (after.state, after.task) == (PromiseState.REJECTED_CANCELED, None)
    assert list(tasks.SearchTasks(tasks_pb2.SearchTasksRequest(group=group)).tasks) == []


# -- a timeline keeps every decision -------------------------------------------------------


def named_review(ctx: Context, post: int) -> Generator[Any, Any, Any]:
    draft = yield ctx.run(write_draft, post)
    approval = yield ctx.promise(id=f"approval-{ctx.id}", title=f"Publish {draft}?")
    decision = yield approval
    yield ctx.sleep(timedelta(milliseconds=10))
    return decision


def write_draft(post: int) -> str:
    return f"post {post}"


def test_workflows_show_keeps_a_named_decision_after_the_run_ends(
    server: ServerProcess, client: Client, group: str
) -> None:
    """`troth workflows show` reads the steps by their parent link (`workflow_steps`):
    the human decision with an id of its own is listed, with who made it and the value,
    after the run finished as before."""
    worker = Worker(client, group=group, lease=timedelta(seconds=5))
    worker.workflow(named_review)
    worker.start()
    try:
        wid = f"{group}-review"
        handle = client.start("named_review", 21, id=wid, group=group)
        approval = f"approval-{wid}"
        wait_for(lambda: any(w.id == wid for w in client.search_workflows(
            group=group, waiting_for_human=True)))  # fmt: skip
        [waiting] = client.search_workflows(group=group, waiting_for_human=True)
        assert [s.id for s in waiting.waiting_on] == [approval]
        with Client(server.address, principal="alice") as alice:
            alice.resolve(approval, {"approved": True})
        assert handle.result(timeout=20) == {"approved": True}
    finally:
        worker.stop()

    steps = client.workflow_steps(wid)
    assert [s.id for s in steps] == [f"{wid}.0", approval, f"{wid}.2"]
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = troth_cli(["--server", server.address, "workflows", "show", wid])
    assert status == 0, err.getvalue()
    shown = out.getvalue()
    row = next(line for line in shown.splitlines() if line.startswith(approval))
    assert "promise" in row and "RESOLVED" in row and "alice" in row, shown
    assert '{"approved":true}' in row.replace(" ", ""), shown
    assert f"{wid}.0" in shown and f"{wid}.2" in shown


def wait_for(check: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


# -- who sees what ----------------------------------------------------------------------

SCOPED = "g-wf-scope"
GRANTS = [
    Grant("tenant", ("gateway",), prefixes=("acme-",)),
    Grant("gateway", ("gateway",)),
    Grant("ops", ("operator",)),
    Grant("acme-ops", ("operator",), prefixes=("acme-",)),
    Grant("worker", ("worker",), groups=(SCOPED,)),
    Grant("any-worker", ("worker",), groups=("*",)),
    Grant("worker-gateway", ("worker", "gateway"), groups=(SCOPED,)),
]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def authed(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[tuple[ServerProcess, dict[str, str]]]:
    workdir = tmp_path_factory.mktemp("wf-scope")
    tokens = write_token_file(workdir / "tokens.toml", GRANTS)
    with ExitStack() as stack:
        db_url = stack.enter_context(fresh_schema()) if request.param == "postgres" else None
        server = start_server(workdir, "--auth-tokens", str(workdir / "tokens.toml"), db_url=db_url)
        try:
            yield server, tokens
        finally:
            assert server.stop() == 0, server.log()[-3000:]


def as_(authed: tuple[ServerProcess, dict[str, str]], who: str) -> Client:
    server, tokens = authed
    return Client(server.address, token=tokens[who])


def test_a_caller_lists_only_the_workflows_it_may_see(
    authed: tuple[ServerProcess, dict[str, str]],
) -> None:
    server, tokens = authed
    with as_(authed, "gateway") as gateway:
        mine = [gateway.start("publish", id=f"acme-{n}", group=SCOPED).id for n in range(3)] + [
            gateway.start("publish", id=f"other-{n}", group="g-else").id for n in range(3)
        ]
    everything = list(reversed(mine))
    with as_(authed, "ops") as ops:
        assert ids(ops.search_workflows()) == everything
    # A tenant: its prefixes, however the glob is written; a page full of its own.
    with as_(authed, "tenant") as tenant:
        assert ids(tenant.search_workflows()) == ["acme-2", "acme-1", "acme-0"]
        assert ids(tenant.search_workflows(id="other-*")) == []
        assert ids(tenant.search_workflows(id="*-1")) == ["acme-1"]
        assert [w.id for w in tenant.iter_workflows(page_size=1)] == ["acme-2", "acme-1", "acme-0"]
    with as_(authed, "acme-ops") as acme_ops:
        assert ids(acme_ops.search_workflows(group="g-else")) == []
        with pytest.raises(PermissionDeniedError) as refused:
            acme_ops.retry_workflow_now("other-0")
        assert refused.value.reason == "OUTSIDE_PREFIXES"
    # A worker and nothing more: its groups' workflows only.
    with as_(authed, "worker") as worker:
        assert ids(worker.search_workflows()) == ["acme-2", "acme-1", "acme-0"]
        assert ids(worker.search_workflows(group=SCOPED, limit=1)) == ["acme-2"]
        with pytest.raises(PermissionDeniedError) as refused:
            worker.search_workflows(group="g-else")
        assert refused.value.reason == "GROUP_NOT_ALLOWED"
        with pytest.raises(PermissionDeniedError) as refused:
            worker.retry_workflow_now("acme-0")
        assert refused.value.reason == "ROLE_NOT_ALLOWED"
    with as_(authed, "any-worker") as any_worker:
        assert ids(any_worker.search_workflows()) == everything
    # A worker that is a gateway too keeps the gateway's reach.
    with as_(authed, "worker-gateway") as both:
        assert ids(both.search_workflows()) == everything
    # Without a token: refused.
    with grpc.insecure_channel(server.address) as channel:
        stub = tasks_pb2_grpc.TaskServiceStub(channel)
        code, _ = refusal(lambda: stub.SearchWorkflows(tasks_pb2.SearchWorkflowsRequest()))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        md = bearer(tokens["gateway"])
        code, reason = refusal(
            lambda: stub.RetryWorkflowNow(
                tasks_pb2.RetryWorkflowNowRequest(id="acme-0"), metadata=md
            )
        )
        assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "ROLE_NOT_ALLOWED")


def buggy(ctx: Context) -> Generator[Any, Any, Any]:
    yield ctx.sleep(timedelta(milliseconds=1))
    raise NameError("name 'secret_rate' is not defined")


def test_a_paused_runs_error_is_shown_only_to_those_who_may_read_tasks(
    authed: tuple[ServerProcess, dict[str, str]],
) -> None:
    """A workflow's error and traceback are the operators' (SearchTasks'): a gateway or a
    worker listing workflows sees that a run is paused, how often it failed and when it is
    retried, not what its code said (a traceback quotes code and data)."""
    group = "g-wf-paused"
    with ExitStack() as stack:
        runner = stack.enter_context(as_(authed, "any-worker"))
        worker = Worker(runner, group=group)
        worker.workflow(buggy)
        worker.start()
        stack.callback(worker.stop)
        with as_(authed, "gateway") as gateway:
            gateway.start("buggy", id="paused-run", group=group)
        with as_(authed, "ops") as ops:
            wait_for(lambda: bool(ops.search_workflows(group=group, paused=True)))
            [seen] = ops.search_workflows(group=group, paused=True)
            assert seen.task is not None
            assert "secret_rate" in seen.task.last_error
            assert "secret_rate" in (seen.task.last_traceback or "")
        for who in ("gateway", "any-worker", "worker-gateway"):
            with as_(authed, who) as reader:
                [found] = reader.search_workflows(id="paused-run")
                assert found.paused and found.task is not None, who
                assert found.task.failed_attempts >= 1, who
                assert found.task.next_attempt_time is not None, who
                assert not found.task.last_error and not found.task.last_traceback, who
                assert not found.task.worker_principal, who
