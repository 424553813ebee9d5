"""A successful reply means committed: SIGKILL the server right after replies, lose nothing."""

from __future__ import annotations

import random
import threading
import uuid
from typing import TYPE_CHECKING

import grpc
import pytest
from _support import start_server

from troth.v1 import promises_pb2 as pb
from troth.v1 import promises_pb2_grpc
from troth.v1 import types_pb2 as types

if TYPE_CHECKING:
    from pathlib import Path


def test_resolve_then_sigkill_keeps_the_value(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    pid = f"durable-{uuid.uuid4().hex[:8]}"
    with server.channel() as channel:
        stub = promises_pb2_grpc.PromiseServiceStub(channel)
        stub.CreatePromise(pb.CreatePromiseRequest(id=pid))
        stub.ResolvePromise(
            pb.ResolvePromiseRequest(id=pid, value=types.Payload(data=b'{"v": 42}'))
        )
    server.kill()  # the moment the reply arrived
    server = start_server(tmp_path, db_url=server.db_url)
    try:
        with server.channel() as channel:
            got = promises_pb2_grpc.PromiseServiceStub(channel).GetPromise(
                pb.GetPromiseRequest(id=pid)
            )
        assert got.promise.state == types.PROMISE_STATE_RESOLVED
        assert got.promise.value.data == b'{"v": 42}'
    finally:
        server.stop()


@pytest.mark.slow
def test_no_acknowledged_write_is_lost_under_load(tmp_path: Path) -> None:
    rounds, clients = 4, 8
    acknowledged: dict[str, int] = {}  # id -> state the server acknowledged
    lock = threading.Lock()
    db_url = f"sqlite:///{tmp_path / 'load.db'}"
    rng = random.Random(7)
    for round_ in range(rounds):
        server = start_server(tmp_path, db_url=db_url)
        stop = threading.Event()

        def load(
            client: int,
            address: str = server.address,
            round_: int = round_,
            stop: threading.Event = stop,
        ) -> None:
            with grpc.insecure_channel(address) as channel:
                stub = promises_pb2_grpc.PromiseServiceStub(channel)
                n = 0
                while not stop.is_set():
                    pid = f"r{round_}-c{client}-{n}"
                    n += 1
                    try:
                        stub.CreatePromise(pb.CreatePromiseRequest(id=pid), timeout=5)
                        with lock:
                            acknowledged[pid] = types.PROMISE_STATE_PENDING
                        stub.ResolvePromise(
                            pb.ResolvePromiseRequest(id=pid, value=types.Payload(data=b"1")),
                            timeout=5,
                        )
                        with lock:
                            acknowledged[pid] = types.PROMISE_STATE_RESOLVED
                    except grpc.RpcError:
                        return  # the server died under us; unacknowledged writes may go

        threads = [threading.Thread(target=load, args=(c,)) for c in range(clients)]
        for t in threads:
            t.start()
        # Let some load through, then kill at a moment the clients cannot predict.
        threading.Event().wait(0.5 + rng.random())
        server.kill()
        stop.set()
        for t in threads:
            t.join(30)
    assert len(acknowledged) > 100, "the load generated too little to prove anything"

    server = start_server(tmp_path, db_url=db_url)
    try:
        with server.channel() as channel:
            stub = promises_pb2_grpc.PromiseServiceStub(channel)
            missing, wrong = [], []
            for pid, state in acknowledged.items():
                try:
                    got = stub.GetPromise(pb.GetPromiseRequest(id=pid)).promise
                except grpc.RpcError:
                    missing.append(pid)
                    continue
                if (
                    state == types.PROMISE_STATE_RESOLVED
                    and got.state != types.PROMISE_STATE_RESOLVED
                ):
                    wrong.append(pid)
        assert missing == [] and wrong == []
    finally:
        server.stop()
