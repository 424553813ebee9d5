"""`TaskService.Calls`: a worker's or a client's unary calls multiplexed on one
bidirectional stream.

A unary call costs the server its own HTTP/2 stream, its metadata, and a pass
through every interceptor; a message on a stream that is already open costs
a fraction of that (bench/README.md, "One stream per worker"). Each
`CallsRequest` is handled as its RPC would be, by the same servicer method
(with its input checks, canonical log line and error mapping), concurrently
with the others, and answered by a `CallsResponse` with its id as soon as it
finishes. Each call passes the door (`api/_door.py`) as its unary RPC would:
admitted (a slot of the same `--max-concurrent-rpcs` limit, or of
`--max-streams` for a long poll, `WaitPromise`; refused the same way,
RESOURCE_EXHAUSTED, OVERLOADED), its stream's credential looked up again when
it may have changed (a reload, a JWT's expiry: a revoked credential stops here
on its next call), and authorized as its own RPC; a long poll's answer is
checked again before it is sent.

Calls and answers that are ready together travel in one message (`more`):
a message costs both sides far more than the call it carries does to encode.
The server says in its initial metadata that it reads batches, and sends its
answers batched to a worker that says so in its stream's metadata
(`BATCH_METADATA`); either side without it gets one call per message.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc
import grpc.aio
import structlog
from google.protobuf import message_factory

from troth.v1 import tasks_pb2
from troth_server._tracing import TRACEPARENT_METADATA
from troth_server.api._admission import LONG_POLLS
from troth_server.api._auth import set_caller
from troth_server.api._batches import batched
from troth_server.api._decode import Refused, deserializer
from troth_server.api._door import Held, held_stream
from troth_server.api._status import status_for
from troth_server.auth import AuthError
from troth_server.domain.errors import InvalidArgument, Overloaded

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence

    from google.protobuf.descriptor import ServiceDescriptor

    from troth_server.api._admission import Gate
    from troth_server.api._door import Door
    from troth_server.config import Limits

    AioContext: TypeAlias = grpc.aio.ServicerContext[Any, Any]

log = structlog.get_logger("troth.rpc")

STREAM_CALLS = (
    "CreatePromise",
    "GetPromise",
    "SearchPromises",
    "ResolvePromise",
    "RejectPromise",
    "CancelPromise",
    "WaitPromise",
    "CompleteTask",
    "Heartbeat",
    "ReleaseTask",
    "RegisterCallbacks",
    "FailTask",
)
"""What `Calls` serves: the unary RPCs a worker makes, and a client's starts, settles
and waits for results (each authorized as its own RPC, so any role may open the
stream)."""


BATCH_METADATA = ("troth-calls-batch", "1")
"""Sent by a side of a `Calls` stream that reads calls or answers batched in `more`."""

ANSWERS_BATCH_BYTES = 1 << 20
"""The answers sent in one message stop growing at this size (a larger answer goes alone)."""

_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str, trailers: Any) -> None:
        super().__init__(details)
        self.code, self.details, self.trailers = code, details, trailers


class _CallContext:
    """What a unary handler sees of its call when it came on the stream: the stream's
    metadata and peer; an abort answers this call, not the stream. One per stream:
    the stream's metadata is read from gRPC once, not once for each call (each read
    builds a tuple of new metadata objects)."""

    def __init__(self, stream: AioContext) -> None:
        self._stream = stream
        self._metadata = tuple(stream.invocation_metadata() or ())

    @property
    def stream(self) -> AioContext:
        return self._stream

    def invocation_metadata(self) -> Any:
        return self._metadata

    def traced(self, traceparent: str) -> _CallContext:
        """This context for one call that carries its caller's span (`CallsRequest.
        traceparent`): its metadata has it, as a unary call's would."""
        twin = copy.copy(self)
        twin._metadata = (*self._metadata, (TRACEPARENT_METADATA, traceparent))
        return twin

    def peer(self) -> str:
        return self._stream.peer()

    def time_remaining(self) -> float | None:
        return None

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()
    ) -> None:
        raise _Aborted(code, details, trailing_metadata)


@dataclass(frozen=True, slots=True)
class _Method:
    parse: Callable[[bytes], Any]
    handler: Callable[[Any, Any], Awaitable[Any]]


def _answer(
    call_id: int, code: grpc.StatusCode, details: str, trailers: Any
) -> tasks_pb2.CallsResponse:
    status = b""
    for key, value in trailers or ():
        if key == "grpc-status-details-bin":
            status = value
    return tasks_pb2.CallsResponse(
        id=call_id, code=code.value[0], message=details, status_details=status
    )


def _refusal(call_id: int, exc: Exception) -> tasks_pb2.CallsResponse:
    status = status_for(exc)
    return _answer(call_id, status.code, status.details, status.trailing_metadata)


_NESTED = InvalidArgument(
    "more", "a call in `more` has calls in `more` of its own; put every call in the outer `more`"
)


def _ready(answers: asyncio.Queue[tasks_pb2.CallsResponse | None]) -> Iterator[Any]:
    """The answers queued now (a None: the stream ends), without waiting."""
    while not answers.empty():
        yield answers.get_nowait()


class CallMux:
    """Serves `Calls` streams with the servicers' own unary methods."""

    def __init__(
        self,
        services: Sequence[tuple[ServiceDescriptor, object]],
        limits: Limits,
        door: Door,
        on_call: Callable[[str, str, float | None], None] | None = None,
    ) -> None:
        self._door = door
        self._on_call = on_call
        """Each call answered: its method, status code name and seconds (the metrics,
        which count it as its RPC, as they count a unary call)."""
        self._methods: dict[str, _Method] = {}
        for service, servicer in services:
            for method in service.methods:
                if method.name in STREAM_CALLS:
                    request = message_factory.GetMessageClass(method.input_type)
                    self._methods[method.name] = _Method(
                        deserializer(request, limits), getattr(servicer, method.name)
                    )

    async def serve(
        self, requests: AsyncIterator[Any], context: AioContext
    ) -> AsyncIterator[tasks_pb2.CallsResponse]:
        answers: asyncio.Queue[tasks_pb2.CallsResponse | None] = asyncio.Queue()
        running: set[asyncio.Task[None]] = set()
        reading = [True]
        calls = _CallContext(context)
        held = held_stream()
        batching = BATCH_METADATA in calls.invocation_metadata()

        def finished(gate: Gate, task: asyncio.Task[None]) -> None:
            # Here, not in the task: a task cancelled before it ran runs no `finally`.
            gate.leave()
            running.discard(task)
            if not reading[0] and not running:
                answers.put_nowait(None)

        async def read() -> None:
            try:
                async for message in requests:
                    if isinstance(message, Refused):
                        raise message.error  # the envelope itself is malformed
                    start(message)
                    for call in message.more:
                        if call.more:
                            answers.put_nowait(_refusal(call.id, _NESTED))
                        else:
                            start(call)
            finally:
                reading[0] = False
                if not running:
                    answers.put_nowait(None)

        def start(call: tasks_pb2.CallsRequest) -> None:
            gate = self._door.admission.gate_for(call.method)
            try:
                self._door.admit(call.method, gate)
            except Overloaded as refused:
                answers.put_nowait(_refusal(call.id, refused))
                return
            task = asyncio.create_task(self._one(call, calls, held, answers))
            running.add(task)
            task.add_done_callback(functools.partial(finished, gate))

        await context.send_initial_metadata((BATCH_METADATA,))
        reader = asyncio.create_task(read())
        try:
            ended = False
            while not ended:
                answer = await answers.get()
                if answer is None:
                    break
                messages, ended = (
                    batched(answer, _ready(answers), ANSWERS_BATCH_BYTES)
                    if batching
                    else ([answer], False)
                )
                for message in messages:
                    yield message
            await reader  # raises what ended the reading, if anything did
        finally:
            reader.cancel()
            for task in list(running):
                task.cancel()

    async def _one(
        self,
        message: tasks_pb2.CallsRequest,
        context: _CallContext,
        held: Held | None,
        answers: asyncio.Queue[tasks_pb2.CallsResponse | None],
    ) -> None:
        started = time.perf_counter()
        answer = await self._answer(message, context, held)
        answers.put_nowait(answer)
        if self._on_call is not None:
            code = _CODE_NAMES.get(answer.code, grpc.StatusCode.UNKNOWN.name)
            self._on_call(message.method, code, time.perf_counter() - started)

    async def _answer(
        self, message: tasks_pb2.CallsRequest, context: _CallContext, held: Held | None
    ) -> tasks_pb2.CallsResponse:
        method = self._methods.get(message.method)
        if method is None:
            return _refusal(
                message.id,
                InvalidArgument(
                    "method",
                    f"{message.method!r} cannot be called on the Calls stream; it serves "
                    f"{', '.join(STREAM_CALLS)} (make other calls as unary RPCs)",
                ),
            )
        request = method.parse(message.request)
        door = self._door
        try:
            # This task's own caller: the principal its stream's credential gives now.
            principal = door.authorized(held, message.method, request, context.stream)
            if principal is None:
                principal = await door.call(held, message.method, request, context.stream)
        except AuthError as refused:
            return _refusal(message.id, refused)
        set_caller(principal)
        if message.traceparent:  # the caller traces: the call's span continues its span
            context = context.traced(message.traceparent)
        try:
            response = await method.handler(request, context)
            if held is not None and message.method in LONG_POLLS:
                await door.recheck(held)  # a long poll's answer is a delivery
        except AuthError as refused:
            return _refusal(message.id, refused)
        except _Aborted as aborted:
            return _answer(message.id, aborted.code, aborted.details, aborted.trailers)
        except Overloaded as exc:  # the write queue is full (`_rpc` lets it through)
            door.admission.refused(message.method, exc.limit)
            return _refusal(message.id, exc)
        except Exception as exc:  # a handler's bug: answered, and the stream goes on
            log.exception("rpc.crashed", method=message.method)
            return _refusal(message.id, exc)
        return tasks_pb2.CallsResponse(id=message.id, code=0, response=response.SerializeToString())
