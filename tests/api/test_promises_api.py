"""Every RPC of troth.v1.PromiseService against a real server process: results and error reasons."""

from __future__ import annotations

import threading
import time
import uuid

import grpc
import pytest
from _support import ServerProcess, error_info, start_server
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from troth.v1 import promises_pb2 as pb
from troth.v1 import promises_pb2_grpc
from troth.v1 import types_pb2 as types

JSON = {"content-type": "application/json"}


def uid(prefix: str = "p") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def payload(data: bytes) -> types.Payload:
    return types.Payload(headers=JSON, data=data)


def fails(call: object, request: object, code: grpc.StatusCode, reason: str) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(request)  # type: ignore[operator]
    error = caught.value
    assert error.code() == code, error.details()
    info = error_info(error)
    assert info.reason == reason
    assert info.domain == "troth.dev"
    return error


# --- create ---------------------------------------------------------------------------


def test_create_returns_the_promise_with_default_expiry(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    pid = uid()
    reply = stub.CreatePromise(
        pb.CreatePromiseRequest(id=pid, param=payload(b'{"n": 1}'), tags={"team": "a"})
    )
    assert reply.created
    p = reply.promise
    assert (p.id, p.state, p.param.data, dict(p.param.headers)) == (
        pid,
        types.PROMISE_STATE_PENDING,
        b'{"n": 1}',
        JSON,
    )
    assert dict(p.tags) == {"team": "a"}
    assert not p.HasField("settle_time")
    ttl = p.expire_time.ToMilliseconds() - p.create_time.ToMilliseconds()
    assert ttl == 24 * 3600 * 1000
    assert stub.GetPromise(pb.GetPromiseRequest(id=pid)).promise == p


def test_a_json_param_is_stored_as_the_codecs_json_and_nan_is_refused(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    from google.protobuf import struct_pb2

    pid = uid()
    value = struct_pb2.Value()
    value.struct_value.update({"big": 2.0**53, "past": 2.0**53 * 4 + 0.0, "half": 0.5})
    created = stub.CreatePromise(pb.CreatePromiseRequest(id=pid, param=types.Payload(json=value)))
    # Whole numbers a double holds exactly come back as integers; beyond 2**53 a double
    # is what was sent. Keys are sorted (a protobuf map keeps no order).
    assert (
        created.promise.param.data
        == b'{"big":9007199254740992,"half":0.5,"past":3.602879701896397e+16}'
    )
    assert dict(created.promise.param.headers) == JSON
    assert not created.promise.param.HasField("json")
    nan = types.Payload(json=struct_pb2.Value(number_value=float("nan")))
    error = fails(
        stub.CreatePromise, pb.CreatePromiseRequest(id=uid(), param=nan),
        grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT",
    )  # fmt: skip
    assert "param.json" in (error.details() or "") and "NaN" in (error.details() or "")


def test_create_with_ttl_expire_time_and_never_expires(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    a = stub.CreatePromise(pb.CreatePromiseRequest(id=uid(), ttl=Duration(seconds=90))).promise
    assert a.expire_time.ToMilliseconds() - a.create_time.ToMilliseconds() == 90_000
    at = Timestamp()
    at.FromMilliseconds(int(time.time() * 1000) + 3_600_000)
    b = stub.CreatePromise(pb.CreatePromiseRequest(id=uid(), expire_time=at)).promise
    assert b.expire_time == at
    c = stub.CreatePromise(pb.CreatePromiseRequest(id=uid(), never_expires=True)).promise
    assert not c.HasField("expire_time")


def test_create_is_idempotent_by_id(stub: promises_pb2_grpc.PromiseServiceStub) -> None:
    pid = uid()
    request = pb.CreatePromiseRequest(id=pid, param=payload(b"1"), tags={"k": "v"})
    first = stub.CreatePromise(request)
    again = stub.CreatePromise(request)
    assert first.created and not again.created
    assert again.promise == first.promise
    fails(
        stub.CreatePromise,
        pb.CreatePromiseRequest(id=pid, param=payload(b"2"), tags={"k": "v"}),
        grpc.StatusCode.ALREADY_EXISTS,
        "ALREADY_EXISTS",
    )


def test_create_with_idempotency_key(stub: promises_pb2_grpc.PromiseServiceStub) -> None:
    pid = uid()
    first = stub.CreatePromise(pb.CreatePromiseRequest(id=pid, idempotency_key="k1"))
    # The key identifies the request: a different param with the same key is a repeat.
    again = stub.CreatePromise(
        pb.CreatePromiseRequest(id=pid, idempotency_key="k1", param=payload(b"other"))
    )
    assert first.created and not again.created
    assert again.promise.idempotency_key_for_create == "k1"
    for other in ("k2", ""):
        fails(
            stub.CreatePromise,
            pb.CreatePromiseRequest(id=pid, idempotency_key=other),
            grpc.StatusCode.ALREADY_EXISTS,
            "ALREADY_EXISTS",
        )


def test_strict_create_of_a_settled_promise_is_refused(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    pid = uid()
    stub.CreatePromise(pb.CreatePromiseRequest(id=pid, idempotency_key="k"))
    stub.ResolvePromise(pb.ResolvePromiseRequest(id=pid))
    lenient = stub.CreatePromise(pb.CreatePromiseRequest(id=pid, idempotency_key="k"))
    assert not lenient.created and lenient.promise.state == types.PROMISE_STATE_RESOLVED
    fails(
        stub.CreatePromise,
        pb.CreatePromiseRequest(id=pid, idempotency_key="k", strict=True),
        grpc.StatusCode.ALREADY_EXISTS,
        "ALREADY_EXISTS",
    )


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (pb.CreatePromiseRequest(id=""), "id"),
        (pb.CreatePromiseRequest(id="has space"), "id"),
        (pb.CreatePromiseRequest(id="star*"), "id"),
        (pb.CreatePromiseRequest(id="x" * 257), "id"),
        (pb.CreatePromiseRequest(id="ok", ttl=Duration(seconds=-1)), "ttl"),
        (pb.CreatePromiseRequest(id="ok", ttl=Duration(seconds=0)), "ttl"),
        (pb.CreatePromiseRequest(id="ok", ttl=Duration(seconds=400 * 86400)), "ttl"),
        (
            pb.CreatePromiseRequest(id="ok", ttl=Duration(seconds=5), never_expires=True),
            "never_expires",
        ),
        (pb.CreatePromiseRequest(id="ok", expire_time=Timestamp(seconds=1000)), "expire_time"),
        (
            pb.CreatePromiseRequest(id="ok", expire_time=Timestamp(seconds=4102444800 * 2)),
            "expire_time",
        ),
        (pb.CreatePromiseRequest(id="ok", param=payload(b"x" * (1_048_577))), "param"),
        (pb.CreatePromiseRequest(id="ok", tags={f"k{i}": "v" for i in range(33)}), "tags"),
        (pb.CreatePromiseRequest(id="ok", tags={"": "v"}), "tags"),
        (pb.CreatePromiseRequest(id="ok", tags={"k": "v" * 1025}), "tags[k]"),
        (pb.CreatePromiseRequest(id="ok", idempotency_key="k" * 257), "idempotency_key"),
    ],
)
def test_create_rejects_bad_input_naming_the_field(
    stub: promises_pb2_grpc.PromiseServiceStub, request_: pb.CreatePromiseRequest, field: str
) -> None:
    error = fails(
        stub.CreatePromise, request_, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"
    )
    assert error_info(error).metadata["field"] == field
    assert field.split("[")[0] in (error.details() or "")


# --- get ------------------------------------------------------------------------------


def test_get_missing_and_invalid(stub: promises_pb2_grpc.PromiseServiceStub) -> None:
    error = fails(
        stub.GetPromise, pb.GetPromiseRequest(id=uid()), grpc.StatusCode.NOT_FOUND, "NOT_FOUND"
    )
    assert "does not exist" in (error.details() or "")
    fails(
        stub.GetPromise,
        pb.GetPromiseRequest(id=""),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
    )


# --- settle ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "request_type", "state"),
    [
        ("ResolvePromise", pb.ResolvePromiseRequest, types.PROMISE_STATE_RESOLVED),
        ("RejectPromise", pb.RejectPromiseRequest, types.PROMISE_STATE_REJECTED),
        ("CancelPromise", pb.CancelPromiseRequest, types.PROMISE_STATE_REJECTED_CANCELED),
    ],
)
def test_settle_once(
    stub: promises_pb2_grpc.PromiseServiceStub, method: str, request_type: type, state: int
) -> None:
    pid = uid()
    stub.CreatePromise(pb.CreatePromiseRequest(id=pid))
    call = getattr(stub, method)
    reply = call(
        request_type(id=pid, value=payload(b'{"ok": true}'), idempotency_key="win"),
        metadata=[("troth-principal", "alice")],
    )
    assert reply.applied
    p = reply.promise
    assert p.state == state and p.value.data == b'{"ok": true}'
    assert p.settled_by == "alice" and p.idempotency_key_for_settle == "win"
    assert p.HasField("settle_time")
    # The winner's key again: success, not applied, the promise as settled.
    repeat = call(request_type(id=pid, value=payload(b"ignored"), idempotency_key="win"))
    assert not repeat.applied and repeat.promise == p
    # Anyone else: told it was already settled, and how.
    error = fails(
        call, request_type(id=pid, idempotency_key="lose"),
        grpc.StatusCode.FAILED_PRECONDITION, "ALREADY_SETTLED",
    )  # fmt: skip
    assert "alice" in (error.details() or "")
    # ErrorInfo names the state as troth.PromiseState does (RESOLVED, not the enum value's
    # PROMISE_STATE_RESOLVED).
    assert error_info(error).metadata["state"] == types.PromiseState.Name(state).removeprefix(
        "PROMISE_STATE_"
    )
    assert stub.GetPromise(pb.GetPromiseRequest(id=pid)).promise == p


def test_strict_repeat_must_ask_for_the_same_state(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    pid = uid()
    stub.CreatePromise(pb.CreatePromiseRequest(id=pid))
    stub.ResolvePromise(pb.ResolvePromiseRequest(id=pid, idempotency_key="k"))
    lenient = stub.RejectPromise(pb.RejectPromiseRequest(id=pid, idempotency_key="k"))
    assert not lenient.applied and lenient.promise.state == types.PROMISE_STATE_RESOLVED
    fails(
        stub.RejectPromise,
        pb.RejectPromiseRequest(id=pid, idempotency_key="k", strict=True),
        grpc.StatusCode.FAILED_PRECONDITION,
        "ALREADY_SETTLED",
    )


def test_settle_missing_and_invalid(stub: promises_pb2_grpc.PromiseServiceStub) -> None:
    for settle, request in ((stub.ResolvePromise, pb.ResolvePromiseRequest(id=uid())),
                            (stub.RejectPromise, pb.RejectPromiseRequest(id=uid()))):  # fmt: skip
        unknown = fails(settle, request, grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
        # It says how to settle before the wait exists (issue 28).
        assert "create_if_missing" in unknown.details(), unknown.details()
        assert "--create-if-missing" in unknown.details(), unknown.details()
    pid = uid()
    stub.CreatePromise(pb.CreatePromiseRequest(id=pid))
    error = fails(
        stub.RejectPromise,
        pb.RejectPromiseRequest(id=pid, value=payload(b"x" * 1_048_577)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
    )
    assert error_info(error).metadata["field"] == "value"
    assert (
        stub.GetPromise(pb.GetPromiseRequest(id=pid)).promise.state == types.PROMISE_STATE_PENDING
    )
    bad_principal = [("troth-principal", "p" * 300)]
    with pytest.raises(grpc.RpcError) as caught:
        stub.CancelPromise(pb.CancelPromiseRequest(id=pid), metadata=bad_principal)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).metadata["field"] == "troth-principal"


# --- timeouts -------------------------------------------------------------------------


def test_timeout_is_exact_on_read_and_settle(tmp_path_factory: pytest.TempPathFactory) -> None:
    # A server whose sweeper effectively never runs: reads alone must show the timeout.
    server = start_server(tmp_path_factory.mktemp("nosweep"), "--sweep-interval", "1h")
    try:
        with server.channel() as channel:
            stub = promises_pb2_grpc.PromiseServiceStub(channel)
            pid, timer = uid(), uid("timer")
            stub.CreatePromise(pb.CreatePromiseRequest(id=pid, ttl=Duration(nanos=300_000_000)))
            stub.CreatePromise(
                pb.CreatePromiseRequest(
                    id=timer, ttl=Duration(nanos=300_000_000), tags={"troth:timer": "true"}
                )
            )
            created = stub.GetPromise(pb.GetPromiseRequest(id=pid)).promise
            # The timer was created after `pid`, so it expires a little later: wait for both.
            timer_created = stub.GetPromise(pb.GetPromiseRequest(id=timer)).promise
            due = max(
                created.expire_time.ToMilliseconds(), timer_created.expire_time.ToMilliseconds()
            )
            while time.time() * 1000 < due:
                time.sleep(0.05)
            got = stub.GetPromise(pb.GetPromiseRequest(id=pid)).promise
            assert got.state == types.PROMISE_STATE_REJECTED_TIMEDOUT
            assert got.settle_time == got.expire_time
            assert got.settled_by == "troth:timeout"
            assert (
                stub.GetPromise(pb.GetPromiseRequest(id=timer)).promise.state
                == types.PROMISE_STATE_RESOLVED
            )
            found = stub.SearchPromises(
                pb.SearchPromisesRequest(id=pid, states=[types.PROMISE_STATE_PENDING])
            ).promises
            assert list(found) == []
            found = stub.SearchPromises(
                pb.SearchPromisesRequest(id=pid, states=[types.PROMISE_STATE_REJECTED_TIMEDOUT])
            ).promises
            assert [p.id for p in found] == [pid]
            error = fails(
                stub.ResolvePromise, pb.ResolvePromiseRequest(id=pid),
                grpc.StatusCode.FAILED_PRECONDITION, "TIMED_OUT",
            )  # fmt: skip
            assert "timed out" in (error.details() or "")
            fails(
                stub.RejectPromise, pb.RejectPromiseRequest(id=timer),
                grpc.StatusCode.FAILED_PRECONDITION, "TIMED_OUT",
            )  # fmt: skip
    finally:
        server.stop()


# --- search ---------------------------------------------------------------------------


def test_search_by_glob_state_and_tags(stub: promises_pb2_grpc.PromiseServiceStub) -> None:
    run = uid("s")
    ids = [f"{run}.order_{i}" for i in range(6)]
    for i, pid in enumerate(ids):
        stub.CreatePromise(
            pb.CreatePromiseRequest(id=pid, tags={"parity": "even" if i % 2 == 0 else "odd"})
        )
    stub.CreatePromise(pb.CreatePromiseRequest(id=f"{run}.orderX9"))
    for pid in ids[:2]:
        stub.ResolvePromise(pb.ResolvePromiseRequest(id=pid))

    def search(**kw: object) -> list[str]:
        return [p.id for p in stub.SearchPromises(pb.SearchPromisesRequest(**kw)).promises]

    # `_` is literal, not a one-character wildcard: .orderX9 does not match .order_*
    assert search(id=f"{run}.order_*") == ids
    assert search(id=f"{run}.*", states=[types.PROMISE_STATE_RESOLVED]) == ids[:2]
    assert search(
        id=f"{run}.order_*", states=[types.PROMISE_STATE_PENDING], tags={"parity": "even"}
    ) == [
        ids[2],
        ids[4],
    ]
    assert search(id=f"{run}.order_*", tags={"parity": "none"}) == []
    assert search(id=f"*{ids[3][-8:]}") == [ids[3]]


def test_search_pagination_is_stable_under_concurrent_inserts(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    run = uid("page")
    for i in range(25):
        stub.CreatePromise(pb.CreatePromiseRequest(id=f"{run}.p{i:03}"))
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        reply = stub.SearchPromises(
            pb.SearchPromisesRequest(id=f"{run}.*", page_size=10, page_token=token)
        )
        seen.extend(p.id for p in reply.promises)
        pages += 1
        # Inserts during paging appear after what was already there, never shifting it.
        stub.CreatePromise(pb.CreatePromiseRequest(id=f"{run}.new{pages}"))
        token = reply.next_page_token
        if not token:
            break
    assert seen[:25] == [f"{run}.p{i:03}" for i in range(25)]
    assert len(seen) == len(set(seen))
    assert set(seen[25:]) <= {f"{run}.new{i}" for i in range(1, pages + 1)}


def test_search_rejects_bad_input(stub: promises_pb2_grpc.PromiseServiceStub) -> None:
    for n in range(2):  # a second page to have a token for, whatever ran before
        stub.CreatePromise(pb.CreatePromiseRequest(id=f"search-bad-input-{n}"))
    reply = stub.SearchPromises(pb.SearchPromisesRequest(id="*", page_size=1))
    assert reply.next_page_token
    error = fails(
        stub.SearchPromises,
        pb.SearchPromisesRequest(id="other*", page_size=1, page_token=reply.next_page_token),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_PAGE_TOKEN",
    )
    assert "different search" in (error.details() or "")
    fails(
        stub.SearchPromises,
        pb.SearchPromisesRequest(page_token="not a token!"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_PAGE_TOKEN",
    )
    for request, field in [
        (pb.SearchPromisesRequest(page_size=1001), "page_size"),
        (pb.SearchPromisesRequest(page_size=-1), "page_size"),
        (pb.SearchPromisesRequest(states=[99]), "states"),  # type: ignore[list-item]
        (pb.SearchPromisesRequest(id="a b*"), "id"),
    ]:
        error = fails(
            stub.SearchPromises, request, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"
        )
        assert error_info(error).metadata["field"] == field


# --- watch ----------------------------------------------------------------------------


def test_watch_sends_current_then_settled_and_ends(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    pid = uid()
    stub.CreatePromise(pb.CreatePromiseRequest(id=pid))
    stream = stub.WatchPromise(pb.WatchPromiseRequest(id=pid), timeout=20)
    first = next(stream)
    assert first.promise.state == types.PROMISE_STATE_PENDING
    threading.Timer(
        0.2, lambda: stub.ResolvePromise(pb.ResolvePromiseRequest(id=pid, value=payload(b"7")))
    ).start()
    second = next(stream)
    assert (
        second.promise.state == types.PROMISE_STATE_RESOLVED and second.promise.value.data == b"7"
    )
    assert list(stream) == []


def test_watch_of_a_settled_promise_sends_it_once(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    pid = uid()
    stub.CreatePromise(pb.CreatePromiseRequest(id=pid))
    stub.CancelPromise(pb.CancelPromiseRequest(id=pid))
    replies = list(stub.WatchPromise(pb.WatchPromiseRequest(id=pid), timeout=20))
    assert [r.promise.state for r in replies] == [types.PROMISE_STATE_REJECTED_CANCELED]


def test_watch_sees_a_timeout(stub: promises_pb2_grpc.PromiseServiceStub) -> None:
    pid = uid()
    stub.CreatePromise(pb.CreatePromiseRequest(id=pid, ttl=Duration(nanos=400_000_000)))
    started = time.monotonic()
    replies = list(stub.WatchPromise(pb.WatchPromiseRequest(id=pid), timeout=20))
    assert [r.promise.state for r in replies] == [
        types.PROMISE_STATE_PENDING,
        types.PROMISE_STATE_REJECTED_TIMEDOUT,
    ]
    assert time.monotonic() - started < 5


def test_watch_errors(stub: promises_pb2_grpc.PromiseServiceStub) -> None:
    for request, code, reason in [
        (pb.WatchPromiseRequest(id=uid()), grpc.StatusCode.NOT_FOUND, "NOT_FOUND"),
        (pb.WatchPromiseRequest(id="bad id"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"),
    ]:
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.WatchPromise(request, timeout=10))
        assert caught.value.code() == code
        assert error_info(caught.value).reason == reason


def test_a_cancelled_watch_frees_the_server(
    stub: promises_pb2_grpc.PromiseServiceStub, server: ServerProcess
) -> None:
    # More abandoned watches than handler threads: the server must still answer.
    pid = uid()
    stub.CreatePromise(pb.CreatePromiseRequest(id=pid))
    for _ in range(150):
        stream = stub.WatchPromise(pb.WatchPromiseRequest(id=pid))
        next(stream)
        stream.cancel()
    assert (
        stub.GetPromise(pb.GetPromiseRequest(id=pid), timeout=10).promise.state
        == types.PROMISE_STATE_PENDING
    )


# --- wait (a long poll) ---------------------------------------------------------------


def wait_request(pid: str, seconds: float | None = None) -> pb.WaitPromiseRequest:
    request = pb.WaitPromiseRequest(id=pid)
    if seconds is not None:
        request.wait.FromMilliseconds(round(seconds * 1000))
    return request


def test_wait_answers_as_soon_as_the_promise_settles(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    pid = uid()
    stub.CreatePromise(pb.CreatePromiseRequest(id=pid))
    settle = threading.Timer(
        0.3, lambda: stub.ResolvePromise(pb.ResolvePromiseRequest(id=pid, value=payload(b"7")))
    )
    settle.start()
    started = time.monotonic()
    try:
        reply = stub.WaitPromise(wait_request(pid, 30), timeout=40)
    finally:
        settle.join()
    assert reply.promise.state == types.PROMISE_STATE_RESOLVED and reply.promise.value.data == b"7"
    assert 0.25 < time.monotonic() - started < 10


def test_wait_answers_the_pending_promise_once_its_wait_has_passed(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    pid = uid()
    stub.CreatePromise(pb.CreatePromiseRequest(id=pid))
    started = time.monotonic()
    reply = stub.WaitPromise(wait_request(pid, 0.4), timeout=20)
    assert reply.promise.state == types.PROMISE_STATE_PENDING and reply.promise.id == pid
    assert 0.35 < time.monotonic() - started < 5
    # A wait of 0 is a read.
    started = time.monotonic()
    assert stub.WaitPromise(wait_request(pid, 0), timeout=20).promise.state == (
        types.PROMISE_STATE_PENDING
    )
    assert time.monotonic() - started < 2


def test_wait_answers_pending_before_the_calls_own_deadline(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    pid = uid()
    stub.CreatePromise(pb.CreatePromiseRequest(id=pid))
    started = time.monotonic()
    # No `wait`: up to a minute, but the caller gives the call 1.5 s.
    reply = stub.WaitPromise(wait_request(pid), timeout=1.5)
    assert reply.promise.state == types.PROMISE_STATE_PENDING
    assert 0.5 < time.monotonic() - started < 1.5


def test_wait_of_a_settled_promise_answers_at_once(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    pid = uid()
    stub.CreatePromise(pb.CreatePromiseRequest(id=pid))
    stub.CancelPromise(pb.CancelPromiseRequest(id=pid))
    started = time.monotonic()
    reply = stub.WaitPromise(wait_request(pid, 60), timeout=20)
    assert reply.promise.state == types.PROMISE_STATE_REJECTED_CANCELED
    assert time.monotonic() - started < 2


def test_wait_sees_a_timeout_at_the_promises_expire_time(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    pid = uid()
    stub.CreatePromise(pb.CreatePromiseRequest(id=pid, ttl=Duration(nanos=400_000_000)))
    started = time.monotonic()
    reply = stub.WaitPromise(wait_request(pid, 60), timeout=20)
    assert reply.promise.state == types.PROMISE_STATE_REJECTED_TIMEDOUT
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("wait", "why"),
    [
        (Duration(seconds=-1), "from 0s to 300s"),
        (Duration(seconds=301), "from 0s to 300s"),
        (Duration(seconds=1, nanos=-5), "must have the same sign"),
        (Duration(seconds=10**6), "from 0s to 300s"),
    ],
)
def test_wait_refuses_a_wait_out_of_range_naming_the_field(
    stub: promises_pb2_grpc.PromiseServiceStub, wait: Duration, why: str
) -> None:
    pid = uid()
    stub.CreatePromise(pb.CreatePromiseRequest(id=pid))
    error = fails(
        lambda r: stub.WaitPromise(r, timeout=10),
        pb.WaitPromiseRequest(id=pid, wait=wait),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
    )
    assert error_info(error).metadata["field"] == "wait"
    assert why in (error.details() or "")


def test_wait_errors(stub: promises_pb2_grpc.PromiseServiceStub) -> None:
    call = lambda r: stub.WaitPromise(r, timeout=10)  # noqa: E731
    fails(call, wait_request(uid(), 5), grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
    error = fails(
        call, wait_request("bad id", 5), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"
    )
    assert error_info(error).metadata["field"] == "id"


def test_abandoned_waits_free_the_server(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    # More abandoned long polls than the server has handler threads or stream slots
    # would take if each kept its slot: the server must still answer, and waits.
    pid = uid()
    stub.CreatePromise(pb.CreatePromiseRequest(id=pid))
    for _ in range(150):
        future = stub.WaitPromise.future(wait_request(pid, 300))
        time.sleep(0.002)
        future.cancel()
    assert (
        stub.GetPromise(pb.GetPromiseRequest(id=pid), timeout=10).promise.state
        == types.PROMISE_STATE_PENDING
    )
    settle = threading.Timer(0.2, lambda: stub.CancelPromise(pb.CancelPromiseRequest(id=pid)))
    settle.start()
    try:
        reply = stub.WaitPromise(wait_request(pid, 30), timeout=40)
    finally:
        settle.join()
    assert reply.promise.state == types.PROMISE_STATE_REJECTED_CANCELED


def test_create_already_settled_in_one_call(stub: promises_pb2_grpc.PromiseServiceStub) -> None:
    pid = uid("step")
    request = pb.CreatePromiseRequest(
        id=pid, idempotency_key="step-key", resolved_with=payload(b'{"sent": true}')
    )
    first = stub.CreatePromise(request)
    assert first.created and first.promise.state == types.PROMISE_STATE_RESOLVED
    assert first.promise.value.data == b'{"sent": true}'
    assert first.promise.idempotency_key_for_settle == "step-key"
    again = stub.CreatePromise(request)  # a retry after a lost reply: the same record
    assert not again.created and again.promise == first.promise
    rejected = stub.CreatePromise(
        pb.CreatePromiseRequest(id=uid("step"), rejected_with=payload(b'{"type": "Boom"}'))
    ).promise
    assert rejected.state == types.PROMISE_STATE_REJECTED
    error = fails(
        stub.CreatePromise,
        pb.CreatePromiseRequest(id=uid(), resolved_with=payload(b"x" * 1_048_577)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
    )
    assert error_info(error).metadata["field"] == "resolved_with"
