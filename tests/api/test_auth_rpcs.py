"""Every RPC of both services, called with every role and every kind of bad credential.

The server runs with a token file (one principal per role) and an HS256 JWT key.
"allowed" means the call got past authentication and the RPC x role gate: any
answer but UNAUTHENTICATED and PERMISSION_DENIED (NOT_FOUND for a missing
promise, a stream's deadline). The expectation is `domain.access.RPC_ROLES`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc
import pytest
from _auth import Grant, bearer, code_and_reason, first_message, make_jwt, make_jwt_keys, opened
from _auth import write_token_file as write_tokens
from _support import eventually, start_server
from google.protobuf.duration_pb2 import Duration
from grpc_health.v1 import health_pb2, health_pb2_grpc

from troth.v1 import (
    promises_pb2,
    promises_pb2_grpc,
    schedules_pb2,
    tasks_pb2,
    tasks_pb2_grpc,
    types_pb2,
)
from troth_server.app import PROMISES, TASKS
from troth_server.domain.access import RPC_ROLES, Role

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from _support import ServerProcess

ROLES = [role.value for role in Role]
STREAM_WAIT = 10.0


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("auth-walk")
    keys = make_jwt_keys(workdir / "keys")
    grants = [Grant(f"{role}-1", (role,), ("g",) if role == "worker" else ()) for role in ROLES]
    tokens = write_tokens(workdir / "tokens.toml", grants)
    server = start_server(
        workdir,
        "--auth-tokens", str(workdir / "tokens.toml"),
        "--jwt-key-file", str(keys.hs_file),
        "--jwt-algorithms", "HS256",
    )  # fmt: skip
    key_id = tokens["gateway-1"].split("_")[1]
    credentials: dict[str, tuple[tuple[str, str], ...]] = {
        "none": (),
        "malformed": (("authorization", "Basic dXNlcjpwYXNz"),),
        "unknown": bearer("troth_0123456789abcdef_notasecretatall"),
        "bad-secret": bearer(f"troth_{key_id}_wrongsecretwrongsecret"),
        "expired-jwt": bearer(make_jwt(keys.hs_secret, "HS256", "late", ["admin"], ttl=-600)),
        **{role: bearer(tokens[f"{role}-1"]) for role in ROLES},
    }
    try:
        with server.channel() as channel:
            yield {"server": server, "channel": channel, "credentials": credentials}
    finally:
        assert server.stop() == 0, server.log()[-3000:]


REFUSED_BEFORE_AUTH = {
    "none": "CREDENTIALS_MISSING",
    "malformed": "CREDENTIALS_MALFORMED",
    "unknown": "TOKEN_UNKNOWN",
    "bad-secret": "TOKEN_INVALID",
    "expired-jwt": "TOKEN_EXPIRED",
}


def _calls(channel: grpc.Channel, tag: str) -> dict[str, Callable[[Any], object]]:
    """One minimal call per RPC, taking the metadata to send."""
    p = promises_pb2_grpc.PromiseServiceStub(channel)
    t = tasks_pb2_grpc.TaskServiceStub(channel)
    missing = "walk-missing"

    def stream(method: Any, request: Any) -> Callable[[Any], object]:
        return lambda md: opened(method(request, metadata=md, timeout=STREAM_WAIT))

    return {
        "CreatePromise": lambda md: p.CreatePromise(
            promises_pb2.CreatePromiseRequest(id=f"walk-{tag}"), metadata=md, timeout=10
        ),
        "GetPromise": lambda md: p.GetPromise(
            promises_pb2.GetPromiseRequest(id=missing), metadata=md, timeout=10
        ),
        "SearchPromises": lambda md: p.SearchPromises(
            promises_pb2.SearchPromisesRequest(id="walk-*"), metadata=md, timeout=10
        ),
        "ResolvePromise": lambda md: p.ResolvePromise(
            promises_pb2.ResolvePromiseRequest(id=missing), metadata=md, timeout=10
        ),
        "RejectPromise": lambda md: p.RejectPromise(
            promises_pb2.RejectPromiseRequest(id=missing), metadata=md, timeout=10
        ),
        "CancelPromise": lambda md: p.CancelPromise(
            promises_pb2.CancelPromiseRequest(id=missing), metadata=md, timeout=10
        ),
        "WatchPromise": stream(p.WatchPromise, promises_pb2.WatchPromiseRequest(id=missing)),
        "WaitPromise": lambda md: p.WaitPromise(
            promises_pb2.WaitPromiseRequest(id=missing), metadata=md, timeout=10
        ),
        "WatchPromises": stream(p.WatchPromises, promises_pb2.WatchPromisesRequest()),
        "MintSettleToken": lambda md: p.MintSettleToken(
            promises_pb2.MintSettleTokenRequest(promise_id=missing),
            metadata=md,
            timeout=10,
        ),
        "WhoAmI": lambda md: p.WhoAmI(promises_pb2.WhoAmIRequest(), metadata=md, timeout=10),
        "PrunePromises": lambda md: p.PrunePromises(
            promises_pb2.PrunePromisesRequest(older_than=Duration(seconds=10**8), dry_run=True),
            metadata=md,
            timeout=10,
        ),
        "Poll": stream(t.Poll, tasks_pb2.PollRequest(group="g", worker_id=f"w-{tag}", capacity=1)),
        "CompleteTask": lambda md: t.CompleteTask(
            tasks_pb2.CompleteTaskRequest(task_id="t-missing", counter=1, worker_id="w"),
            metadata=md,
            timeout=10,
        ),
        "Heartbeat": lambda md: t.Heartbeat(
            tasks_pb2.HeartbeatRequest(worker_id=f"w-{tag}"), metadata=md, timeout=10
        ),
        "ReleaseTask": lambda md: t.ReleaseTask(
            tasks_pb2.ReleaseTaskRequest(task_id="t-missing", counter=1, worker_id="w"),
            metadata=md,
            timeout=10,
        ),
        "RegisterCallbacks": lambda md: t.RegisterCallbacks(
            tasks_pb2.RegisterCallbacksRequest(
                task_id="t-missing", counter=1, worker_id="w", promise_ids=[missing]
            ),
            metadata=md,
            timeout=10,
        ),
        "SearchTasks": lambda md: t.SearchTasks(
            tasks_pb2.SearchTasksRequest(group="g"), metadata=md, timeout=10
        ),
        "FailTask": lambda md: t.FailTask(
            tasks_pb2.FailTaskRequest(
                task_id="t-missing", counter=1, worker_id="w", error="NameError: x"
            ),
            metadata=md,
            timeout=10,
        ),
        "FailWorkflow": lambda md: t.FailWorkflow(
            tasks_pb2.FailWorkflowRequest(id=missing, reason="walk"), metadata=md, timeout=10
        ),
        "MoveWorkflow": lambda md: t.MoveWorkflow(
            tasks_pb2.MoveWorkflowRequest(id=missing, to_current=True), metadata=md, timeout=10
        ),
        "SearchWorkers": lambda md: t.SearchWorkers(
            tasks_pb2.SearchWorkersRequest(), metadata=md, timeout=10
        ),
        "SearchWorkflows": lambda md: t.SearchWorkflows(
            tasks_pb2.SearchWorkflowsRequest(id="walk-none-*"), metadata=md, timeout=10
        ),
        "RetryWorkflowNow": lambda md: t.RetryWorkflowNow(
            tasks_pb2.RetryWorkflowNowRequest(id=missing), metadata=md, timeout=10
        ),
        "GetWorkflowState": lambda md: t.GetWorkflowState(
            tasks_pb2.GetWorkflowStateRequest(workflow_id=missing, name="thread"),
            metadata=md,
            timeout=10,
        ),
        "ReplaceWorkflowState": lambda md: t.ReplaceWorkflowState(
            tasks_pb2.ReplaceWorkflowStateRequest(
                workflow_id=missing, name="thread", value=types_pb2.Payload(data=b"[]")
            ),
            metadata=md,
            timeout=10,
        ),
        "Calls": lambda md: first_message(
            t.Calls(iter([_heartbeat_on_the_stream(tag)]), metadata=md, timeout=STREAM_WAIT)
        ),
        # A create past the door is refused after it (no cron): the walk creates nothing.
        "CreateSchedule": lambda md: t.CreateSchedule(
            schedules_pb2.CreateScheduleRequest(name=f"walk-{tag}", workflow="w", group="g"),
            metadata=md,
            timeout=10,
        ),
        "UpdateSchedule": lambda md: t.UpdateSchedule(
            schedules_pb2.UpdateScheduleRequest(name=missing, cron="0 * * * *", workflow="w"),
            metadata=md,
            timeout=10,
        ),
        **{
            rpc: _named_schedule_call(getattr(t, rpc), request, missing)
            for rpc, request in (
                ("GetSchedule", schedules_pb2.GetScheduleRequest),
                ("PauseSchedule", schedules_pb2.PauseScheduleRequest),
                ("ResumeSchedule", schedules_pb2.ResumeScheduleRequest),
                ("DeleteSchedule", schedules_pb2.DeleteScheduleRequest),
            )
        },
        "SearchSchedules": lambda md: t.SearchSchedules(
            schedules_pb2.SearchSchedulesRequest(), metadata=md, timeout=10
        ),
    }


def _named_schedule_call(method: Any, request: Any, name: str) -> Callable[[Any], object]:
    return lambda md: method(request(name=name), metadata=md, timeout=10)


def _heartbeat_on_the_stream(tag: str) -> tasks_pb2.CallsRequest:
    heartbeat = tasks_pb2.HeartbeatRequest(worker_id=f"w-{tag}")
    return tasks_pb2.CallsRequest(id=1, method="Heartbeat", request=heartbeat.SerializeToString())


def test_the_table_names_every_rpc_of_both_services() -> None:
    served = {m.name for m in PROMISES.methods} | {m.name for m in TASKS.methods}
    assert set(RPC_ROLES) == served
    assert set(_calls(grpc.insecure_channel("127.0.0.1:1"), "x")) == served


@pytest.mark.parametrize("rpc", list(RPC_ROLES))
def test_every_rpc_with_every_credential(setup: dict[str, Any], rpc: str) -> None:
    wrong: list[str] = []
    for name, metadata in setup["credentials"].items():
        call = _calls(setup["channel"], f"{rpc}-{name}")[rpc]
        code, reason = code_and_reason(lambda: call(metadata))  # noqa: B023
        if name in REFUSED_BEFORE_AUTH:
            if (code, reason) != (grpc.StatusCode.UNAUTHENTICATED, REFUSED_BEFORE_AUTH[name]):
                wrong.append(f"{name}: {code.name} {reason}, want UNAUTHENTICATED")
            continue
        allowed = Role(name) in RPC_ROLES[rpc]
        refused = code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
        if allowed and refused:
            wrong.append(f"{name}: refused {code.name} {reason}, but the table allows it")
        if not allowed and (code, reason) != (
            grpc.StatusCode.PERMISSION_DENIED,
            "ROLE_NOT_ALLOWED",
        ):
            wrong.append(f"{name}: {code.name} {reason}, want PERMISSION_DENIED ROLE_NOT_ALLOWED")
    assert wrong == [], f"{rpc}: " + "; ".join(wrong)


def test_a_role_refusal_names_the_rpc_the_principal_and_the_roles_that_may(
    setup: dict[str, Any],
) -> None:
    stub = promises_pb2_grpc.PromiseServiceStub(setup["channel"])
    with pytest.raises(grpc.RpcError) as caught:
        stub.CancelPromise(
            promises_pb2.CancelPromiseRequest(id="walk-missing"),
            metadata=setup["credentials"]["gateway"],
            timeout=10,
        )
    message = caught.value.details()  # type: ignore[attr-defined]
    assert "CancelPromise" in message
    assert "'gateway-1'" in message
    assert "admin, operator" in message


def test_a_worker_polls_only_the_groups_its_grant_names(setup: dict[str, Any]) -> None:
    stub = tasks_pb2_grpc.TaskServiceStub(setup["channel"])
    worker = setup["credentials"]["worker"]
    code, reason = code_and_reason(
        lambda: opened(
            stub.Poll(
                tasks_pb2.PollRequest(group="other", worker_id="w-x", capacity=1),
                metadata=worker,
                timeout=STREAM_WAIT,
            )
        )
    )
    assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "GROUP_NOT_ALLOWED")
    # The admin may poll any group.
    poll = stub.Poll(
        tasks_pb2.PollRequest(group="other", worker_id="w-y", capacity=1),
        metadata=setup["credentials"]["admin"],
        timeout=STREAM_WAIT,
    )
    assert opened(poll) == "opened"


def test_health_and_reflection_stay_open(setup: dict[str, Any]) -> None:
    channel = setup["channel"]
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    answers = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
    )
    names = {s.name for a in answers for s in a.list_services_response.service}
    assert "troth.v1.PromiseService" in names


def test_every_refusal_is_logged_once_without_the_token(setup: dict[str, Any]) -> None:
    server: ServerProcess = setup["server"]
    stub = promises_pb2_grpc.PromiseServiceStub(setup["channel"])
    token = "troth_0123456789abcdef_auditsecretauditsecret"
    code_and_reason(
        lambda: stub.GetPromise(
            promises_pb2.GetPromiseRequest(id="audit-1"), metadata=bearer(token), timeout=10
        )
    )

    def refusals() -> list[str]:
        lines = [line for line in server.log().splitlines() if "auth.refused" in line]
        return [line for line in lines if "TOKEN_UNKNOWN" in line and "GetPromise" in line]

    # The server writes its log out every 0.2 s (troth_server._logging).
    eventually(lambda: bool(refusals()), timeout=5, what="the auth.refused line")
    unknown = refusals()
    assert "peer" in unknown[-1] and "127.0.0.1" in unknown[-1]
    assert "auditsecret" not in server.log()


STREAM_CALLS_BY_ROLE = {
    # role: (a call it may not make, one it may: NOT_FOUND past the gate)
    "worker": (
        ("SearchPromises", promises_pb2.SearchPromisesRequest(id="walk-*")),
        ("GetPromise", promises_pb2.GetPromiseRequest(id="walk-missing")),
    ),
    "gateway": (
        ("CancelPromise", promises_pb2.CancelPromiseRequest(id="walk-missing")),
        ("ResolvePromise", promises_pb2.ResolvePromiseRequest(id="walk-missing")),
    ),
    "operator": (
        ("ResolvePromise", promises_pb2.ResolvePromiseRequest(id="walk-missing")),
        ("CancelPromise", promises_pb2.CancelPromiseRequest(id="walk-missing")),
    ),
}


@pytest.mark.parametrize("role", sorted(STREAM_CALLS_BY_ROLE))
def test_each_call_on_the_calls_stream_is_authorized_as_its_own_rpc(
    setup: dict[str, Any], role: str
) -> None:
    """Every role may open the stream (a client's calls go on it too), but not make
    through it a call it may not make."""
    stub = tasks_pb2_grpc.TaskServiceStub(setup["channel"])
    refused, allowed = STREAM_CALLS_BY_ROLE[role]
    requests = [
        tasks_pb2.CallsRequest(id=n, method=method, request=request.SerializeToString())
        for n, (method, request) in enumerate((refused, allowed), start=1)
    ]
    answers = {
        a.id: a for a in stub.Calls(iter(requests), metadata=setup["credentials"][role], timeout=10)
    }
    assert answers[1].code == grpc.StatusCode.PERMISSION_DENIED.value[0]
    assert f"may not call {refused[0]}" in answers[1].message
    assert b"ROLE_NOT_ALLOWED" in answers[1].status_details
    assert answers[2].code == grpc.StatusCode.NOT_FOUND.value[0]
    assert "auth.refused" in setup["server"].log()
