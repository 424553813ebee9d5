"""`CallStream`: unary calls multiplexed on one `TaskService.Calls` stream.

A unary call costs the server its own HTTP/2 stream and a pass through its
interceptors; a message on an open stream costs a fraction of that. A
`Client`'s calls (its starts, reads and settles) and a worker's (its runner
threads', its heartbeat thread's) go through `MultiplexedStub`s, which
look like the generated stubs' unary methods: each call is sent on the
stream with an id and waits for the answer with that id, so `Transport.call`
retries it and maps its errors exactly as a unary call's (a `Client`'s wait for
a result, `WaitPromise`, is such a call: one message, not a watch stream). The
stream opens at the first call and again at the first call after it broke; a break fails the
calls waiting on it with UNAVAILABLE (they may or may not have been made: the
same as a unary call cut off), which the retry policy retries.

The stream is authenticated by the metadata it opened with. When the token source
gives a new token (`troth._credentials.TokenSource`), the next call opens a new
stream with it, and the old one is ended once the calls on it are answered (it
takes no more): every call goes with the current token, on a stream opened with
it. A stream the server ends because it refuses the credential fails its calls
with that answer, which `Transport.call` makes again, once, with a new token if
the source now gives one (`Transport.renewed`).

Calls ready together go in one message (`CallsRequest.more`, up to
`BATCH_CALLS` of them and `UNARY_ABOVE_BYTES` in all) once the server has said
in its initial metadata that it reads batches; the worker says so in its
stream's metadata, and the server then batches its answers likewise.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import message_factory
from google.protobuf.message import DecodeError
from google.rpc import status_pb2

from troth._tracing import TRACEPARENT_METADATA
from troth.v1 import promises_pb2, tasks_pb2

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from google.protobuf.message import Message

    Metadata = tuple[tuple[str, str], ...]

__all__ = ["MULTIPLEXED", "CallError", "CallStream", "MultiplexedStub", "take_batch"]

_log = logging.getLogger("troth.transport")

CALLS_METHOD = "/troth.v1.TaskService/Calls"
MULTIPLEXED: dict[str, type[Message]] = {
    method.name: message_factory.GetMessageClass(method.output_type)
    for file in (promises_pb2.DESCRIPTOR, tasks_pb2.DESCRIPTOR)
    for service in file.services_by_name.values()
    for method in service.methods
    if method.name in (
        "CreatePromise", "GetPromise", "SearchPromises", "ResolvePromise", "RejectPromise",
        "CancelPromise", "WaitPromise", "CompleteTask", "Heartbeat", "ReleaseTask",
        "RegisterCallbacks", "FailTask",
    )
}  # fmt: skip
"""The unary RPCs sent on the stream (the server's `STREAM_CALLS`), with their answers."""

_REFUSALS = {
    grpc.StatusCode.UNIMPLEMENTED: True,  # a server older than `Calls`
    grpc.StatusCode.PERMISSION_DENIED: True,  # one that lets only workers open it
    grpc.StatusCode.UNAUTHENTICATED: False,  # no credential: a settle token may be enough
    grpc.StatusCode.RESOURCE_EXHAUSTED: False,  # --max-streams are open
}
"""How a stream can be refused before it opened, and whether its calls go as unary RPCs
from then on (True) or only the calls refused with it (False). Such a call never
reached a handler: made as its unary RPC, it succeeds or fails as that RPC's own."""

UNARY_ABOVE_BYTES = 256 * 1024
"""A request this large goes as a unary call: one over the server's message limit then
fails alone, not the stream and every call on it."""

BATCH_METADATA = ("troth-calls-batch", "1")
"""Sent by a side of the stream that reads calls or answers batched in `more`."""

BATCH_CALLS = 64
"""Most calls in one message (the server takes up to 1,000)."""

_CODES = {code.value[0]: code for code in grpc.StatusCode}
_DETAILS_KEY = "grpc-status-details-bin"
CLOSE_WAIT_S = 5.0
"""How long closing a stream waits for its reader to see the end."""
END = object()
"""Queued last on a stream's outgoing calls: the stream ends."""


def _restated(status_details: str | bytes | None, details: str) -> bytes:
    """A stream's `google.rpc.Status` told with the message its calls end with (the
    message must match the call's, or the status is not believed)."""
    if not isinstance(status_details, bytes) or not status_details:
        return b""
    try:
        status = status_pb2.Status.FromString(status_details)
    except DecodeError:
        return b""  # not a status: the calls end with the code and message alone
    status.message = details
    return bytes(status.SerializeToString())


def take_batch(first: tasks_pb2.CallsRequest, outgoing: queue.SimpleQueue[object]) -> object:
    """Add the calls queued now to `first.more`, up to `BATCH_CALLS` calls and
    `UNARY_ABOVE_BYTES` in all; returns the one taken that did not fit (or `END`), if any."""
    size = first.ByteSize()
    while len(first.more) < BATCH_CALLS - 1 and not outgoing.empty():
        ready = outgoing.get_nowait()
        if ready is END:
            return ready
        assert isinstance(ready, tasks_pb2.CallsRequest)
        more = ready.ByteSize()
        if size + more > UNARY_ABOVE_BYTES:
            return ready
        first.more.append(ready)
        size += more
    return None


class CallError(grpc.RpcError, grpc.Call):
    """A call on the stream that did not succeed: a `grpc.Call` with the code, message
    and status details its unary RPC would have ended with."""

    def __init__(
        self,
        code: grpc.StatusCode,
        details: str,
        status_details: bytes = b"",
        *,
        stream_failed: bool = False,
        refused: bool = False,
    ) -> None:
        super().__init__(details)
        self._code, self._details = code, details
        self.stream_failed = stream_failed
        """The stream failed (the call may not have reached a handler), not the call."""
        self.refused = refused
        """The stream was refused before it opened: the call reached no handler."""
        self._trailers = ((_DETAILS_KEY, status_details),) if status_details else ()

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Any:
        return self._trailers

    def initial_metadata(self) -> Any:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float:
        return 0.0

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Any) -> bool:
        return False


class _Waiter:
    """One call's wait for its answer: a lock held until the answer (or the failure) is
    in, far cheaper to make than a `threading.Event` (a lock, a condition and a list)."""

    __slots__ = ("_pending", "answer", "failure")

    def __init__(self) -> None:
        self._pending = threading.Lock()
        self._pending.acquire()
        self.answer: tasks_pb2.CallsResponse | None = None
        self.failure: CallError | None = None

    def done(self) -> None:
        """The answer or failure is in (called once: whoever takes it off `waiting`)."""
        self._pending.release()

    def wait(self, timeout: float | None) -> bool:
        return self._pending.acquire(timeout=-1 if timeout is None else max(timeout, 0.0))


class _Open:
    """One open stream: its outgoing queue, the calls waiting on it, its reader thread."""

    def __init__(self, method: Any, metadata: Metadata) -> None:
        self.sent = metadata
        """The metadata it opened with (its credential)."""
        self.outgoing: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.waiting: dict[int, _Waiter] = {}
        self.lock = threading.Lock()
        self.broken = False
        self.batched = False
        """The server reads calls batched in `more` (its initial metadata said so)."""
        self.opened = False
        """The server took the stream: its initial metadata said so, or it answered."""
        self._method, self._metadata = method, (*metadata, BATCH_METADATA)
        self.call: Any = None
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        """Open it (the calls added before wait on it: none is lost to a quick break)."""
        self.call = self._method(self._requests(), metadata=self._metadata)
        self._reader = threading.Thread(target=self._read, name="troth-calls", daemon=True)
        self._reader.start()

    def _requests(self) -> Iterator[tasks_pb2.CallsRequest]:
        """The calls to send, those queued together in one message once batches are read."""
        outgoing, carried = self.outgoing, None
        while True:
            first = outgoing.get() if carried is None else carried
            if first is END:
                return
            assert isinstance(first, tasks_pb2.CallsRequest)
            carried = take_batch(first, outgoing) if self.batched else None
            yield first

    def add(self, call_id: int) -> _Waiter | None:
        with self.lock:
            if self.broken:
                return None
            waiter = self.waiting[call_id] = _Waiter()
            return waiter

    def drop(self, call_id: int) -> None:
        with self.lock:
            self.waiting.pop(call_id, None)

    def retire(self) -> None:
        """Take no more calls: end the stream once those sent are answered (the server
        answers every call it read before it ends the stream)."""
        self.outgoing.put(END)

    def done(self) -> bool:
        """Its reader has seen the end (or it never opened)."""
        return self._reader is None or not self._reader.is_alive()

    def close(self) -> None:
        """End the stream, and wait (a little) until gRPC is done with it: a channel
        closed while a cancelled call is still winding down may never finish closing."""
        self.outgoing.put(END)
        if self.call is not None:
            self.call.cancel()
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(CLOSE_WAIT_S)
        if self._reader is None or not self._reader.is_alive():
            # Collected now, on this thread, not by the collector at interpreter exit.
            self.call = None

    def _failure(self, exc: grpc.RpcError, ended: CallError) -> CallError:
        """What the calls waiting on the stream fail with, after `exc` ended it."""
        call: object = exc  # (through object: see `troth._transport.as_call`)
        if not isinstance(call, grpc.Call) or call.code() is grpc.StatusCode.CANCELLED:
            return ended
        # A stream that never opened failed as its calls would have: say no more.
        details = call.details() if not self.opened else f"the Calls stream broke: {call.details()}"
        # The stream's own status details (its ErrorInfo reason: TOKEN_UNKNOWN for a
        # revoked token) are every waiting call's, as its unary RPC would have had them.
        status_details = _restated(dict(call.trailing_metadata() or ()).get(_DETAILS_KEY), details)
        return CallError(
            call.code(),
            details,
            status_details,
            stream_failed=True,
            refused=not self.opened and call.code() in _REFUSALS,
        )

    def _read(self) -> None:
        failure = CallError(
            grpc.StatusCode.UNAVAILABLE, "the Calls stream ended", stream_failed=True
        )
        try:
            self.batched = self.opened = BATCH_METADATA in tuple(self.call.initial_metadata() or ())
            for message in self.call:
                self.opened = True
                for answer in (message, *message.more):
                    with self.lock:
                        waiter = self.waiting.pop(answer.id, None)
                    if waiter is not None:
                        waiter.answer = answer
                        waiter.done()
        except grpc.RpcError as exc:
            # The error is the call itself: a local naming it, or its traceback (whose
            # frames name it), makes a cycle that only the garbage collector frees, at
            # interpreter exit if not before, when gRPC's `__del__` can wait forever on
            # a lock a frozen daemon thread holds: the process printed its last line
            # and never exited.
            failure = self._failure(exc, failure)
            _log.debug("the Calls stream ended: %s", exc)
            exc.__traceback__ = None
        with self.lock:
            self.broken = True
            waiting, self.waiting = self.waiting, {}
        self.outgoing.put(END)
        for waiter in waiting.values():
            waiter.failure = failure
            waiter.done()


class CallStream:
    """Unary calls on one `Calls` stream of `channel`, opened when first needed.

    Thread-safe: any number of threads call at once; answers are matched by id.
    """

    def __init__(self, channel: grpc.Channel, metadata: Callable[[], Metadata]) -> None:
        self._method = channel.stream_stream(
            CALLS_METHOD,
            request_serializer=tasks_pb2.CallsRequest.SerializeToString,
            response_deserializer=tasks_pb2.CallsResponse.FromString,
        )
        self._metadata = metadata
        """The metadata to open a stream with now (the current token's)."""
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._open: _Open | None = None
        self._retired: list[_Open] = []
        """Streams opened with an older token, ending once their calls are answered."""
        self._closed = False
        self.unsupported = False
        """The server refused `Calls` (an older troth): calls go as unary RPCs."""

    def method(self, name: str, unary: Callable[..., Any]) -> Callable[..., Any]:
        """A callable shaped like the stub's unary method `name`, which it becomes
        (`unary`) against a server that refuses `Calls` (`_REFUSALS`)."""
        response_type = MULTIPLEXED[name]

        def call(request: Message, timeout: float | None = None, metadata: Any = None) -> Any:
            data = b"" if self.unsupported else request.SerializeToString()
            if self.unsupported or len(data) > UNARY_ABOVE_BYTES:
                return unary(request, timeout=timeout, metadata=metadata)
            try:
                return self.invoke(name, data, response_type, timeout, _traceparent(metadata))
            except CallError as exc:
                if not exc.refused:
                    raise
                refusal = exc.code()
            if _REFUSALS[refusal] and not self.unsupported:
                self.unsupported = True
                _log.info(
                    "the server refused the Calls stream (%s: an older troth); using unary calls",
                    refusal.name,
                )
            return unary(request, timeout=timeout, metadata=metadata)

        return call

    def invoke(
        self,
        name: str,
        request: bytes,
        response_type: type[Message],
        timeout: float | None,
        traceparent: str = "",
    ) -> Message:
        """Make call `name` with the serialized `request` on the stream; its answer, or
        a `CallError` as the unary call would have raised it. `traceparent`: the
        caller's span (`troth._tracing`), which the server's span of the call continues."""
        call_id = next(self._ids)
        message = tasks_pb2.CallsRequest(
            id=call_id, method=name, request=request, traceparent=traceparent
        )
        self._metadata()  # (asks the token source, if it is time, outside the lock)
        with self._lock:
            if self._closed:
                raise CallError(grpc.StatusCode.CANCELLED, "the worker's Calls stream is closed")
            metadata = self._metadata()
            stream = self._open
            if stream is not None and stream.sent != metadata:  # a new token
                stream.retire()
                self._retired = [old for old in self._retired if not old.done()] + [stream]
                stream = None
            waiter = None if stream is None else stream.add(call_id)
            if stream is None or waiter is None:  # not open yet, or broken: open it (again)
                stream = self._open = _Open(self._method, metadata)
                waiter = _Waiter()
                stream.waiting[call_id] = waiter
                stream.start()
            # Queued under the lock: never behind the end of a stream retired meanwhile.
            stream.outgoing.put(message)
        if not waiter.wait(timeout):
            stream.drop(call_id)
            raise CallError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        if waiter.failure is not None:
            raise waiter.failure
        answer = waiter.answer
        assert answer is not None
        if answer.code != 0:
            code = _CODES.get(answer.code, grpc.StatusCode.UNKNOWN)
            raise CallError(code, answer.message, answer.status_details)
        return response_type.FromString(answer.response)

    def reached(self) -> bool:
        """Whether the stream open now was taken by the server (its initial metadata
        said so, or it answered): the server is there, and a call on it gets to it."""
        with self._lock:
            stream = self._open
            return stream is not None and stream.opened and not stream.broken

    def close(self) -> None:
        """End the stream; later calls fail CANCELLED. Safe to repeat."""
        with self._lock:
            self._closed = True
            stream, self._open = self._open, None
            retired, self._retired = self._retired, []
        for old in (*retired, stream):
            if old is not None:
                old.close()


def _traceparent(metadata: Metadata | None) -> str:
    """The `traceparent` a call's metadata carries (`troth._tracing`), or ""."""
    for key, value in metadata or ():
        if key == TRACEPARENT_METADATA:
            return value
    return ""


class MultiplexedStub:
    """A generated stub whose `MULTIPLEXED` methods go on a `CallStream` (the rest
    are the stub's own)."""

    def __init__(self, stub: object, stream: CallStream) -> None:
        self._stub = stub
        self._stream = stream

    def __getattr__(self, name: str) -> Any:
        if name in MULTIPLEXED:
            method = self._stream.method(name, getattr(self._stub, name))
            setattr(self, name, method)
            return method
        return getattr(self._stub, name)
