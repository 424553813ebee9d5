"""Sending the fuzzer's calls to a live server, and watching its health meanwhile.

The I/O half of the fuzzer (`_fuzz_oracle` judges what comes back). Every
call goes out as bytes through `channel.unary_unary`/`unary_stream` with
`request_serializer=None`, typed or raw alike, and every response is decoded
here with the method's response type. Server-streaming calls are read for a
short while and then cancelled. While a call runs, a second channel sends
health checks; any that takes longer than `STALL_LIMIT_S` is recorded on the
answer.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import grpc
from _fuzz_oracle import STALL_LIMIT_S, Answer, Call
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

if TYPE_CHECKING:
    from _fuzz_proto import Method
    from google.protobuf.message import Message

CALL_DEADLINE_S = 30.0
"""A unary call not answered by then hangs: that is a finding, not a slow answer."""
STREAM_READ_S = 0.25
"""How long a server stream (Poll, Watch*) is read before the fuzzer cancels it."""
_PROBE_EVERY_S = 0.05


class Caller:
    """Sends calls over one channel and probes health over another."""

    def __init__(self, address: str, methods: list[Method]) -> None:
        self._channel = grpc.insecure_channel(address)
        self._probe_channel = grpc.insecure_channel(address)
        self._health = health_pb2_grpc.HealthStub(self._probe_channel)
        self._responses: dict[str, type[Message]] = {m.path: m.response for m in methods}

    def close(self) -> None:
        self._channel.close()
        self._probe_channel.close()

    def healthy(self) -> bool:
        try:
            reply = self._health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        except grpc.RpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    def call(self, call: Call) -> Answer:
        done = threading.Event()
        stalls: list[str] = []
        probe = threading.Thread(target=self._probe, args=(done, stalls), daemon=True)
        probe.start()
        try:
            answer = self._stream(call) if call.streaming else self._unary(call)
        finally:
            done.set()
            probe.join()
        answer.stalls = stalls
        return answer

    def _metadata(self, call: Call) -> tuple[tuple[str, str | bytes], ...] | None:
        return None if call.principal is None else (("troth-principal", call.principal),)

    def _unary(self, call: Call) -> Answer:
        rpc: grpc.UnaryUnaryMultiCallable[bytes, bytes] = self._channel.unary_unary(
            call.path, request_serializer=None, response_deserializer=None
        )
        try:
            raw = rpc(call.wire(), timeout=CALL_DEADLINE_S, metadata=self._metadata(call))
        except grpc.RpcError as error:
            return _failed(error)
        return Answer(grpc.StatusCode.OK, messages=1, undecodable=self._decode(call, raw))

    def _stream(self, call: Call) -> Answer:
        rpc: grpc.UnaryStreamMultiCallable[bytes, bytes] = self._channel.unary_stream(
            call.path, request_serializer=None, response_deserializer=None
        )
        stream = rpc(call.wire(), timeout=CALL_DEADLINE_S, metadata=self._metadata(call))
        ended = threading.Event()

        def end() -> None:
            ended.set()
            stream.cancel()

        timer = threading.Timer(STREAM_READ_S, end)
        timer.start()
        count, undecodable = 0, None
        try:
            for raw in stream:
                count += 1
                undecodable = undecodable or self._decode(call, raw)
        except grpc.RpcError as error:
            answer = _failed(error)
            answer.cancelled_by_us = ended.is_set() and answer.code is grpc.StatusCode.CANCELLED
            answer.messages, answer.undecodable = count, undecodable
            return answer
        finally:
            timer.cancel()
        return Answer(grpc.StatusCode.OK, messages=count, undecodable=undecodable)

    def _decode(self, call: Call, raw: bytes) -> str | None:
        try:
            self._responses[call.path].FromString(raw)
        except DecodeError as exc:
            return f"{exc} ({raw[:80]!r})"
        return None

    def _probe(self, done: threading.Event, stalls: list[str]) -> None:
        while not done.wait(_PROBE_EVERY_S):
            started = time.perf_counter()
            try:
                self._health.Check(health_pb2.HealthCheckRequest(), timeout=STALL_LIMIT_S)
            except grpc.RpcError as error:
                took = time.perf_counter() - started
                stalls.append(f"{error.code().name} after {took:.2f} s")
                continue
            took = time.perf_counter() - started
            if took > STALL_LIMIT_S:
                stalls.append(f"answered after {took:.2f} s")


def _failed(error: grpc.RpcError) -> Answer:
    code: grpc.StatusCode = error.code()
    details: str = error.details() or ""
    return Answer(code, details=details, info=_error_info(error))


def _error_info(error: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    try:
        status = rpc_status.from_call(error)
    except ValueError:  # a status detail that contradicts the call's own status
        return None
    if status is None:
        return None
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info
    return None
