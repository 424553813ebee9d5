"""The door's matrix: every RPC x every kind of principal x every road, before and after
a revocation, an expiry and a narrowed grant (DESIGN §4 rule 15; issue 26).

The expected answer of each cell comes from the role table of docs/authentication.md, parsed here,
so that the documentation and the server cannot drift apart. Principals, each of
one role: from the token file or a JWT, in four sets — one revoked (its entry
removed, then SIGHUP), one narrowed (its entry given another role and task group,
same key and secret), one whose JWTs expire, and one left alone (the control).

Roads: each RPC as a unary call; each call the `Calls` stream serves, on a stream
opened before the change and on one opened after; and the deliveries of the
long-lived streams opened before the change (`Poll`, `WatchPromise`,
`WatchPromises`, `Calls`): each is ended with the expected reason within a second
or two and delivers nothing after the change, or — when the principal may still
call it — stays open and delivers.

"Allowed" means past the door: any answer but UNAUTHENTICATED or PERMISSION_DENIED
`ROLE_NOT_ALLOWED` / `GROUP_NOT_ALLOWED` (NOT_FOUND for a missing promise, a stream's
initial metadata; what a request names is checked past the door, by rules of its own).
"""

from __future__ import annotations

import queue
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from _auth import bearer, code_and_reason, make_jwt, make_jwt_keys, opened
from _streams import HandCalls, ReadStream, StreamEnded, ended_with
from _support import start_server
from google.protobuf.duration_pb2 import Duration

from troth.v1 import (
    promises_pb2,
    promises_pb2_grpc,
    schedules_pb2,
    tasks_pb2,
    tasks_pb2_grpc,
    types_pb2,
)
from troth_server.api._mux import STREAM_CALLS
from troth_server.app import PROMISES, TASKS
from troth_server.auth import LEEWAY_S, mint

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from _support import ServerProcess

ROLE_TABLE_PAGE = Path(__file__).resolve().parents[2] / "docs" / "authentication.md"
ROLES = ("worker", "gateway", "operator", "admin")
GROUP, OTHER_GROUP = "mx", "mx-elsewhere"
NARROWED_TO = {"worker": "operator", "gateway": "worker", "operator": "gateway", "admin": "worker"}
"""A narrowed principal's new role (a worker's new group is OTHER_GROUP)."""
EXPIRES_IN_S = 8.0
"""The expiring JWTs are accepted this long after they are made (then refused)."""
ENDED_WITHIN_S = 3.0
STREAM_SAFETY_S = 30.0
"""A stream's deadline on the unary road: a safety net, never the answer (`opened`)."""
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
DENIED = grpc.StatusCode.PERMISSION_DENIED
STREAMS = ("Poll", "WatchPromise", "WatchPromises", "Calls")


def readme_roles() -> dict[str, frozenset[str]]:
    """The documentation's role table (docs/authentication.md): RPC -> the roles it marks
    `yes`."""
    text = ROLE_TABLE_PAGE.read_text(encoding="utf-8")
    table = text.split("<!-- roles-table: start", 1)[1].split("<!-- roles-table: end -->", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    header = next(line for line in table.splitlines() if line.startswith("| RPC"))
    columns = [c.strip().strip("`") for c in header.strip("|").split("|")][1:]
    assert tuple(columns) == ROLES, columns
    roles: dict[str, frozenset[str]] = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        match = re.fullmatch(r"`(\w+)`", cells[0])
        assert match, row
        roles[match.group(1)] = frozenset(
            role for role, mark in zip(ROLES, cells[1:], strict=True) if mark == "yes"
        )
    return roles


TABLE = readme_roles()


@dataclass
class Who:
    name: str
    role: str
    kind: str
    """`revoked`, `narrowed`, `expiring` or `control`."""
    metadata: tuple[tuple[str, str], ...]
    groups: tuple[str, ...] = ()
    entry: str = ""

    def expect(self, rpc: str, after: bool) -> tuple[grpc.StatusCode, str] | None:
        """The refusal this principal's call of `rpc` must get (None: allowed)."""
        if after and self.kind == "revoked":
            return (UNAUTHENTICATED, "TOKEN_UNKNOWN")
        if after and self.kind == "expiring":
            return (UNAUTHENTICATED, "TOKEN_EXPIRED")
        role = NARROWED_TO[self.role] if after and self.kind == "narrowed" else self.role
        if role not in TABLE[rpc]:
            return (DENIED, "ROLE_NOT_ALLOWED")
        groups = (OTHER_GROUP,) if after and self.kind == "narrowed" else self.groups
        if rpc == "Poll" and role != "admin" and GROUP not in groups:
            return (DENIED, "GROUP_NOT_ALLOWED")
        return None

    def expect_open(self, rpc: str) -> tuple[grpc.StatusCode, str] | None:
        """How a stream of `rpc` this principal opened before the change ends after it
        (None: it stays open). A watch's reads were decided when it opened: a changed
        grant ends it, to be opened again."""
        want = self.expect(rpc, after=True)
        if want is None and self.kind == "narrowed" and rpc in ("WatchPromise", "WatchPromises"):
            return (DENIED, "GRANT_CHANGED")
        return want


@dataclass
class World:
    server: ServerProcess
    channel: grpc.Channel
    who: list[Who]
    path: Path
    entries: dict[str, str]
    jwt_secret: bytes
    admin: tuple[tuple[str, str], ...]
    wrong: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    workdir = tmp_path_factory.mktemp("door-matrix")
    keys = make_jwt_keys(workdir / "keys")
    who: list[Who] = []
    entries: dict[str, str] = {}
    for kind in ("revoked", "narrowed", "control"):
        for role in ROLES:
            groups = (GROUP,) if role == "worker" else ()
            name = f"{kind}-{role}"
            minted = mint(name, [role], groups)
            entries[name] = minted.entry
            who.append(Who(name, role, kind, bearer(minted.token), groups, minted.entry))
    for role in ROLES:
        groups = [GROUP] if role == "worker" else []
        steady = make_jwt(keys.hs_secret, "HS256", f"jwt-ok-{role}", [role], groups=groups)
        who.append(Who(f"jwt-ok-{role}", role, "control", bearer(steady), tuple(groups)))
    admin = mint("matrix-admin", ["admin"])
    entries["matrix-admin"] = admin.entry
    path = workdir / "tokens.toml"
    path.write_text("\n".join(entries.values()))
    server = start_server(
        workdir,
        "--auth-tokens", str(path),
        "--jwt-key-file", str(keys.hs_file),
        "--jwt-algorithms", "HS256",
    )  # fmt: skip
    try:
        with server.channel() as channel:
            yield World(server, channel, who, path, entries, keys.hs_secret, bearer(admin.token))
    finally:
        assert server.stop() == 0, server.log()[-3000:]


def _unary_calls(channel: grpc.Channel, tag: str) -> dict[str, Callable[[Any], object]]:
    """One minimal call per RPC, taking the metadata to send (streams: their first message)."""
    p = promises_pb2_grpc.PromiseServiceStub(channel)
    t = tasks_pb2_grpc.TaskServiceStub(channel)
    missing = "mx-missing"

    def stream(method: Any, request: Any) -> Callable[[Any], object]:
        # Open, or refused: by the stream's initial metadata (`opened`), never by a
        # deadline, which a refusal answered late on a loaded machine would pass for.
        return lambda md: opened(method(request, metadata=md, timeout=STREAM_SAFETY_S))

    def unary(method: Any, request: Any) -> Callable[[Any], object]:
        return lambda md: method(request, metadata=md, timeout=10)

    return {
        "Calls": stream(t.Calls, iter([_on_stream("Heartbeat", _REQUESTS["Heartbeat"](tag))])),
        "Poll": stream(t.Poll, tasks_pb2.PollRequest(group=GROUP, worker_id=f"w-{tag}")),
        "WatchPromise": stream(p.WatchPromise, promises_pb2.WatchPromiseRequest(id=missing)),
        "WatchPromises": stream(p.WatchPromises, promises_pb2.WatchPromisesRequest(id="mx-*")),
        **{rpc: unary(getattr(p, rpc), build(tag)) for rpc, build in _REQUESTS.items()
           if rpc in {m.name for m in PROMISES.methods}},
        **{rpc: unary(getattr(t, rpc), build(tag)) for rpc, build in _REQUESTS.items()
           if rpc in {m.name for m in TASKS.methods}},
    }  # fmt: skip


_MISSING = "mx-missing"
_REQUESTS: dict[str, Callable[[str], Any]] = {
    "CreatePromise": lambda tag: promises_pb2.CreatePromiseRequest(id=f"mx-new-{tag}"),
    "GetPromise": lambda tag: promises_pb2.GetPromiseRequest(id=_MISSING),
    "SearchPromises": lambda tag: promises_pb2.SearchPromisesRequest(id="mx-none-*"),
    "ResolvePromise": lambda tag: promises_pb2.ResolvePromiseRequest(id=_MISSING),
    "RejectPromise": lambda tag: promises_pb2.RejectPromiseRequest(id=_MISSING),
    "CancelPromise": lambda tag: promises_pb2.CancelPromiseRequest(id=_MISSING),
    "WaitPromise": lambda tag: promises_pb2.WaitPromiseRequest(id=_MISSING),
    "MintSettleToken": lambda tag: promises_pb2.MintSettleTokenRequest(promise_id=_MISSING),
    "WhoAmI": lambda tag: promises_pb2.WhoAmIRequest(),
    "PrunePromises": lambda tag: promises_pb2.PrunePromisesRequest(
        older_than=Duration(seconds=10**8), dry_run=True
    ),
    "CompleteTask": lambda tag: tasks_pb2.CompleteTaskRequest(
        task_id="t-missing", counter=1, worker_id=f"w-{tag}"
    ),
    "Heartbeat": lambda tag: tasks_pb2.HeartbeatRequest(worker_id=f"w-{tag}"),
    "ReleaseTask": lambda tag: tasks_pb2.ReleaseTaskRequest(
        task_id="t-missing", counter=1, worker_id=f"w-{tag}"
    ),
    "RegisterCallbacks": lambda tag: tasks_pb2.RegisterCallbacksRequest(
        task_id="t-missing", counter=1, worker_id=f"w-{tag}", promise_ids=[_MISSING]
    ),
    "SearchTasks": lambda tag: tasks_pb2.SearchTasksRequest(group=GROUP),
    "FailTask": lambda tag: tasks_pb2.FailTaskRequest(
        task_id="t-missing", counter=1, worker_id=f"w-{tag}", error="NameError: x"
    ),
    "FailWorkflow": lambda tag: tasks_pb2.FailWorkflowRequest(id=_MISSING, reason="matrix"),
    "MoveWorkflow": lambda tag: tasks_pb2.MoveWorkflowRequest(id=_MISSING, to_current=True),
    "SearchWorkers": lambda tag: tasks_pb2.SearchWorkersRequest(),
    "SearchWorkflows": lambda tag: tasks_pb2.SearchWorkflowsRequest(id="mx-none-*"),
    "RetryWorkflowNow": lambda tag: tasks_pb2.RetryWorkflowNowRequest(id=_MISSING),
    "GetWorkflowState": lambda tag: tasks_pb2.GetWorkflowStateRequest(
        workflow_id=_MISSING, name="thread"
    ),
    "ReplaceWorkflowState": lambda tag: tasks_pb2.ReplaceWorkflowStateRequest(
        workflow_id=_MISSING, name="thread", value=types_pb2.Payload(data=b"[]")
    ),
    # A create the door lets through is refused after it (a cron that is none): the
    # matrix creates no schedule.
    "CreateSchedule": lambda tag: schedules_pb2.CreateScheduleRequest(
        name=f"mx-s-{tag}", cron="never", workflow="w", group=GROUP
    ),
    "UpdateSchedule": lambda tag: schedules_pb2.UpdateScheduleRequest(
        name=_MISSING, cron="0 * * * *", workflow="w", group=GROUP
    ),
    "GetSchedule": lambda tag: schedules_pb2.GetScheduleRequest(name=_MISSING),
    "SearchSchedules": lambda tag: schedules_pb2.SearchSchedulesRequest(),
    "PauseSchedule": lambda tag: schedules_pb2.PauseScheduleRequest(name=_MISSING),
    "ResumeSchedule": lambda tag: schedules_pb2.ResumeScheduleRequest(name=_MISSING),
    "DeleteSchedule": lambda tag: schedules_pb2.DeleteScheduleRequest(name=_MISSING),
}


def _on_stream(rpc: str, request: Any, call_id: int = 1) -> tasks_pb2.CallsRequest:
    return tasks_pb2.CallsRequest(id=call_id, method=rpc, request=request.SerializeToString())


def _passed_the_door(answer: tuple[grpc.StatusCode, str]) -> bool:
    code, reason = answer
    if code == UNAUTHENTICATED:
        return False
    return not (code == DENIED and reason in ("ROLE_NOT_ALLOWED", "GROUP_NOT_ALLOWED"))


def _judge(world: World, road: str, who: Who, rpc: str, answer: Any, after: bool) -> None:
    want = who.expect(rpc, after)
    if want is None:
        if not _passed_the_door(answer):
            world.wrong.append(f"{road} {who.name} {rpc}: refused {answer}, want allowed")
    elif tuple(answer) != want:
        world.wrong.append(f"{road} {who.name} {rpc}: {answer}, want {want}")


def _error(got: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    return ended_with(got)


def _expiring(world: World) -> list[Who]:
    """A JWT principal of each role whose token is accepted for EXPIRES_IN_S more."""
    made = []
    for role in ROLES:
        groups = [GROUP] if role == "worker" else []
        # exp in the past, within the server's leeway: accepted for EXPIRES_IN_S more.
        ttl = EXPIRES_IN_S - LEEWAY_S
        token = make_jwt(world.jwt_secret, "HS256", f"jwt-{role}", [role], groups=groups, ttl=ttl)
        made.append(Who(f"jwt-{role}", role, "expiring", bearer(token), tuple(groups)))
    return made


def _warm(world: World, who: list[Who]) -> None:
    """One call per principal first: its credential verified once (a scrypt), then cached."""
    p = promises_pb2_grpc.PromiseServiceStub(world.channel)

    def one(w: Who) -> None:
        code_and_reason(
            lambda: p.GetPromise(
                promises_pb2.GetPromiseRequest(id=_MISSING), metadata=w.metadata, timeout=30
            )
        )

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, who))


def _unary_road(world: World, after: bool, who: list[Who] | None = None) -> None:
    cells = [(w, rpc) for w in (world.who if who is None else who) for rpc in TABLE]

    def one(cell: tuple[Who, str]) -> None:
        who, rpc = cell
        tag = f"{who.name}-{rpc}-{int(after)}"
        call = _unary_calls(world.channel, tag)[rpc]
        _judge(world, "unary", who, rpc, code_and_reason(lambda: call(who.metadata)), after)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, cells))


def _calls_road(
    world: World,
    streams: dict[str, HandCalls],
    after: bool,
    road: str,
    who: list[Who] | None = None,
) -> None:
    def one(who: Who) -> None:
        calls = streams[who.name]
        for rpc in STREAM_CALLS:
            try:
                got = calls.send(rpc, _REQUESTS[rpc](f"{who.name}-{rpc}-{road}"))
            except StreamEnded as ended:
                got = _error(ended.error)  # the stream itself was ended: the same answer
            _judge(world, road, who, rpc, got, after)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, world.who if who is None else who))


def _tasks(world: World) -> tasks_pb2_grpc.TaskServiceStub:
    return tasks_pb2_grpc.TaskServiceStub(world.channel)


def _open_streams(world: World) -> dict[tuple[str, str], ReadStream]:
    p = promises_pb2_grpc.PromiseServiceStub(world.channel)
    t = tasks_pb2_grpc.TaskServiceStub(world.channel)
    opened: dict[tuple[str, str], ReadStream] = {}
    for who in world.who:
        if who.expect("Poll", after=False) is None:
            request = tasks_pb2.PollRequest(group=GROUP, worker_id=f"w-{who.name}", capacity=1)
            opened[(who.name, "Poll")] = ReadStream(t.Poll(request, metadata=who.metadata))
        if who.expect("WatchPromise", after=False) is None:
            request_w = promises_pb2.WatchPromiseRequest(id=f"mx-watched-{who.name}")
            opened[(who.name, "WatchPromise")] = ReadStream(
                p.WatchPromise(request_w, metadata=who.metadata)
            )
        if who.expect("WatchPromises", after=False) is None:
            request_ws = promises_pb2.WatchPromisesRequest(id="mx-event-*")
            opened[(who.name, "WatchPromises")] = ReadStream(
                p.WatchPromises(request_ws, metadata=who.metadata)
            )
    return opened


def test_the_readme_table_is_the_servers() -> None:
    from troth_server.domain.access import RPC_ROLES

    served = {m.name for m in PROMISES.methods} | {m.name for m in TASKS.methods}
    assert set(TABLE) == served
    assert {rpc: frozenset(r.value for r in roles) for rpc, roles in RPC_ROLES.items()} == TABLE
    assert set(_unary_calls(grpc.insecure_channel("127.0.0.1:1"), "x")) == served


def test_every_rpc_every_principal_every_road_before_and_after(world: World) -> None:
    p = promises_pb2_grpc.PromiseServiceStub(world.channel)

    def watched(who: Who) -> None:
        """A promise for each principal's WatchPromise: its own (a worker reads only
        its own standalone promises), or, for an operator (who creates none), the admin's."""
        creator = who.metadata if who.role != "operator" else world.admin
        request = promises_pb2.CreatePromiseRequest(id=f"mx-watched-{who.name}")
        p.CreatePromise(request, metadata=creator, timeout=10)

    # Before: the table, on every road (the expiring principals last, made just before).
    _warm(world, world.who)
    for who in world.who:
        watched(who)
    _unary_road(world, after=False)
    before_calls = {who.name: HandCalls(_tasks(world), who.metadata) for who in world.who}
    _calls_road(world, before_calls, after=False, road="calls(before)")
    expiring = _expiring(world)
    made = time.monotonic()
    _warm(world, expiring)
    for who in expiring:
        watched(who)
    _unary_road(world, after=False, who=expiring)
    for who in expiring:
        before_calls[who.name] = HandCalls(_tasks(world), who.metadata)
    _calls_road(world, before_calls, after=False, road="calls(before)", who=expiring)
    world.who += expiring
    opened = _open_streams(world)
    assert world.wrong == [], "\n".join(world.wrong)
    time.sleep(0.3)
    for stream in opened.values():
        stream.drain()  # the watched promise as it is now

    # The changes: revoked entries removed, narrowed entries given another role and
    # group; the expiring JWTs run out on their own.
    entries = dict(world.entries)
    for who in world.who:
        if who.kind == "revoked":
            entries.pop(who.name)
        elif who.kind == "narrowed":
            role = NARROWED_TO[who.role]
            groups = f'groups = ["{OTHER_GROUP}"]\n' if role == "worker" else ""
            lines = [line for line in who.entry.splitlines() if not line.startswith("groups")]
            entries[who.name] = "\n".join(
                f'roles = ["{role}"]\n{groups}'.rstrip("\n") if line.startswith("roles") else line
                for line in lines
            )
    world.path.write_text("\n".join(entries.values()) + "\n")
    world.server.proc.send_signal(signal.SIGHUP)
    remaining = made + EXPIRES_IN_S - time.monotonic()
    assert remaining > 0, "the before phase outlasted the JWTs: raise EXPIRES_IN_S"
    time.sleep(remaining + 1.0)
    changed = time.monotonic()

    # Deliveries after the change: a new task of the group, the watched promise
    # settled, a new promise for the event watchers.
    p.CreatePromise(
        promises_pb2.CreatePromiseRequest(
            id="mx-workflow", tags={"troth:invoke": GROUP, "troth:func": "f"}
        ),
        metadata=world.admin,
    )
    for who in world.who:
        resolve = promises_pb2.ResolvePromiseRequest(id=f"mx-watched-{who.name}")
        p.ResolvePromise(resolve, metadata=world.admin, timeout=10)
    p.CreatePromise(promises_pb2.CreatePromiseRequest(id="mx-event-1"), metadata=world.admin)

    # Every open stream: ended with the expected reason, or still open and delivering.
    for (name, rpc), stream in opened.items():
        who = next(w for w in world.who if w.name == name)
        want = who.expect_open(rpc)
        try:
            got = stream.got.get(timeout=max(0.1, changed + ENDED_WITHIN_S - time.monotonic()))
        except queue.Empty:
            got = None
        if want is None:
            if isinstance(got, grpc.RpcError):
                world.wrong.append(f"open {rpc} of {name}: ended {_error(got)}, want open")
            elif got is None and rpc != "Poll":  # one worker of the group gets the task
                world.wrong.append(f"open {rpc} of {name}: delivered nothing after the change")
        elif not isinstance(got, grpc.RpcError):
            world.wrong.append(f"open {rpc} of {name}: {got!r:.80}, want ended {want}")
        elif _error(got) != want:
            world.wrong.append(f"open {rpc} of {name}: ended {_error(got)}, want {want}")
        stream.call.cancel()

    # The Calls streams opened before: each call as the principal is now; and new ones.
    _calls_road(world, before_calls, after=True, road="calls(opened before)")
    _unary_road(world, after=True)
    after_calls = {who.name: HandCalls(_tasks(world), who.metadata) for who in world.who}
    _calls_road(world, after_calls, after=True, road="calls(opened after)")
    for calls in (*before_calls.values(), *after_calls.values()):
        calls.close()
    assert world.wrong == [], f"{len(world.wrong)} wrong cells:\n" + "\n".join(world.wrong)
