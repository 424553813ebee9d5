"""The watch streams, reconnecting by themselves: `watch_promise` (`Client.watch`, one
promise until it settles) and `PromiseEventStream` (the events of `Client.watch_promises`);
and `wait_promise` (`Client.wait`), the same wait as long polls on the `Calls` stream.

Each stream opens with the token source's current token. One the server ends because
it refuses the credential (`UNAUTHENTICATED`, `PERMISSION_DENIED`: revoked, expired,
a narrowed grant) reopens at once if the source now gives another token
(`Transport.renewed`); with the same token, the refusal is raised, as any other."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Self

import grpc

from troth._convert import event_from_proto, promise_from_proto
from troth._transport import as_call, lacks_method, map_rpc_errors
from troth.errors import DeadlineExceededError, UnavailableError
from troth.v1 import promises_pb2

if TYPE_CHECKING:
    from troth._promise import Promise, PromiseEvent
    from troth._transport import Metadata, PromiseServiceStub, Transport

    _EventCall = grpc._CallIterator[promises_pb2.WatchPromisesResponse]

__all__ = [
    "WATCH_READY_METADATA",
    "PromiseEventStream",
    "not_settled",
    "wait_promise",
    "watch_promise",
]

_log = logging.getLogger("troth.client")

WAIT_CALL_S = 60.0
"""The longest one `WaitPromise` of `wait_promise` waits (the server takes up to 300 s):
a wait for longer is several calls, so that a call lost without an answer costs at most
this much."""
WAIT_GRACE_S = 10.0
"""How much longer than its `wait` a `WaitPromise` call may take to be answered."""

WATCH_READY_METADATA = ("troth-watch", "started")
"""Initial metadata a server sends once a `WatchPromises` stream is in place."""


class PromiseEventStream:
    """The events of `Client.watch_promises`: iterate it; `close()` ends it.

    Thread-safe to close from another thread (a blocked iteration then ends).
    Reconnects by itself (see `Client.watch_promises`).

    .. versionadded:: 0.2.0
    """

    def __init__(
        self,
        transport: Transport,
        request: promises_pb2.WatchPromisesRequest,
        on_reconnect: Callable[[], None] | None,
    ) -> None:
        self._transport = transport
        self._request = request
        self._on_reconnect = on_reconnect
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._stream: _EventCall | None = None
        self._sent: Metadata = ()
        """The metadata the current stream opened with."""
        self._stream, self._sent = self._open(reconnecting=False)

    def __iter__(self) -> Self:
        return self

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """End the watch and release its stream. Safe to call twice, from any thread."""
        self._closed.set()
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.cancel()

    def __next__(self) -> PromiseEvent:
        while True:
            with self._lock:
                stream, sent = self._stream, self._sent
            if self._closed.is_set() or stream is None:
                raise StopIteration
            try:
                response = next(stream)
            except StopIteration:
                why = "the server ended it (shutting down?)"
            except grpc.RpcError as exc:
                if self._closed.is_set():
                    raise StopIteration from None
                call = as_call(exc)
                code = call.code() if call is not None else None
                if code not in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                ) and not self._transport.renewed(exc, sent, stream=True):
                    with map_rpc_errors(self._transport.address, tls=self._transport.tls):
                        raise
                why = (
                    f"{code.name}: {call.details()}"
                    if call is not None and code is not None
                    else repr(exc)
                )
            else:
                event = event_from_proto(response)
                if event is not None:
                    return event
                continue
            self._reconnect(stream, why)

    def _reconnect(self, broken: _EventCall, why: str) -> None:
        broken.cancel()
        if self._closed.is_set():
            return
        _log.warning(
            "watch of promises %r broke (%s); reconnecting, events until then are missed",
            self._request.id or "*",
            why,
            extra={"address": self._transport.address},
        )
        stream, sent = self._open(reconnecting=True)
        with self._lock:
            if self._closed.is_set():
                stream.cancel()
                return
            self._stream, self._sent = stream, sent
        if self._on_reconnect is not None:
            self._on_reconnect()

    def _open(self, *, reconnecting: bool) -> tuple[_EventCall, Metadata]:
        """A stream the server confirmed is in place, and the metadata it opened with;
        retried per the transport's policy (briefly on the first connect, through an
        outage of up to its reconnect window after), and at once, once, when the server
        refused the token and the source gives another."""
        transport = self._transport
        started = transport.now()
        failures = 0
        renewed = False
        with map_rpc_errors(transport.address, tls=transport.tls):
            while True:
                sent = transport.metadata
                stream = transport.promises.WatchPromises(self._request, metadata=sent)
                try:
                    if WATCH_READY_METADATA in tuple(stream.initial_metadata() or ()):
                        return stream, sent
                    next(stream)  # not in place: raises the call's error
                    raise grpc.RpcError("the server ended the watch before it was in place")
                except (grpc.RpcError, StopIteration) as exc:
                    stream.cancel()
                    if self._closed.is_set():
                        return stream, sent
                    if isinstance(exc, StopIteration):
                        raise UnavailableError(
                            grpc.StatusCode.UNAVAILABLE,
                            "",
                            f"the server at {transport.address} ended the watch of promises "
                            "before it was in place; check the server's logs",
                        ) from None
                    if not renewed and transport.renewed(exc, sent, stream=True):
                        renewed = True
                        continue
                    failures += 1
                    delay = transport.reconnect_delay(
                        exc, failures, None, outage_start=started if reconnecting else None
                    )
                    if delay is None:
                        raise
                    self._closed.wait(delay)


class _Breaks:
    """The failures in a row of a wait's calls or a watch's streams, and how long the
    promise's waiter has been cut off: what decides whether, and when, to try again."""

    def __init__(
        self, transport: Transport, id: str, timeout: float | None, deadline: float | None
    ) -> None:
        self._transport = transport
        self._id, self._timeout, self._deadline = id, timeout, deadline
        self.failures = 0
        self._outage_start: float | None = None
        """When an established wait or watch was cut off (None: never established, or
        answering again): it rides out a restart or failover for the reconnect window."""

    def answered(self) -> None:
        self.failures, self._outage_start = 0, None

    def failed(self, exc: grpc.RpcError, *, established: bool, what: str) -> None:
        """Sleep before the next try, or raise: the timeout's `DeadlineExceededError`,
        or `exc` when it is not worth another try."""
        transport = self._transport
        call = as_call(exc)
        if (
            self._timeout is not None
            and call is not None
            and call.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            and transport.remaining(self._deadline) == 0
        ):
            raise not_settled(self._id, self._timeout) from exc
        self.failures += 1
        if established and self._outage_start is None:
            self._outage_start = transport.now()
        delay = transport.reconnect_delay(
            exc, self.failures, self._deadline, outage_start=self._outage_start
        )
        if delay is None:
            raise exc
        _log.warning(
            "%s of promise %r broke (%s); trying again in %.1fs",
            what,
            self._id,
            call.code().name if call is not None else exc,
            delay,
            extra={"promise_id": self._id, "address": transport.address},
        )
        transport.sleep(delay)


def wait_promise(
    transport: Transport, stub: PromiseServiceStub, id: str, timeout: float | None
) -> Promise:
    """`Client.wait`: the promise once settled, by `WaitPromise` long polls (on the
    client's `Calls` stream, one message each), riding out restarts and failovers as
    `watch_promise` does; against a server without `WaitPromise`, by `watch_promise`."""
    deadline = transport.deadline(timeout)
    breaks = _Breaks(transport, id, timeout, deadline)
    # Once the server was reached, the wait rides out a restart or failover however
    # young it is, as a watch does; only a server never reached fails as fast as any
    # call (a wrong address). A client whose Calls stream the server took has reached
    # it: its first call waits long (one message for a result, not two). Otherwise
    # the first call is answered at once (the promise as it is now), and the calls
    # after it wait long.
    answered = transport.reached()
    with map_rpc_errors(transport.address, tls=transport.tls):
        while True:
            remaining = transport.remaining(deadline)
            longest = WAIT_CALL_S if answered else 0.0
            wait = longest if remaining is None else min(remaining, longest)
            request = promises_pb2.WaitPromiseRequest(id=id)
            request.wait.SetInParent()
            request.wait.FromMilliseconds(round(wait * 1000))
            sent = transport.metadata
            try:
                response = stub.WaitPromise(
                    request,
                    timeout=wait + WAIT_GRACE_S,
                    metadata=transport.metadata_for(wait + WAIT_GRACE_S, sent),
                )
            except grpc.RpcError as exc:
                call = as_call(exc)
                if call is not None and lacks_method(call):
                    break  # an older server: watch instead
                if transport.renewed(exc, sent):
                    continue  # refused with an old token: at once, with the new one
                breaks.failed(exc, established=answered, what="wait")
                continue
            breaks.answered()
            answered = True
            promise = promise_from_proto(response.promise)
            if promise.is_settled:
                return promise
            if transport.remaining(deadline) == 0:
                raise not_settled(id, timeout)
    for promise in watch_promise(transport, stub, id, transport.remaining(deadline)):
        if promise.is_settled:
            return promise
    # watch_promise() only ends after yielding a settled promise, or by raising.
    raise RuntimeError(f"the watch of promise {id!r} ended before it settled")


def not_settled(id: str, timeout: float | None) -> DeadlineExceededError:
    return DeadlineExceededError(
        grpc.StatusCode.DEADLINE_EXCEEDED,
        "",
        f"promise {id!r} did not settle within {timeout or 0:g}s; wait longer, "
        f"or find out who should settle it (`troth promises get {id}`)",
    )


def watch_promise(
    transport: Transport, stub: PromiseServiceStub, id: str, timeout: float | None
) -> Iterator[Promise]:
    """`Client.watch`: the promise now, then once more when it settles, reconnecting
    with backoff through restarts and failovers, never yielding one state twice."""
    deadline = transport.deadline(timeout)
    request = promises_pb2.WatchPromiseRequest(id=id)
    last: Promise | None = None
    breaks = _Breaks(transport, id, timeout, deadline)
    with map_rpc_errors(transport.address, tls=transport.tls):
        while True:
            remaining = transport.remaining(deadline)
            sent = transport.metadata
            stream = stub.WatchPromise(
                request, timeout=remaining, metadata=transport.metadata_for(remaining, sent)
            )
            try:
                for response in stream:
                    breaks.answered()
                    promise = promise_from_proto(response.promise)
                    # After a reconnect the server repeats the current state.
                    if promise != last:
                        last = promise
                        yield promise
                    if promise.is_settled:
                        return
            except grpc.RpcError as exc:
                if not transport.renewed(exc, sent, stream=True):
                    breaks.failed(exc, established=last is not None, what="watch")
                continue
            finally:
                stream.cancel()
            # The server ended the stream before the promise settled (e.g. it
            # is shutting down): reopen, with the same backoff as a failure.
            breaks.failures += 1
            if breaks.failures >= transport.retry.max_attempts:
                raise UnavailableError(
                    grpc.StatusCode.UNAVAILABLE,
                    "",
                    f"the server at {transport.address} kept ending the watch of promise "
                    f"{id!r} before it settled; check the server's logs, then watch again",
                )
            transport.sleep(transport.retry.backoff(breaks.failures))
