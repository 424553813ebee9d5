"""Task calls are bound to the worker principal the task was leased to (issue 11).

The attack: `SearchTasks` shows a claimed task's id, counter and worker id, and a
`CompleteTask` with them (and `resolve_root`) would settle the victim's workflow.
With authentication on, a claim records the authenticated principal on the task,
and every call about it (Heartbeat, CompleteTask, ReleaseTask, RegisterCallbacks,
a fenced step write or MintSettleToken) from anyone else is PERMISSION_DENIED,
reason NOT_THE_TASKS_WORKER, however right its counter. Two worker principals
share group `g`; a JWT names one of them with a grant for another group only.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Generator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from _auth import (
    Grant,
    bearer,
    code_and_reason,
    make_jwt,
    make_jwt_keys,
    opened,
    write_token_file,
)
from _pg import fresh_schema
from _support import error_info, eventually, start_server
from google.protobuf.duration_pb2 import Duration

from troth import Client, Context, Worker
from troth.errors import Reason
from troth.v1 import promises_pb2, promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc, types_pb2
from troth_server.settle_keys import new_keys_file

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from _support import ServerProcess

GROUP = "g"
SDK_GROUP = "g-sdk"
Metadata = tuple[tuple[str, str], ...]
DENIED = (grpc.StatusCode.PERMISSION_DENIED, Reason.NOT_THE_TASKS_WORKER.value)
RESULT = types_pb2.Payload(data=b"1")


@dataclass
class Setup:
    server: ServerProcess
    channel: grpc.Channel
    md: dict[str, Metadata]
    tokens: dict[str, str]

    @property
    def promises(self) -> promises_pb2_grpc.PromiseServiceStub:
        return promises_pb2_grpc.PromiseServiceStub(self.channel)

    @property
    def tasks(self) -> tasks_pb2_grpc.TaskServiceStub:
        return tasks_pb2_grpc.TaskServiceStub(self.channel)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def setup(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Setup]:
    workdir = tmp_path_factory.mktemp("binding")
    keys = make_jwt_keys(workdir / "keys")
    (workdir / "settle-keys.json").write_text(new_keys_file(["k1"]))
    tokens = write_token_file(
        workdir / "tokens.toml",
        [
            Grant("worker-a", ("worker",), (GROUP, SDK_GROUP)),
            Grant("worker-b", ("worker",), (GROUP, SDK_GROUP)),
            Grant("gateway-1", ("gateway",)),
            Grant("operator-1", ("operator",)),
            Grant("admin-1", ("admin",)),
        ],
    )
    md = {name: bearer(token) for name, token in tokens.items()}
    # worker-a's own name, with a grant that no longer names group g.
    md["worker-a-elsewhere"] = bearer(
        make_jwt(keys.hs_secret, "HS256", "worker-a", ["worker"], groups=["other"])
    )
    with ExitStack() as stack:
        db_url = stack.enter_context(fresh_schema()) if request.param == "postgres" else None
        server = start_server(
            workdir,
            "--auth-tokens", str(workdir / "tokens.toml"),
            "--jwt-key-file", str(keys.hs_file),
            "--jwt-algorithms", "HS256",
            "--settle-token-keys", str(workdir / "settle-keys.json"),
            db_url=db_url,
        )  # fmt: skip
        try:
            with server.channel() as channel:
                yield Setup(server, channel, md, tokens)
        finally:
            assert server.stop() == 0, server.log()[-3000:]


class Leased:
    """A workflow started by the gateway, its task polled by hand by `worker-a`."""

    def __init__(self, setup: Setup, worker: str = "worker-a") -> None:
        self.setup = setup
        self.root = f"wf-{uuid.uuid4().hex[:10]}"
        self.worker_id = f"{worker}-{uuid.uuid4().hex[:6]}"
        setup.promises.CreatePromise(
            promises_pb2.CreatePromiseRequest(
                id=self.root,
                param=types_pb2.Payload(data=b"[]"),
                tags={"troth:invoke": GROUP, "troth:func": "publish"},
            ),
            metadata=setup.md["gateway-1"],
            timeout=10,
        )
        self.stream = setup.tasks.Poll(
            tasks_pb2.PollRequest(group=GROUP, worker_id=self.worker_id, capacity=8),
            metadata=setup.md[worker],
            timeout=60,
        )
        self.task = self._own(worker)

    def _own(self, worker: str) -> tasks_pb2.Task:
        # Earlier tests' roots are in the same group: finish what is not ours.
        while (task := next(self.stream).task).root_promise_id != self.root:
            self.setup.tasks.CompleteTask(
                tasks_pb2.CompleteTaskRequest(
                    task_id=task.id, counter=task.counter, worker_id=self.worker_id
                ),
                metadata=self.setup.md[worker],
            )
        return task

    def fence(self, counter: int | None = None) -> types_pb2.TaskFence:
        return types_pb2.TaskFence(
            task_id=self.task.id,
            counter=self.task.counter if counter is None else counter,
            worker_id=self.worker_id,
        )

    def complete(self, who: str, **fields: Any) -> tasks_pb2.CompleteTaskResponse:
        request = tasks_pb2.CompleteTaskRequest(
            task_id=self.task.id, counter=self.task.counter, worker_id=self.worker_id, **fields
        )
        response: tasks_pb2.CompleteTaskResponse = self.setup.tasks.CompleteTask(
            request, metadata=self.setup.md[who], timeout=10
        )
        return response

    def root_state(self) -> int:
        got = self.setup.promises.GetPromise(
            promises_pb2.GetPromiseRequest(id=self.root), metadata=self.setup.md["gateway-1"]
        )
        state: int = got.promise.state
        return state

    def close(self) -> None:
        self.stream.cancel()


@pytest.fixture
def leased(setup: Setup) -> Iterator[Leased]:
    made = Leased(setup)
    yield made
    made.close()


def _refusal(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def test_search_tasks_shows_operators_whom_a_task_is_leased_to(
    setup: Setup, leased: Leased
) -> None:
    found = setup.tasks.SearchTasks(
        tasks_pb2.SearchTasksRequest(group=GROUP), metadata=setup.md["operator-1"]
    ).tasks
    mine = [t for t in found if t.id == leased.task.id]
    assert len(mine) == 1
    assert mine[0].worker_principal == "worker-a"
    assert mine[0].counter == leased.task.counter
    assert mine[0].worker_id == leased.worker_id
    # Workers (and gateways) do not list tasks at all.
    for who in ("worker-b", "gateway-1"):
        code, reason = code_and_reason(
            lambda who=who: setup.tasks.SearchTasks(
                tasks_pb2.SearchTasksRequest(group=GROUP), metadata=setup.md[who]
            )
        )
        assert (code, reason) == (
            grpc.StatusCode.PERMISSION_DENIED,
            Reason.ROLE_NOT_ALLOWED.value,
        )


def test_a_forged_complete_task_with_the_right_counter_is_refused(
    setup: Setup, leased: Leased
) -> None:
    # Everything SearchTasks shows, sent by another worker principal of the same group.
    error = _refusal(
        lambda: leased.complete("worker-b", resolve_root=types_pb2.Payload(data=b'"forged"'))
    )
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
    info = error_info(error)
    assert info.reason == Reason.NOT_THE_TASKS_WORKER.value
    message = error.details()  # type: ignore[attr-defined]
    assert leased.task.id in message and "leased to another principal" in message
    # Nothing about the lease is told to the caller that is not its holder.
    assert leased.worker_id not in message and "worker-a" not in message
    assert leased.root_state() == types_pb2.PROMISE_STATE_PENDING
    # The same with suspend_on (RegisterCallbacks and complete in one).
    assert (
        code_and_reason(lambda: leased.complete("worker-b", suspend_on=[f"{leased.root}.0"]))
        == DENIED
    )
    # An admin may not complete another worker's task either.
    assert (
        code_and_reason(
            lambda: leased.complete("admin-1", resolve_root=types_pb2.Payload(data=b"1"))
        )
        == DENIED
    )
    assert leased.root_state() == types_pb2.PROMISE_STATE_PENDING
    # The rightful worker completes it and settles its workflow.
    done = leased.complete("worker-a", resolve_root=types_pb2.Payload(data=b'"real"'))
    assert done.root.state == types_pb2.PROMISE_STATE_RESOLVED and done.root.value.data == b'"real"'
    assert done.root.settled_by == "worker-a"

    # The workflow's result is audited like any settle (one line; the log is written
    # out every 0.2 s).
    def audited() -> list[dict[str, Any]]:
        lines = [json.loads(x) for x in setup.server.log().splitlines() if "audit.settled" in x]
        return [x for x in lines if x.get("promise_id") == leased.root]

    eventually(lambda: bool(audited()), what="the audit.settled line of the root")
    (line,) = audited()
    assert line["rpc"] == "CompleteTask" and line["principal"] == "worker-a"
    assert line["outcome"] == "RESOLVED" and line["peer"]
    # A repeat by another principal is refused too (the completed task keeps its holder).
    assert (
        code_and_reason(
            lambda: leased.complete("worker-b", resolve_root=types_pb2.Payload(data=b"2"))
        )
        == DENIED
    )


def test_heartbeat_release_and_callbacks_from_another_principal_are_refused(
    setup: Setup, leased: Leased
) -> None:
    tasks, md = setup.tasks, setup.md
    hold = (leased.task.id, leased.task.counter, leased.worker_id)
    heartbeat = tasks_pb2.HeartbeatRequest(worker_id=leased.worker_id, lease=Duration(seconds=30))
    release = tasks_pb2.ReleaseTaskRequest(task_id=hold[0], counter=hold[1], worker_id=hold[2])
    register = tasks_pb2.RegisterCallbacksRequest(
        task_id=hold[0], counter=hold[1], worker_id=hold[2], promise_ids=[leased.root]
    )
    for who in ("worker-b", "admin-1"):
        sent = md[who]
        assert code_and_reason(lambda s=sent: tasks.Heartbeat(heartbeat, metadata=s)) == DENIED
        assert code_and_reason(lambda s=sent: tasks.RegisterCallbacks(register, metadata=s)) == (
            DENIED
        )
    assert code_and_reason(lambda: tasks.ReleaseTask(release, metadata=md["worker-b"])) == DENIED
    # The holder's own calls work.
    beat = tasks.Heartbeat(heartbeat, metadata=md["worker-a"])
    assert list(beat.task_ids) == [leased.task.id]
    assert (
        tasks.ReleaseTask(release, metadata=md["worker-a"]).task.state
        == tasks_pb2.TASK_STATE_PENDING
    )


def test_only_the_holder_fails_a_task_and_only_an_operator_fails_a_workflow(
    setup: Setup, leased: Leased
) -> None:
    tasks, md = setup.tasks, setup.md
    fail = tasks_pb2.FailTaskRequest(
        task_id=leased.task.id,
        counter=leased.task.counter,
        worker_id=leased.worker_id,
        error="NameError: name 'x' is not defined",
        traceback="Traceback (most recent call last): ...",
    )
    for who in ("worker-b", "admin-1"):
        assert code_and_reason(lambda s=md[who]: tasks.FailTask(fail, metadata=s)) == DENIED
    failed = tasks.FailTask(fail, metadata=md["worker-a"], timeout=10).task
    assert (failed.state, failed.failed_attempts) == (tasks_pb2.TASK_STATE_PENDING, 1)
    assert failed.last_error == "NameError: name 'x' is not defined"
    assert leased.root_state() == types_pb2.PROMISE_STATE_PENDING  # a bug pauses the workflow
    # The holder no longer holds it: a repeat is refused like any stale call.
    assert code_and_reason(lambda: tasks.FailTask(fail, metadata=md["worker-a"])) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        Reason.STALE_COUNTER.value,
    )
    request = tasks_pb2.FailWorkflowRequest(id=leased.root, reason="given up on it")
    for who in ("worker-a", "gateway-1"):
        assert code_and_reason(lambda s=md[who]: tasks.FailWorkflow(request, metadata=s)) == (
            grpc.StatusCode.PERMISSION_DENIED,
            Reason.ROLE_NOT_ALLOWED.value,
        )
    root = tasks.FailWorkflow(request, metadata=md["operator-1"], timeout=10).root
    assert (root.state, root.settled_by) == (types_pb2.PROMISE_STATE_REJECTED, "operator-1")
    assert json.loads(root.value.data) == {
        "type": "troth.errors.WorkflowFailed",
        "message": "given up on it",
        "failed_by": "operator-1",
    }
    # Its task, waiting out the backoff, ended with it.
    left = tasks.SearchTasks(
        tasks_pb2.SearchTasksRequest(group=GROUP, root_promise_id=leased.root),
        metadata=md["operator-1"],
    ).tasks
    assert list(left) == []


def test_an_admin_may_release_a_task_it_does_not_hold(setup: Setup, leased: Leased) -> None:
    released = setup.tasks.ReleaseTask(
        tasks_pb2.ReleaseTaskRequest(
            task_id=leased.task.id, counter=leased.task.counter, worker_id="admin-says"
        ),
        metadata=setup.md["admin-1"],
    )
    assert released.task.state == tasks_pb2.TASK_STATE_PENDING
    # Its holder has lost it: the counter moved on when the task is claimed again.
    assert code_and_reason(lambda: leased.complete("worker-a")) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        Reason.STALE_COUNTER.value,
    )


def test_fenced_step_writes_from_another_principal_are_refused(
    setup: Setup, leased: Leased
) -> None:
    promises, md = setup.promises, setup.md
    step = f"{leased.root}.0"

    def create(who: str, n: int = 0, **fields: Any) -> object:
        return promises.CreatePromise(
            promises_pb2.CreatePromiseRequest(
                id=f"{leased.root}.{n}", fence=leased.fence(), **fields
            ),
            metadata=md[who],
            timeout=10,
        )

    def resolve(who: str, promise_id: str) -> object:
        return promises.ResolvePromise(
            promises_pb2.ResolvePromiseRequest(
                id=promise_id, value=types_pb2.Payload(data=b'"x"'), fence=leased.fence()
            ),
            metadata=md[who],
            timeout=10,
        )

    def mint(who: str, promise_id: str) -> object:
        return promises.MintSettleToken(
            promises_pb2.MintSettleTokenRequest(
                promise_id=promise_id,
                outcomes=[types_pb2.PROMISE_STATE_RESOLVED],
                fence=leased.fence(),
            ),
            metadata=md[who],
            timeout=10,
        )

    run_step = {"troth:kind": "run"}
    for who in ("worker-b", "admin-1"):
        assert code_and_reason(lambda who=who: create(who, tags=run_step)) == DENIED
        assert (
            code_and_reason(lambda who=who: create(who, resolved_with=RESULT, tags=run_step))
            == DENIED
        )
    # The holder creates its step; nobody else records its result, or mints its link.
    create("worker-a", tags=run_step)
    for who in ("worker-b", "admin-1"):
        assert code_and_reason(lambda who=who: resolve(who, step)) == DENIED
    create("worker-a", 1, tags={"troth:kind": "promise"})
    assert code_and_reason(lambda: mint("worker-b", f"{leased.root}.1")) == DENIED
    mint("worker-a", f"{leased.root}.1")
    resolve("worker-a", step)
    got = promises.GetPromise(promises_pb2.GetPromiseRequest(id=step), metadata=md["gateway-1"])
    assert (
        got.promise.state == types_pb2.PROMISE_STATE_RESOLVED
        and got.promise.settled_by == "worker-a"
    )


def test_the_holder_whose_grant_no_longer_names_the_group_is_refused(
    setup: Setup, leased: Leased
) -> None:
    # The same principal name, its grant now for another group (a JWT here; a
    # token file reloaded on SIGHUP alike): checked on the writer, with the counter.
    expected = (grpc.StatusCode.PERMISSION_DENIED, Reason.GROUP_NOT_ALLOWED.value)
    assert code_and_reason(lambda: leased.complete("worker-a-elsewhere")) == expected
    assert (
        code_and_reason(
            lambda: setup.promises.CreatePromise(
                promises_pb2.CreatePromiseRequest(id=f"{leased.root}.0", fence=leased.fence()),
                metadata=setup.md["worker-a-elsewhere"],
            )
        )
        == expected
    )
    assert leased.complete("worker-a").task.state == tasks_pb2.TASK_STATE_COMPLETED


def test_another_principals_stream_with_the_same_worker_id_takes_nothing(
    setup: Setup, leased: Leased
) -> None:
    # worker-b opens (and drops) a stream naming worker-a's worker id: worker-a's
    # task is not given back, and worker-a's heartbeat still extends it.
    squat = setup.tasks.Poll(
        tasks_pb2.PollRequest(group=SDK_GROUP, worker_id=leased.worker_id),
        metadata=setup.md["worker-b"],
        timeout=30,
    )
    code, _ = code_and_reason(lambda: opened(squat))  # past the door: it opens
    assert code == grpc.StatusCode.OK
    eventually(
        lambda: any(
            "worker.disconnected" in line and leased.worker_id in line
            for line in setup.server.log().splitlines()
        ),
        what="the squatting stream's disconnect",
    )
    beat = setup.tasks.Heartbeat(
        tasks_pb2.HeartbeatRequest(worker_id=leased.worker_id, lease=Duration(seconds=30)),
        metadata=setup.md["worker-a"],
    )
    assert list(beat.task_ids) == [leased.task.id]
    assert leased.complete("worker-a").task.state == tasks_pb2.TASK_STATE_COMPLETED


def publish(ctx: Context, title: str) -> Generator[Any, Any, str]:
    upper = yield ctx.run(str.upper, title)
    return f"published {upper}"


def test_an_sdk_worker_runs_a_workflow_with_authentication_on(setup: Setup) -> None:
    group_run = f"wf-sdk-{uuid.uuid4().hex[:8]}"
    with (
        Client(setup.server.address, token=setup.tokens["worker-a"]) as worker_client,
        Client(setup.server.address, token=setup.tokens["gateway-1"]) as gateway,
    ):
        worker = Worker(worker_client, group=SDK_GROUP, worker_id=f"sdk-{group_run}")
        worker.workflow(publish)
        worker.start()
        try:
            handle = gateway.start("publish", "notes", id=group_run, group=SDK_GROUP)
            assert handle.result(timeout=30) == "published NOTES"
        finally:
            worker.stop()
    root = setup.promises.GetPromise(
        promises_pb2.GetPromiseRequest(id=group_run), metadata=setup.md["gateway-1"]
    ).promise
    assert root.settled_by == "worker-a"
    step = setup.promises.GetPromise(
        promises_pb2.GetPromiseRequest(id=f"{group_run}.0"), metadata=setup.md["gateway-1"]
    ).promise
    assert step.state == types_pb2.PROMISE_STATE_RESOLVED


def test_with_authentication_off_task_calls_bind_nobody(tmp_path: Any) -> None:
    server = start_server(tmp_path)  # --no-auth
    try:
        with server.channel() as channel:
            promises = promises_pb2_grpc.PromiseServiceStub(channel)
            tasks = tasks_pb2_grpc.TaskServiceStub(channel)
            promises.CreatePromise(
                promises_pb2.CreatePromiseRequest(
                    id="off-1", tags={"troth:invoke": GROUP, "troth:func": "publish"}
                )
            )
            stream = tasks.Poll(
                tasks_pb2.PollRequest(group=GROUP, worker_id="w1"),
                metadata=(("troth-principal", "alice"),),
                timeout=30,
            )
            task = next(stream).task
            assert task.worker_principal == ""
            listed = tasks.SearchTasks(tasks_pb2.SearchTasksRequest(group=GROUP)).tasks
            assert [t.worker_principal for t in listed] == [""]
            # Any caller naming the worker id and counter completes it, as before.
            done = tasks.CompleteTask(
                tasks_pb2.CompleteTaskRequest(
                    task_id=task.id,
                    counter=task.counter,
                    worker_id="w1",
                    resolve_root=types_pb2.Payload(data=b"1"),
                ),
                metadata=(("troth-principal", "bob"),),
            )
            assert done.root.state == types_pb2.PROMISE_STATE_RESOLVED
            stream.cancel()
    finally:
        assert server.stop() == 0, server.log()[-3000:]
