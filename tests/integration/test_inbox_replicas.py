"""`WatchPromises` across two replicas on one PostgreSQL schema.

A watch on replica A hears of promises created, settled and timed out through
replica B (B announces them with NOTIFY; A reads them and sends the events); a
gap in those announcements ends A's watches instead of leaving them silently
wrong; and the SDK's watch moves to B when A stops, and says so.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import grpc
import psycopg
import pytest
from _pg import admin_url, fresh_schema
from _support import ServerProcess, error_info, eventually, start_server
from google.protobuf.duration_pb2 import Duration

from troth import Client, PromiseEventType
from troth.v1 import promises_pb2 as pb
from troth.v1 import promises_pb2_grpc
from troth.v1 import types_pb2 as types

READY = ("troth-watch", "started")


@dataclass
class Pair:
    a: ServerProcess
    b: ServerProcess
    stub_a: promises_pb2_grpc.PromiseServiceStub
    stub_b: promises_pb2_grpc.PromiseServiceStub


@pytest.fixture
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """Replicas A and B on a fresh schema (per test: one of them stops A)."""
    with ExitStack() as stack:
        url = stack.enter_context(fresh_schema())
        with ThreadPoolExecutor(2) as pool:  # their start-ups overlap
            started = [
                pool.submit(
                    start_server,
                    tmp_path_factory.mktemp(f"replica-{name}"),
                    "--sweep-interval",
                    "200ms",
                    db_url=url,
                )
                for name in "ab"
            ]
        servers = [f.result() for f in started]
        for server in servers:
            stack.callback(server.stop)
        a, b = servers
        channel_a = stack.enter_context(a.channel())
        channel_b = stack.enter_context(b.channel())
        yield Pair(
            a,
            b,
            promises_pb2_grpc.PromiseServiceStub(channel_a),
            promises_pb2_grpc.PromiseServiceStub(channel_b),
        )


def open_watch(
    stub: promises_pb2_grpc.PromiseServiceStub, **filter: object
) -> Iterator[pb.WatchPromisesResponse]:
    stream = stub.WatchPromises(pb.WatchPromisesRequest(**filter), timeout=30)  # type: ignore[arg-type]
    assert READY in tuple(stream.initial_metadata() or ())
    return stream


def event(response: pb.WatchPromisesResponse) -> tuple[str, str, int]:
    kind = pb.PromiseEventType.Name(response.type).removeprefix("PROMISE_EVENT_TYPE_")
    return kind, response.promise.id, response.promise.state


def test_a_watch_on_a_hears_what_happens_through_b(pair: Pair) -> None:
    run = f"rep-{uuid.uuid4().hex[:8]}"
    stream = open_watch(pair.stub_a, tags={"inbox": run})
    inbox = {"inbox": run}
    pair.stub_b.CreatePromise(pb.CreatePromiseRequest(id=f"{run}.b", tags=inbox))
    assert event(next(stream)) == ("CREATED", f"{run}.b", types.PROMISE_STATE_PENDING)
    pair.stub_b.ResolvePromise(pb.ResolvePromiseRequest(id=f"{run}.b"))
    assert event(next(stream)) == ("SETTLED", f"{run}.b", types.PROMISE_STATE_RESOLVED)
    # Created on A, settled on B; and created and settled in one call on B.
    pair.stub_a.CreatePromise(pb.CreatePromiseRequest(id=f"{run}.a", tags=inbox))
    assert event(next(stream)) == ("CREATED", f"{run}.a", types.PROMISE_STATE_PENDING)
    pair.stub_b.RejectPromise(pb.RejectPromiseRequest(id=f"{run}.a"))
    assert event(next(stream)) == ("SETTLED", f"{run}.a", types.PROMISE_STATE_REJECTED)
    pair.stub_b.CreatePromise(
        pb.CreatePromiseRequest(id=f"{run}.done", tags=inbox, resolved_with=types.Payload())
    )
    assert [event(next(stream))[0] for _ in range(2)] == ["CREATED", "SETTLED"]
    # Whichever replica's sweeper expires it, A's watch hears of it.
    pair.stub_b.CreatePromise(
        pb.CreatePromiseRequest(id=f"{run}.short", tags=inbox, ttl=Duration(nanos=2 * 10**8))
    )
    assert event(next(stream)) == ("CREATED", f"{run}.short", types.PROMISE_STATE_PENDING)
    assert event(next(stream)) == (
        "TIMED_OUT",
        f"{run}.short",
        types.PROMISE_STATE_REJECTED_TIMEDOUT,
    )
    # Nothing else: a promise of another inbox, then one more of ours, comes next.
    pair.stub_b.CreatePromise(pb.CreatePromiseRequest(id=f"{run}.other", tags={"inbox": "x"}))
    pair.stub_b.CreatePromise(pb.CreatePromiseRequest(id=f"{run}.end", tags=inbox))
    assert event(next(stream)) == ("CREATED", f"{run}.end", types.PROMISE_STATE_PENDING)
    stream.cancel()  # type: ignore[attr-defined]


def test_a_gap_in_announcements_ends_the_watches(pair: Pair) -> None:
    stream = open_watch(pair.stub_a)
    # Cut the replicas' LISTEN connections (theirs only: the channel is named
    # after their schema): each reconnects and resyncs.
    schema = parse_qs(urlsplit(pair.a.db_url).query)["options"][0].split("=", 1)[1]
    listen = f'LISTEN "troth_{schema}"'
    with psycopg.connect(admin_url(), autocommit=True) as admin:
        # Both replicas listen once they have started; on a loaded machine one may
        # still be on its way there.
        eventually(
            lambda: (
                admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE query = %s", (listen,)
                ).fetchone()
                == (2,)
            ),
            what="both replicas' LISTEN connections",
        )
        killed = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = %s",
            (listen,),
        ).fetchall()
    assert len(killed) == 2
    with pytest.raises(grpc.RpcError) as caught:
        for _ in stream:
            pass
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert error_info(caught.value).reason == "STORE_UNAVAILABLE"
    assert "re-list with SearchPromises" in (caught.value.details() or "")


def test_the_sdk_watch_moves_to_b_when_a_stops(pair: Pair) -> None:
    run = f"fo-{uuid.uuid4().hex[:8]}"
    with Client([pair.a.address, pair.b.address]) as client:
        reconnects: list[bool] = []

        def reconnected() -> None:
            reconnects.append(True)
            client.create(f"{run}.after")

        with (
            Client(pair.b.address) as on_b,
            on_b.watch_promises(f"{run}.*") as b_events,
            client.watch_promises(f"{run}.*", on_reconnect=reconnected) as events,
        ):
            client.create(f"{run}.before")
            first = next(events)
            assert (first.type, first.promise.id) == (PromiseEventType.CREATED, f"{run}.before")
            # B learns of A's writes through the database's notifications, which may lag
            # on a loaded machine: wait until B has seen `.before`, so that the watch
            # which moves to B starts after it (a watch has no cursor: what B learns
            # after the move, it sends).
            seen_on_b = next(b_events)
            assert seen_on_b.promise.id == f"{run}.before"
            pair.a.proc.send_signal(signal.SIGTERM)  # graceful: A ends its watches
            second = next(events)
        assert (second.type, second.promise.id) == (PromiseEventType.CREATED, f"{run}.after")
        assert reconnects == [True]
    assert pair.a.proc.wait(20) == 0
