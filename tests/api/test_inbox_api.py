"""The inbox against a real server (every back end): search orders and
cut-offs with their pages, `WatchPromises` events, and the SDK's calls for both."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import grpc
import pytest
from _support import ServerProcess, error_info, start_server
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from troth import Client, InvalidArgumentError, PromiseEventType, PromiseOrder, PromiseState
from troth.v1 import promises_pb2 as pb
from troth.v1 import promises_pb2_grpc
from troth.v1 import types_pb2 as types

READY = ("troth-watch", "started")


def uid(prefix: str = "inbox") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def ids(reply: pb.SearchPromisesResponse) -> list[str]:
    return [p.id for p in reply.promises]


def all_pages(
    stub: promises_pb2_grpc.PromiseServiceStub, page_size: int, **query: object
) -> tuple[list[str], int]:
    """Every id the query pages through, and how many pages it took."""
    seen: list[str] = []
    token, pages = "", 0
    while True:
        reply = stub.SearchPromises(
            pb.SearchPromisesRequest(page_size=page_size, page_token=token, **query)  # type: ignore[arg-type]
        )
        seen += ids(reply)
        pages += 1
        token = reply.next_page_token
        if not token:
            return seen, pages


def at(ms: int) -> Timestamp:
    stamp = Timestamp()
    stamp.FromMilliseconds(ms)
    return stamp


def invalid(
    stub: promises_pb2_grpc.PromiseServiceStub, request: pb.SearchPromisesRequest
) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        stub.SearchPromises(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    return caught.value


# --- SearchPromises: order and created_before -----------------------------------------


def test_newest_first_pages_backwards_through_creation_order(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    run = uid()
    made = [f"{run}.p{i}" for i in range(7)]
    for pid in made:
        stub.CreatePromise(pb.CreatePromiseRequest(id=pid))
    seen, pages = all_pages(stub, 3, id=f"{run}.*", order=pb.PROMISE_ORDER_CREATED_DESC)
    assert (seen, pages) == (made[::-1], 3)
    oldest, _ = all_pages(stub, 3, id=f"{run}.*", order=pb.PROMISE_ORDER_CREATED_ASC)
    assert oldest == made


def test_deadline_order_puts_ties_in_creation_order_and_never_last(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    run = uid()
    soon = at(int(time.time() * 1000) + 3_600_000)
    later = at(int(time.time() * 1000) + 7_200_000)
    made = {
        "never1": pb.CreatePromiseRequest(never_expires=True),
        "later": pb.CreatePromiseRequest(expire_time=later),
        "soon1": pb.CreatePromiseRequest(expire_time=soon),
        "never2": pb.CreatePromiseRequest(never_expires=True),
        "soon2": pb.CreatePromiseRequest(expire_time=soon),
        "soon3": pb.CreatePromiseRequest(expire_time=soon),
        "minute": pb.CreatePromiseRequest(ttl=Duration(seconds=60)),
    }
    for name, request in made.items():
        request.id = f"{run}.{name}"
        stub.CreatePromise(request)
    expected = ["minute", "soon1", "soon2", "soon3", "later", "never1", "never2"]
    for page_size in (1, 2, 3, 100):
        seen, _ = all_pages(stub, page_size, id=f"{run}.*", order=pb.PROMISE_ORDER_EXPIRE_TIME_ASC)
        assert [i.rsplit(".", 1)[1] for i in seen] == expected, page_size
    # Pending only, as an inbox asks: a settled promise drops out, the order stays.
    stub.ResolvePromise(pb.ResolvePromiseRequest(id=f"{run}.soon2"))
    seen, _ = all_pages(
        stub,
        2,
        id=f"{run}.*",
        states=[types.PROMISE_STATE_PENDING],
        order=pb.PROMISE_ORDER_EXPIRE_TIME_ASC,
    )
    assert [i.rsplit(".", 1)[1] for i in seen] == [e for e in expected if e != "soon2"]


def test_deadline_pages_repeat_nothing_while_promises_come_and_go(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    run = uid()
    base = int(time.time() * 1000) + 3_600_000
    for i in range(10):
        stub.CreatePromise(pb.CreatePromiseRequest(id=f"{run}.p{i}", expire_time=at(base + i)))
    seen: list[str] = []
    token = ""
    while True:
        reply = stub.SearchPromises(
            pb.SearchPromisesRequest(
                id=f"{run}.*", page_size=3, page_token=token, order=pb.PROMISE_ORDER_EXPIRE_TIME_ASC
            )
        )
        seen += ids(reply)
        # Meanwhile: one expiring before everything listed, one after everything.
        n = len(seen)
        stub.CreatePromise(pb.CreatePromiseRequest(id=f"{run}.early{n}", expire_time=at(base)))
        stub.CreatePromise(pb.CreatePromiseRequest(id=f"{run}.late{n}", ttl=Duration(seconds=9000)))
        token = reply.next_page_token
        if not token:
            break
    assert seen[:10] == [f"{run}.p{i}" for i in range(10)]
    assert len(seen) == len(set(seen))
    assert all(".late" in i for i in seen[10:])


def test_created_before_is_a_cut_off(stub: promises_pb2_grpc.PromiseServiceStub) -> None:
    run = uid()
    first = stub.CreatePromise(pb.CreatePromiseRequest(id=f"{run}.old")).promise
    # Create until the server's clock has moved on (a millisecond at most, usually none).
    n = 0
    while True:
        later = stub.CreatePromise(pb.CreatePromiseRequest(id=f"{run}.new{n}")).promise
        if later.create_time.ToMilliseconds() > first.create_time.ToMilliseconds():
            break
        n += 1
    cut = at(later.create_time.ToMilliseconds())
    reply = stub.SearchPromises(pb.SearchPromisesRequest(id=f"{run}.*", created_before=cut))
    assert ids(reply) == [f"{run}.old"] + [f"{run}.new{i}" for i in range(n)]
    desc = stub.SearchPromises(
        pb.SearchPromisesRequest(
            id=f"{run}.*", created_before=at(0), order=pb.PROMISE_ORDER_CREATED_DESC
        )
    )
    assert ids(desc) == []


def test_a_token_is_bound_to_its_order_and_cut_off(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    run = uid()
    for i in range(3):
        stub.CreatePromise(pb.CreatePromiseRequest(id=f"{run}.p{i}"))
    cut = at(int(time.time() * 1000) + 60_000)
    first = stub.SearchPromises(
        pb.SearchPromisesRequest(id=f"{run}.*", page_size=1, order=pb.PROMISE_ORDER_EXPIRE_TIME_ASC)
    )
    error = invalid(
        stub,
        pb.SearchPromisesRequest(
            id=f"{run}.*",
            page_size=1,
            page_token=first.next_page_token,
            order=pb.PROMISE_ORDER_CREATED_DESC,
        ),
    )
    assert error_info(error).reason == "INVALID_PAGE_TOKEN"
    assert "order EXPIRE_TIME_ASC" in (error.details() or "")
    first = stub.SearchPromises(
        pb.SearchPromisesRequest(id=f"{run}.*", page_size=1, created_before=cut)
    )
    error = invalid(
        stub,
        pb.SearchPromisesRequest(id=f"{run}.*", page_size=1, page_token=first.next_page_token),
    )
    assert error_info(error).reason == "INVALID_PAGE_TOKEN"
    assert "created_before" in (error.details() or "")


def test_bad_order_and_cut_off_name_the_field(stub: promises_pb2_grpc.PromiseServiceStub) -> None:
    for request, field in [
        (pb.SearchPromisesRequest(order=7), "order"),  # type: ignore[arg-type]
        (pb.SearchPromisesRequest(created_before=Timestamp(seconds=-1)), "created_before"),
        (pb.SearchPromisesRequest(created_before=Timestamp(nanos=-5)), "created_before"),
    ]:
        error = invalid(stub, request)
        info = error_info(error)
        assert (info.reason, info.metadata["field"]) == ("INVALID_ARGUMENT", field)


# --- WatchPromises --------------------------------------------------------------------


def open_watch(
    stub: promises_pb2_grpc.PromiseServiceStub, **filter: object
) -> Iterator[pb.WatchPromisesResponse]:
    """A watch the server confirmed is in place (what the SDK waits for, too)."""
    stream = stub.WatchPromises(pb.WatchPromisesRequest(**filter), timeout=30)  # type: ignore[arg-type]
    assert READY in tuple(stream.initial_metadata() or ())
    return stream


def take(stream: Iterator[pb.WatchPromisesResponse], count: int) -> list[tuple[str, str, int]]:
    """The next `count` events as (type, id, state)."""
    return [
        (
            pb.PromiseEventType.Name(e.type).removeprefix("PROMISE_EVENT_TYPE_"),
            e.promise.id,
            e.promise.state,
        )
        for e in (next(stream) for _ in range(count))
    ]


def test_a_watch_sees_creates_settles_and_timeouts_that_match(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    run = uid()
    inbox = {"inbox": run}
    stream = open_watch(stub, tags=inbox)
    stub.CreatePromise(pb.CreatePromiseRequest(id=f"{run}.a", tags=inbox))
    stub.CreatePromise(pb.CreatePromiseRequest(id=f"{run}.other", tags={"inbox": "other"}))
    stub.CreatePromise(
        pb.CreatePromiseRequest(
            id=f"{run}.timer", tags={**inbox, "troth:timer": "true"}, ttl=Duration(nanos=10**8)
        )
    )
    stub.RejectPromise(pb.RejectPromiseRequest(id=f"{run}.a"))
    stub.CreatePromise(
        pb.CreatePromiseRequest(
            id=f"{run}.short", tags={**inbox, "x": "y"}, ttl=Duration(nanos=3 * 10**8)
        )
    )
    stub.CancelPromise(pb.CancelPromiseRequest(id=f"{run}.other"))
    events = take(stream, 6)
    stream.cancel()  # type: ignore[attr-defined]
    by_promise: dict[str, list[tuple[str, int]]] = {}
    for kind, pid, state in events:
        by_promise.setdefault(pid.rsplit(".", 1)[1], []).append((kind, state))
    assert by_promise == {
        "a": [("CREATED", types.PROMISE_STATE_PENDING), ("SETTLED", types.PROMISE_STATE_REJECTED)],
        "timer": [
            ("CREATED", types.PROMISE_STATE_PENDING),
            ("TIMED_OUT", types.PROMISE_STATE_RESOLVED),
        ],
        "short": [
            ("CREATED", types.PROMISE_STATE_PENDING),
            ("TIMED_OUT", types.PROMISE_STATE_REJECTED_TIMEDOUT),
        ],
    }
    # Commit order: the reject was committed before `short` existed.
    assert events.index(("SETTLED", f"{run}.a", types.PROMISE_STATE_REJECTED)) < events.index(
        ("CREATED", f"{run}.short", types.PROMISE_STATE_PENDING)
    )


def test_a_watch_filters_by_id_glob(stub: promises_pb2_grpc.PromiseServiceStub) -> None:
    run = uid()
    stream = open_watch(stub, id=f"{run}.approve-*")
    for name in ("approve-1", "other", "approve-2"):
        stub.CreatePromise(pb.CreatePromiseRequest(id=f"{run}.{name}"))
    # A promise created already settled: created, then settled.
    stub.CreatePromise(
        pb.CreatePromiseRequest(id=f"{run}.approve-3", resolved_with=types.Payload(data=b"1"))
    )
    assert take(stream, 4) == [
        ("CREATED", f"{run}.approve-1", types.PROMISE_STATE_PENDING),
        ("CREATED", f"{run}.approve-2", types.PROMISE_STATE_PENDING),
        ("CREATED", f"{run}.approve-3", types.PROMISE_STATE_PENDING),
        ("SETTLED", f"{run}.approve-3", types.PROMISE_STATE_RESOLVED),
    ]
    stream.cancel()  # type: ignore[attr-defined]


def test_a_bad_filter_is_refused_naming_the_field(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    for request, field in [
        (pb.WatchPromisesRequest(id="a b*"), "id"),
        (pb.WatchPromisesRequest(tags={"": "x"}), "tags"),
        (pb.WatchPromisesRequest(tags={f"k{i}": "v" for i in range(33)}), "tags"),
    ]:
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.WatchPromises(request, timeout=10))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        info = error_info(caught.value)
        assert (info.reason, info.metadata["field"]) == ("INVALID_ARGUMENT", field)


def test_watches_come_and_go_without_holding_the_server(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    # More abandoned watches than the thread server has handler threads.
    for _ in range(150):
        stream = open_watch(stub)
        stream.cancel()  # type: ignore[attr-defined]
    run = uid()
    stream = open_watch(stub, id=f"{run}*")
    stub.CreatePromise(pb.CreatePromiseRequest(id=run), timeout=10)
    assert take(stream, 1) == [("CREATED", run, types.PROMISE_STATE_PENDING)]
    stream.cancel()  # type: ignore[attr-defined]


# --- the SDK ----------------------------------------------------------------------------


def test_sdk_search_order_and_age(server: ServerProcess) -> None:
    run = uid()
    with Client(server.address) as client:
        client.create(f"{run}.a", ttl=timedelta(hours=2))
        client.create(f"{run}.b", ttl=timedelta(hours=1))
        client.create(f"{run}.c", never_expires=True)
        query = {"id": f"{run}.*", "page_size": 2}
        newest = [p.id for p in client.search_all(order="CREATED_DESC", **query)]  # type: ignore[arg-type]
        assert newest == [f"{run}.c", f"{run}.b", f"{run}.a"]
        deadline = client.search_all(order=PromiseOrder.EXPIRE_TIME_ASC, **query)  # type: ignore[arg-type]
        assert [p.id for p in deadline] == [f"{run}.b", f"{run}.a", f"{run}.c"]
        assert list(client.search_all(older_than=timedelta(hours=1), **query)) == []  # type: ignore[arg-type]
        page = client.search(f"{run}.*", older_than=timedelta(0), page_size=2)
        assert len(page.promises) == 2 and page.next_page_token
        with pytest.raises(ValueError, match="created_before"):
            client.search(f"{run}.*", older_than=timedelta(0), page_token=page.next_page_token)
        with pytest.raises(ValueError, match="unknown search order 'oldest'"):
            client.search(order="oldest")


def test_sdk_watch_promises(server: ServerProcess) -> None:
    run = uid()
    with Client(server.address, principal="alice") as client:
        with client.watch_promises(f"{run}.*", tags={"troth:kind": "promise"}) as events:
            # In place once the call returns: nothing committed from now on is missed.
            client.create(f"{run}.p1", tags={"troth:kind": "promise"})
            client.create(f"{run}.p2", tags={"troth:kind": "note"})
            client.resolve(f"{run}.p1", {"ok": True})
            first, second = next(events), next(events)
        assert list(events) == []  # closed: the iteration ends
        assert (first.type, first.promise.id) == (PromiseEventType.CREATED, f"{run}.p1")
        assert second.type is PromiseEventType.SETTLED
        assert second.promise.state is PromiseState.RESOLVED
        assert second.promise.settled_by == "alice"
        assert client.decode(second.promise.value) == {"ok": True}
        with pytest.raises(InvalidArgumentError) as caught:
            client.watch_promises("not valid*")
        assert caught.value.field == "id"


def test_sdk_watch_closed_from_another_thread(server: ServerProcess) -> None:
    with Client(server.address) as client:
        events = client.watch_promises(uid())
        threading.Timer(0.2, events.close).start()
        assert list(events) == []


# --- a client that reads too slowly -----------------------------------------------------


@pytest.fixture(scope="module")
def small_backlog_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = start_server(
        Path(tmp_path_factory.mktemp("backlog")),
        "--max-watch-backlog",
        "5",
    )
    yield proc
    assert proc.stop() == 0, proc.log()[-3000:]


def test_a_watch_that_falls_behind_is_ended_with_resource_exhausted(
    small_backlog_server: ServerProcess,
) -> None:
    with small_backlog_server.channel() as channel:
        stub = promises_pb2_grpc.PromiseServiceStub(channel)
        run = uid()
        stream = open_watch(stub, id=f"{run}.*")
        # Large events fill the connection's flow-control window (a few MB), then
        # the server's buffer of 5: the watch must end, not hold up these creates.
        big = types.Payload(data=b"x" * 200_000)
        started = time.monotonic()
        for i in range(150):
            stub.CreatePromise(pb.CreatePromiseRequest(id=f"{run}.p{i}", param=big), timeout=10)
        assert time.monotonic() - started < 30
        received = 0
        with pytest.raises(grpc.RpcError) as caught:
            for _ in stream:
                received += 1
        assert received < 150
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error_info(caught.value).reason == "RESOURCE_EXHAUSTED"
        assert "reconnect, and re-list with SearchPromises" in (caught.value.details() or "")
    # The SDK reconnects by itself and says so; events from then on arrive again.
    last = f"{run}-sdk.last"
    with Client(small_backlog_server.address) as client:
        reconnects: list[bool] = []

        def reconnected() -> None:
            reconnects.append(True)
            client.create(last)

        with client.watch_promises(f"{run}-sdk.*", on_reconnect=reconnected) as events:
            for i in range(150):
                client.create(f"{run}-sdk.p{i}", {"blob": "x" * 200_000})
            for event in events:
                if event.promise.id == last:
                    break
    assert reconnects == [True]
