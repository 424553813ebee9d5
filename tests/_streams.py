"""Streams played by hand, for the tests of the door (one home): a `Calls` stream whose
calls are sent one at a time, and a server stream read on a thread; each says how the
server ended it."""

from __future__ import annotations

import queue
import threading
import time
from typing import TYPE_CHECKING, Any

import grpc
from google.rpc import error_details_pb2, status_pb2

from troth.v1 import tasks_pb2

if TYPE_CHECKING:
    from collections.abc import Iterator

    from troth.v1 import tasks_pb2_grpc


class StreamEnded(Exception):
    """A call sent on a `Calls` stream that the server had ended."""

    def __init__(self, error: grpc.RpcError) -> None:
        super().__init__(str(error))
        self.error = error


def ended_with(error: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    """A stream's (or call's) status code and ErrorInfo reason ("" without one)."""
    return error.code(), details_reason(_status_details(error))  # type: ignore[attr-defined]


def _status_details(error: grpc.RpcError) -> bytes:
    for key, value in error.trailing_metadata() or ():  # type: ignore[attr-defined]
        if key == "grpc-status-details-bin":
            return bytes(value)
    return b""


def details_reason(status_details: bytes) -> str:
    """The ErrorInfo reason of a serialized `google.rpc.Status` ("" without one)."""
    info = details_info(status_details)
    return "" if info is None else str(info.reason)


def details_info(status_details: bytes) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo of a serialized `google.rpc.Status` (None without one)."""
    if not status_details:
        return None
    for detail in status_pb2.Status.FromString(status_details).details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info
    return None


class HandCalls:
    """A `Calls` stream held open: calls sent one by one, answers read on a thread."""

    def __init__(
        self, stub: tasks_pb2_grpc.TaskServiceStub, metadata: Any, timeout: float = 300
    ) -> None:
        self._out: queue.Queue[tasks_pb2.CallsRequest | None] = queue.Queue()
        self._answers: queue.Queue[tasks_pb2.CallsResponse | grpc.RpcError] = queue.Queue()
        self._ids = 0
        self.call = stub.Calls(self._requests(), metadata=metadata, timeout=timeout)
        threading.Thread(target=self._read, daemon=True).start()

    def _requests(self) -> Iterator[tasks_pb2.CallsRequest]:
        while (message := self._out.get()) is not None:
            yield message

    def _read(self) -> None:
        try:
            for answer in self.call:
                self._answers.put(answer)
        except grpc.RpcError as exc:
            self._answers.put(exc)

    def send(self, method: str, request: Any, traceparent: str = "") -> tuple[grpc.StatusCode, str]:
        """One call and its answer's (code, reason); `StreamEnded` if the stream ended."""
        answer = self.ask(method, request, traceparent)
        code = next(c for c in grpc.StatusCode if c.value[0] == answer.code)
        return code, details_reason(answer.status_details)

    def ask(self, method: str, request: Any, traceparent: str = "") -> tasks_pb2.CallsResponse:
        """One call and its whole answer; `StreamEnded` if the stream ended."""
        self._ids += 1
        self._out.put(
            tasks_pb2.CallsRequest(
                id=self._ids,
                method=method,
                request=request.SerializeToString(),
                traceparent=traceparent,
            )
        )
        answer = self._answers.get(timeout=20)
        if isinstance(answer, grpc.RpcError):
            self._answers.put(answer)  # the stream's end, for `ended`
            raise StreamEnded(answer)
        assert answer.id == self._ids
        return answer

    def ended(self, within: float) -> grpc.RpcError:
        """The error the server ended the stream with (it must, within `within` s)."""
        got = self._answers.get(timeout=within)
        assert isinstance(got, grpc.RpcError), f"the stream was not ended: {got}"
        return got

    def close(self) -> None:
        self._out.put(None)
        self.call.cancel()


class ReadStream:
    """A server stream held open, its messages (or its end) read on a thread."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.got: queue.Queue[Any] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for message in self.call:
                self.got.put(message)
        except grpc.RpcError as exc:
            self.got.put(exc)

    def drain(self) -> list[Any]:
        """What it delivered so far."""
        items = []
        while not self.got.empty():
            items.append(self.got.get_nowait())
        return items

    def ended(self, within: float) -> grpc.RpcError:
        """The error the server ended it with, past what it delivered before."""
        deadline = time.monotonic() + within
        while True:
            got = self.got.get(timeout=max(0.01, deadline - time.monotonic()))
            if isinstance(got, grpc.RpcError):
                return got
