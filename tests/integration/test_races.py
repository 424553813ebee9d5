"""Racing settles from many clients: exactly one wins, everyone else knows they lost."""

from __future__ import annotations

import threading
import uuid

import grpc
from _support import ServerProcess, error_info

from troth.v1 import promises_pb2 as pb
from troth.v1 import promises_pb2_grpc
from troth.v1 import types_pb2 as types


def test_many_clients_settle_the_same_promise(server: ServerProcess) -> None:
    clients, promises = 32, 20
    channels = [server.channel() for _ in range(4)]
    stubs = [promises_pb2_grpc.PromiseServiceStub(ch) for ch in channels]
    ids = [f"race-{uuid.uuid4().hex[:8]}-{i}" for i in range(promises)]
    for pid in ids:
        stubs[0].CreatePromise(pb.CreatePromiseRequest(id=pid))
    results: dict[str, list[tuple[str, bool | str]]] = {pid: [] for pid in ids}
    lock = threading.Lock()
    barrier = threading.Barrier(clients)

    def settle(client: int) -> None:
        stub = stubs[client % len(stubs)]
        barrier.wait()
        for pid in ids:
            method = (stub.ResolvePromise, stub.RejectPromise)[client % 2]
            request_type = (pb.ResolvePromiseRequest, pb.RejectPromiseRequest)[client % 2]
            value = types.Payload(data=str(client).encode())
            try:
                reply = method(request_type(id=pid, value=value, idempotency_key=f"c{client}"))
                outcome: bool | str = reply.applied
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
                outcome = error_info(error).reason
            with lock:
                results[pid].append((str(client), outcome))

    threads = [threading.Thread(target=settle, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for pid, outcomes in results.items():
        winners = [c for c, o in outcomes if o is True]
        assert len(winners) == 1, (pid, outcomes)
        assert sorted(o for _, o in outcomes if o is not True) == ["ALREADY_SETTLED"] * (
            clients - 1
        )
        final = stubs[0].GetPromise(pb.GetPromiseRequest(id=pid)).promise
        assert final.value.data == winners[0].encode()
        assert final.idempotency_key_for_settle == f"c{winners[0]}"
    for ch in channels:
        ch.close()
