"""The Promises API against an in-memory model of DESIGN §4 (issue 10, item 6).

A Hypothesis state machine drives a live server (SQLite, then PostgreSQL)
from three clients (principals `alice`, `bob` and none): creates (repeats by
id and by idempotency key, strict, ttls, absolute and past expire_times,
never_expires, timers), settles (resolve, reject, cancel, `create_if_missing`,
repeats with the winner's key, strict), racing settles on threads, real short
waits past short ttls, gets and searches (globs, states, tags, orders, small
pages). Every answer is compared with `_promise_model`; a workflow rule checks
that a step's expire_time never exceeds its root's (rule 5).

Each example works under its own id prefix, so examples and the two stores'
runs never see each other's promises. CI runs `CI_EXAMPLES` runs of
`STEPS` steps per store; `TROTH_FUZZ_EXAMPLES=N` runs N. A failure prints the
steps that led to it.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import _promise_model as model
import grpc
import pytest
from _fuzz_settings import fuzz_settings, server_trouble, timeout
from _promise_model import Create, Entry, Query, Settle
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    precondition,
    rule,
    run_state_machine_as_test,
)

from troth.v1 import promises_pb2, promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc, types_pb2

if TYPE_CHECKING:
    from collections.abc import Sequence

    from _support import ServerProcess

CI_EXAMPLES = 8
STEPS = 25
pytestmark = pytest.mark.fuzz

PRINCIPALS = ("alice", "bob", "")
NAMES = ("a", "b", "ab", "a_b", "axb", "a.x")
"""`a_b` and `axb` tell a glob's literal `_` from SQL LIKE's wildcard."""
JSON = {"content-type": "application/json"}
SETTLE_STATES = (model.RESOLVED, model.REJECTED, model.CANCELED)
WAIT_BUDGET_S = 1.5
"""Real time each run may spend waiting for short ttls to pass."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Reply:
    """A call's outcome: the response, or the error's code, reason and message."""

    response: Any = None
    code: grpc.StatusCode = grpc.StatusCode.OK
    reason: str = ""
    message: str = ""
    t0: int = 0
    t1: int = 0

    def outcome(self, ok: str, repeat: str) -> str:
        """The model's name for this outcome (`ok`/`repeat` name the two successes)."""
        if self.code is grpc.StatusCode.OK:
            flag = getattr(self.response, "created", None)
            if flag is None:
                flag = self.response.applied
            return ok if flag else repeat
        if self.code is grpc.StatusCode.FAILED_PRECONDITION:
            return self.reason
        return self.code.name


def _reason(error: grpc.RpcError) -> str:
    status = rpc_status.from_call(error)
    for detail in status.details if status is not None else ():
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return str(info.reason)
    return ""


def call(rpc: Any, request: Any, metadata: tuple[tuple[str, str], ...]) -> Reply:
    t0 = now_ms()
    try:
        response = rpc(request, timeout=30, metadata=metadata)
    except grpc.RpcError as error:
        code: grpc.StatusCode = error.code()
        return Reply(None, code, _reason(error), error.details() or "", t0, now_ms())
    return Reply(response, t0=t0, t1=now_ms())


def fields_of(p: types_pb2.Promise) -> dict[str, object]:
    return {
        "id": p.id,
        "state": types_pb2.PromiseState.Name(p.state).removeprefix("PROMISE_STATE_"),
        "param": p.param.data,
        "value": p.value.data,
        "tags": dict(p.tags),
        "idempotency_key_for_create": p.idempotency_key_for_create,
        "idempotency_key_for_settle": p.idempotency_key_for_settle,
        "settled_by": p.settled_by,
        "create_time": p.create_time.ToMilliseconds(),
        "expire_time": p.expire_time.ToMilliseconds() if p.HasField("expire_time") else None,
        "settle_time": p.settle_time.ToMilliseconds() if p.HasField("settle_time") else None,
    }


def _within(reply: Reply, ms: int, what: str) -> None:
    lo, hi = reply.t0 - model.MARGIN_MS, reply.t1 + model.MARGIN_MS
    assert lo <= ms <= hi, f"{what} {ms} is outside the call's window [{lo}, {hi}]"


EXPIRIES = st.sampled_from(
    (("default", 0), ("ttl", 400), ("ttl", 900), ("ttl", 3_600_000), ("at", 700),
     ("at", 3_600_000), ("past", -60_000), ("never", 0))
)  # fmt: skip
"""(kind, ms): a ttl, or for `at`/`past` an offset from the client's now."""


class PromisesMachine(RuleBasedStateMachine):
    address: ClassVar[str] = ""

    def __init__(self) -> None:
        super().__init__()
        self.prefix = f"m{uuid.uuid4().hex[:10]}"
        self.channels = [grpc.insecure_channel(self.address) for _ in PRINCIPALS]
        self.stubs = [promises_pb2_grpc.PromiseServiceStub(c) for c in self.channels]
        self.entries: dict[str, Entry] = {}
        self.order = 0
        self.waited = 0.0
        self.workflows = 0

    def teardown(self) -> None:
        for channel in self.channels:
            channel.close()

    # --- helpers -------------------------------------------------------------------

    def pid(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def meta(self, client: int) -> tuple[tuple[str, str], ...]:
        who = PRINCIPALS[client]
        return (("troth-principal", who),) if who else ()

    def views(self, pid: str, reply: Reply) -> list[Entry | None]:
        entry = self.entries.get(pid)
        return [None] if entry is None else list(model.views(entry, reply.t0, reply.t1))

    def settle_rpc(self, client: int, state: str) -> Any:
        stub = self.stubs[client]
        return {
            model.RESOLVED: stub.ResolvePromise,
            model.REJECTED: stub.RejectPromise,
            model.CANCELED: stub.CancelPromise,
        }[state]

    def settle_message(self, request: Settle) -> Any:
        value = types_pb2.Payload(headers=JSON, data=request.value)
        common: dict[str, Any] = {
            "id": request.id, "value": value, "idempotency_key": request.ikey or "",
            "strict": request.strict,
        }  # fmt: skip
        if request.state == model.CANCELED:
            return promises_pb2.CancelPromiseRequest(**common)
        cls = (
            promises_pb2.ResolvePromiseRequest
            if request.state == model.RESOLVED
            else promises_pb2.RejectPromiseRequest
        )
        return cls(create_if_missing=request.create_if_missing, **common)

    def matching(self, views: Sequence[Entry | None], promise: types_pb2.Promise) -> Entry:
        got = fields_of(promise)
        diffs = []
        for view in views:
            assert view is not None
            found = model.differences(view, got)
            if not found:
                return view
            diffs.append(found)
        raise AssertionError(f"promise {promise.id!r} matches no model view: {diffs}")

    # --- rules ---------------------------------------------------------------------

    @rule(
        name=st.sampled_from(NAMES),
        client=st.integers(0, len(PRINCIPALS) - 1),
        param=st.sampled_from((b"1", b"2")),
        tags=st.sampled_from(({}, {"team": "x"}, {"team": "y", "k": "v"})),
        timer=st.booleans(),
        ikey=st.sampled_from((None, "k1", "k2")),
        strict=st.booleans(),
        expiry=EXPIRIES,
    )
    def create(
        self,
        name: str,
        client: int,
        param: bytes,
        tags: dict[str, str],
        timer: bool,
        ikey: str | None,
        strict: bool,
        expiry: tuple[str, int],
    ) -> None:
        pid = self.pid(name)
        tags = {**tags, model.TIMER_TAG: "true"} if timer else dict(tags)
        kind, ms = expiry
        message = promises_pb2.CreatePromiseRequest(
            id=pid,
            param=types_pb2.Payload(headers=JSON, data=param),
            tags=tags,
            idempotency_key=ikey or "",
            strict=strict,
        )
        if kind == "ttl":
            message.ttl.CopyFrom(Duration(seconds=ms // 1000, nanos=ms % 1000 * 1_000_000))
        elif kind in ("at", "past"):
            ms = now_ms() + ms
            at = Timestamp()
            at.FromMilliseconds(ms)
            message.expire_time.CopyFrom(at)
        elif kind == "never":
            message.never_expires = True
        request = Create(pid, param, tags, ikey, strict, kind, ms)
        reply = call(self.stubs[client].CreatePromise, message, self.meta(client))
        views = self.views(pid, reply)
        expected = {model.create_outcome(v, request) for v in views}
        actual = reply.outcome("CREATED", "ADOPTED" if views[0] and views[0].early else "REPEAT")
        assert actual in expected, (
            f"create {request} answered {actual} ({reply.code.name} {reply.message!r}); "
            f"the model expects {sorted(expected)} from {views}"
        )
        consistent = [v for v in views if model.create_outcome(v, request) == actual]
        if actual == "CREATED":
            self.created(request, reply.response.promise, reply)
        elif actual == "ADOPTED":
            entry = model.adopted(self.entries[pid], request)
            self.entries[pid] = self.matching([entry], reply.response.promise)
        elif actual == "REPEAT":
            self.entries[pid] = self.matching(consistent, reply.response.promise)
        elif len(consistent) == 1 and consistent[0] is not None:
            self.entries[pid] = consistent[0]

    def created(self, request: Create, promise: types_pb2.Promise, reply: Reply) -> None:
        create_time = promise.create_time.ToMilliseconds()
        _within(reply, create_time, "create_time")
        self.order += 1
        entry = Entry(
            id=request.id,
            order=self.order,
            param=request.param,
            tags=dict(request.tags),
            ikey_create=request.ikey,
            create_time=create_time,
            expire_time=model.expected_expire_time(request, create_time),
        )
        self.entries[request.id] = self.matching([entry], promise)

    @rule(
        name=st.sampled_from(NAMES),
        client=st.integers(0, len(PRINCIPALS) - 1),
        state=st.sampled_from(SETTLE_STATES),
        value=st.sampled_from((b'"v1"', b'"v2"')),
        ikey=st.sampled_from((None, "s1", "s2")),
        strict=st.booleans(),
        create_if_missing=st.booleans(),
    )
    def settle(
        self,
        name: str,
        client: int,
        state: str,
        value: bytes,
        ikey: str | None,
        strict: bool,
        create_if_missing: bool,
    ) -> None:
        pid = self.pid(name)
        cim = create_if_missing and state != model.CANCELED
        request = Settle(pid, state, value, ikey, strict, cim, PRINCIPALS[client])
        reply = call(
            self.settle_rpc(client, state), self.settle_message(request), self.meta(client)
        )
        self.judge_settle(request, reply)

    def judge_settle(self, request: Settle, reply: Reply) -> None:
        views = self.views(request.id, reply)
        expected = {model.settle_outcome(v, request) for v in views}
        actual = reply.outcome("APPLIED", "REPEAT")
        assert actual in expected, (
            f"settle {request} answered {actual} ({reply.code.name} {reply.message!r}); "
            f"the model expects {sorted(expected)} from {views}"
        )
        consistent = [v for v in views if model.settle_outcome(v, request) == actual]
        if actual == "APPLIED":
            self.applied(request, consistent[0], reply)
        elif actual == "REPEAT":
            self.entries[request.id] = self.matching(consistent, reply.response.promise)
        elif actual in ("ALREADY_SETTLED", "TIMED_OUT"):
            view = consistent[0]
            assert view is not None
            if actual == "ALREADY_SETTLED":
                verb = model.VERBS[view.state]
                assert verb in reply.message, f"{reply.message!r} does not say it was {verb}"
                if view.settled_by:
                    assert repr(view.settled_by) in reply.message, reply.message
            if len(consistent) == 1:
                self.entries[request.id] = view

    def applied(self, request: Settle, view: Entry | None, reply: Reply) -> None:
        promise = reply.response.promise
        settle_time = promise.settle_time.ToMilliseconds()
        _within(reply, settle_time, "settle_time")
        if view is None:
            self.order += 1
            entry = model.early(request, self.order, settle_time)
        else:
            entry = model.settled(view, request, settle_time)
        self.entries[request.id] = self.matching([entry], promise)

    @precondition(lambda self: bool(self.entries))
    @rule(
        data=st.data(),
        racers=st.lists(
            st.tuples(
                st.integers(0, len(PRINCIPALS) - 1),
                st.sampled_from(SETTLE_STATES),
                st.sampled_from((None, "r1", "r2", "r3")),
                st.booleans(),
            ),
            min_size=2,
            max_size=4,
        ),
    )
    def race(self, data: st.DataObject, racers: list[tuple[int, str, str | None, bool]]) -> None:
        """Settles of one promise sent at once: exactly one wins (rule 3)."""
        pid = data.draw(st.sampled_from(sorted(self.entries)), label="promise")
        requests = [
            Settle(pid, state, f'"{i}"'.encode(), key, strict, False, PRINCIPALS[client])
            for i, (client, state, key, strict) in enumerate(racers)
        ]
        replies: list[Reply] = [Reply()] * len(requests)
        start = threading.Barrier(len(requests))

        def send(i: int) -> None:
            client = racers[i][0]
            rpc = self.settle_rpc(client, requests[i].state)
            start.wait()
            replies[i] = call(rpc, self.settle_message(requests[i]), self.meta(client))

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(requests))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        window = Reply(t0=min(r.t0 for r in replies), t1=max(r.t1 for r in replies))
        outcomes = [r.outcome("APPLIED", "REPEAT") for r in replies]
        for view in self.views(pid, window):
            assert view is not None
            after = self.race_result(view, requests, replies, outcomes)
            if after is not None:
                self.entries[pid] = after
                return
        raise AssertionError(
            f"racing settles {requests} answered {outcomes}: no view of "
            f"{self.entries[pid]} explains it (exactly one must win)"
        )

    def race_result(
        self, view: Entry, requests: list[Settle], replies: list[Reply], outcomes: list[str]
    ) -> Entry | None:
        """The entry after the race if `view` explains the outcomes, else None."""
        if view.state != model.PENDING:
            wanted = [model.settle_outcome(view, r) for r in requests]
            return view if wanted == outcomes else None
        winners = [i for i, o in enumerate(outcomes) if o == "APPLIED"]
        if len(winners) != 1:
            return None
        won = winners[0]
        promise = replies[won].response.promise
        after = model.settled(view, requests[won], promise.settle_time.ToMilliseconds())
        wanted = [
            "APPLIED" if i == won else model.settle_outcome(after, r)
            for i, r in enumerate(requests)
        ]
        if wanted != outcomes or model.differences(after, fields_of(promise)):
            return None
        return after

    @rule(name=st.sampled_from((*NAMES, "never-made")), client=st.integers(0, 2))
    def get(self, name: str, client: int) -> None:
        pid = self.pid(name)
        reply = call(
            self.stubs[client].GetPromise, promises_pb2.GetPromiseRequest(id=pid), self.meta(client)
        )
        if pid not in self.entries:
            assert reply.code is grpc.StatusCode.NOT_FOUND, (reply.code, reply.message)
            return
        assert reply.code is grpc.StatusCode.OK, (reply.code, reply.message)
        self.entries[pid] = self.matching(self.views(pid, reply), reply.response.promise)

    @rule(
        glob=st.sampled_from(("-*", "-a*", "-a_b", "-*b", "-a*b", "*", "-a.x", "-*x*")),
        states=st.frozensets(st.sampled_from((model.PENDING, *SETTLE_STATES, model.TIMEDOUT))),
        tags=st.sampled_from(({}, {"team": "x"}, {"k": "v"}, {model.TIMER_TAG: "true"})),
        page_size=st.integers(1, 4),
        newest_first=st.booleans(),
        client=st.integers(0, 2),
    )
    def search(
        self,
        glob: str,
        states: frozenset[str],
        tags: dict[str, str],
        page_size: int,
        newest_first: bool,
        client: int,
    ) -> None:
        query = Query(self.prefix + glob, states, tags, newest_first)
        got, window = self.pages(query, page_size, client)
        ids = [p.id for p in got]
        assert len(set(ids)) == len(ids), f"a promise appears twice in one search: {ids}"
        for promise in got:
            assert promise.id in self.entries, f"search {query} found unknown {promise.id!r}"
            views = [v for v in self.views(promise.id, window) if v and query.selects(v)]
            assert views, f"search {query} returned {promise.id!r}, which it does not select"
            self.entries[promise.id] = self.matching(views, promise)
        for entry in self.entries.values():
            if all(query.selects(v) for v in model.views(entry, window.t0, window.t1)):
                assert entry.id in ids, f"search {query} missed {entry}"
        orders = [self.entries[i].order for i in ids]
        assert orders == sorted(orders, reverse=newest_first), f"search {query} order: {ids}"

    def pages(
        self, query: Query, page_size: int, client: int
    ) -> tuple[list[types_pb2.Promise], Reply]:
        order = (
            promises_pb2.PROMISE_ORDER_CREATED_DESC
            if query.newest_first
            else promises_pb2.PROMISE_ORDER_CREATED_ASC
        )
        message = promises_pb2.SearchPromisesRequest(
            id=query.glob,
            states=[
                types_pb2.PromiseState.Value("PROMISE_STATE_" + s) for s in sorted(query.states)
            ],  # type: ignore[misc]
            tags=query.tags,
            page_size=page_size,
            order=order,
        )
        found: list[types_pb2.Promise] = []
        t0 = now_ms()
        for _ in range(100):
            reply = call(self.stubs[client].SearchPromises, message, self.meta(client))
            assert reply.code is grpc.StatusCode.OK, (query, reply.code, reply.message)
            assert len(reply.response.promises) <= page_size
            found.extend(reply.response.promises)
            if not reply.response.next_page_token:
                return found, Reply(t0=t0, t1=now_ms())
            message.page_token = reply.response.next_page_token
        raise AssertionError(f"search {query} did not end after 100 pages")

    @precondition(lambda self: self.waited < WAIT_BUDGET_S)
    @rule(seconds=st.sampled_from((0.3, 0.7)))
    def wait(self, seconds: float) -> None:
        """A real wait, so that short ttls pass (the server's clock is the wall clock's)."""
        time.sleep(seconds)
        self.waited += seconds

    @precondition(lambda self: self.workflows < 1)
    @rule(
        root_ttl_s=st.sampled_from((60, 7200)),
        steps=st.lists(
            st.sampled_from((("default", 0), ("ttl", 30_000), ("ttl", 10_800_000), ("never", 0))),
            min_size=1,
            max_size=3,
        ),
    )
    def workflow(self, root_ttl_s: int, steps: list[tuple[str, int]]) -> None:
        """A step's expire_time never exceeds its root's; the default is min(24 h, root)."""
        self.workflows += 1
        root_id, group = f"w-{self.prefix}", f"g-{self.prefix}"
        stub = self.stubs[0]
        root = stub.CreatePromise(
            promises_pb2.CreatePromiseRequest(
                id=root_id,
                tags={"troth:invoke": group, "troth:func": "modelled"},
                ttl=Duration(seconds=root_ttl_s),
            ),
            timeout=30,
        ).promise
        tasks = tasks_pb2_grpc.TaskServiceStub(self.channels[0])
        stream = tasks.Poll(
            tasks_pb2.PollRequest(group=group, worker_id=f"w-{self.prefix}", capacity=1),
            timeout=30,
        )
        try:
            task = next(stream).task
            assert task.root_promise_id == root_id, task
            fence = types_pb2.TaskFence(
                task_id=task.id, counter=task.counter, worker_id=f"w-{self.prefix}"
            )
            for n, (kind, ms) in enumerate(steps):
                message = promises_pb2.CreatePromiseRequest(id=f"{root_id}.{n}", fence=fence)
                if kind == "ttl":
                    message.ttl.CopyFrom(Duration(seconds=ms // 1000))
                message.never_expires = kind == "never"
                step = stub.CreatePromise(message, timeout=30).promise
                created = step.create_time.ToMilliseconds()
                own = {"default": created + model.DEFAULT_TTL_MS, "ttl": created + ms}.get(kind)
                cap = root.expire_time.ToMilliseconds()
                want = cap if own is None else min(own, cap)
                assert step.expire_time.ToMilliseconds() == want, (kind, ms, step, root)
                read = stub.GetPromise(promises_pb2.GetPromiseRequest(id=step.id), timeout=30)
                assert read.promise.expire_time == step.expire_time
        finally:
            stream.cancel()


@pytest.mark.timeout(timeout(CI_EXAMPLES, 15))
def test_the_promises_api_behaves_as_the_model_of_design_section_4(
    server: ServerProcess,
) -> None:
    PromisesMachine.address = server.address
    try:
        run_state_machine_as_test(
            PromisesMachine, settings=fuzz_settings(CI_EXAMPLES, stateful_step_count=STEPS)
        )
    except BaseException:
        print(f"server log, warnings and slow calls:\n{server_trouble(server.log())}")
        raise
