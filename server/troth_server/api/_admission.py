"""Admission: the server's limits on calls in flight, and its report of what it refused.

Two gates, so that neither kind of call can starve the other: unary calls
(`--max-concurrent-rpcs`) and long-lived server streams (`Poll`, `WatchPromise`,
`WatchPromises`: `--max-streams`). A call that finds its gate full is answered at
once `RESOURCE_EXHAUSTED`, reason `OVERLOADED`, with a `google.rpc.RetryInfo`
delay, before any of its work is done; so is a write that finds the group
committer's queue full (`--max-queued-writes`, raised as `Overloaded` by
`troth_server.group_commit` and let through by `_rpc` to be answered here).
Health checks and reflection pass no gate: an operator can always ask.

Refusals are counted per RPC (`Admission.refused_total`) and reported by
`OverloadReport` in one `overload` log line per second while they last, never
one line per refused call: under overload, a log line per call would be one
more thing the server cannot afford.

Why the gates matter at all: without them, gRPC core keeps every call that
arrived but that grpc.aio has not yet picked up in a backlog it caps
(`grpc.server.max_pending_requests`, default 1000, hard limit 3000) and cancels
whatever is over the cap, silently: callers saw `CANCELLED` and nothing was
logged. `backlog_options` raises that cap; the gates answer the excess quickly
enough that the backlog never grows near it.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc
import grpc.aio
import structlog

from troth_server.api._status import status_for
from troth_server.domain.errors import Overloaded

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    AioContext: TypeAlias = grpc.aio.ServicerContext[Any, Any]

log = structlog.get_logger("troth.overload")

LIMITED_PREFIX = "/troth.v1."
"""Only troth's own services pass the gates (not health, not reflection)."""

UNARY_FLAG = "max-concurrent-rpcs"
STREAM_FLAG = "max-streams"
UNARY_RETRY_MS = 50
"""A unary slot frees within milliseconds: come back soon (the SDK adds jitter and backoff)."""
STREAM_RETRY_MS = 1000
"""A stream slot frees only when some stream ends: come back later."""


def backlog_options(max_concurrent_rpcs: int, max_streams: int) -> list[tuple[str, int]]:
    """gRPC core options so that a burst waits in core's backlog instead of being
    CANCELLED: room for ten times what the gates admit (at least 20,000 calls), which a
    burst fills only if the event loop stops picking calls up altogether."""
    backlog = max(20_000, 10 * (max_concurrent_rpcs + max_streams))
    return [
        ("grpc.server.max_pending_requests", backlog),
        ("grpc.server.max_pending_requests_hard_limit", backlog),
    ]


@dataclass(slots=True)
class Gate:
    """A count of calls in flight against a limit (no I/O, one event loop: no lock)."""

    flag: str
    limit: int
    what: str
    """What is at the limit, for the message: "unary calls are in progress"."""
    retry_after_ms: int
    in_use: int = 0

    def try_enter(self) -> bool:
        if self.in_use >= self.limit:
            return False
        self.in_use += 1
        return True

    def leave(self) -> None:
        self.in_use -= 1

    def refusal(self) -> Overloaded:
        return Overloaded(
            self.flag, self.limit, f"{self.limit} {self.what}", retry_after_ms=self.retry_after_ms
        )


@dataclass(slots=True)
class Admission:
    """Both gates and the refusal counters (pure: the interceptor and the report use it)."""

    unary: Gate
    streams: Gate
    refused_total: collections.Counter[str] = field(default_factory=collections.Counter)
    """Refused calls per RPC method name, since the start."""
    _since_report: collections.Counter[str] = field(default_factory=collections.Counter)

    @classmethod
    def with_limits(cls, max_concurrent_rpcs: int, max_streams: int) -> Admission:
        return cls(
            unary=Gate(UNARY_FLAG, max_concurrent_rpcs, "unary calls are in progress",
                       UNARY_RETRY_MS),
            streams=Gate(STREAM_FLAG, max_streams, "streams are open", STREAM_RETRY_MS),
        )  # fmt: skip

    def refused(self, method: str) -> None:
        self.refused_total[method] += 1
        self._since_report[method] += 1

    def take_report(self) -> dict[str, int] | None:
        """Refusals per method since the last report (None if there were none), and reset."""
        if not self._since_report:
            return None
        report = dict(self._since_report)
        self._since_report.clear()
        return report

    def limits(self) -> dict[str, int]:
        return {self.unary.flag: self.unary.limit, self.streams.flag: self.streams.limit}


class AdmissionInterceptor(grpc.aio.ServerInterceptor):
    """Puts each troth RPC behind its gate; the wrapped handlers are built once per method."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._handlers: dict[str, grpc.RpcMethodHandler[Any, Any] | None] = {}
        self._statuses: dict[str, grpc.Status] = {}

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method: str = handler_call_details.method
        try:
            cached = self._handlers[method]
        except KeyError:
            cached = self._handlers[method] = self._wrap(
                method, await continuation(handler_call_details)
            )
        if cached is None:  # not ours (health, reflection) or unknown: as gRPC has it
            return await continuation(handler_call_details)
        return cached

    def _wrap(
        self, method: str, handler: grpc.RpcMethodHandler[Any, Any] | None
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        if handler is None or not method.startswith(LIMITED_PREFIX):
            return None
        name = method.rsplit("/", 1)[-1]
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(name, handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._stream(name, handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return None  # troth has no client-streaming RPCs

    def _unary(self, name: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        gate = self._admission.unary

        async def unary(request: Any, context: AioContext) -> Any:
            if not gate.try_enter():
                await self._refuse(name, context, gate)
            try:
                return await inner(request, context)
            except Overloaded as exc:  # the write queue is full (`_rpc` lets it through)
                await self._refuse(name, context, exc)
            finally:
                gate.leave()

        return unary

    def _stream(self, name: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        gate = self._admission.streams

        async def stream(request: Any, context: AioContext) -> AsyncIterator[Any]:
            if not gate.try_enter():
                await self._refuse(name, context, gate)
            # However the stream ends (finished, failed, cancelled by the client), the
            # slot comes back when gRPC is done with the call, not when the generator
            # happens to be collected.
            # (The stubs type the callback as their own `_DoneCallback` class, not a callable.)
            context.add_done_callback(lambda _context: gate.leave())  # type: ignore[arg-type]
            try:
                async for response in inner(request, context):
                    yield response
            except Overloaded as exc:
                await self._refuse(name, context, exc)

        return stream

    async def _refuse(self, name: str, context: AioContext, why: Gate | Overloaded) -> None:
        self._admission.refused(name)
        if isinstance(why, Gate):
            status = self._statuses.get(why.flag)
            if status is None:  # the same answer every time: built once
                status = self._statuses[why.flag] = status_for(why.refusal())
        else:
            status = status_for(why)
        await context.abort(status.code, status.details, status.trailing_metadata)


class OverloadReport:
    """One `overload` log line per second while calls are being refused; `start()` on the
    server's event loop, `stop()` before it closes."""

    def __init__(
        self,
        admission: Admission,
        *,
        queued_writes: Callable[[], int] = lambda: 0,
        queue_limit: int | None = None,
        interval: float = 1.0,
    ) -> None:
        self._admission = admission
        self._queued_writes = queued_writes
        self._queue_limit = queue_limit
        self._interval = interval
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self.report()  # the last second's refusals

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            self.report()

    def report(self, *, always: bool = False) -> None:
        """Log the refusals since the last line (with `always`, also when there were none)."""
        since = self._admission.take_report()
        if since is None and not always:
            return
        admission = self._admission
        limits = admission.limits()
        if self._queue_limit is not None:
            limits["max-queued-writes"] = self._queue_limit
        log.warning(
            "overload",
            refused=since or {},
            refused_total=dict(admission.refused_total),
            unary_in_flight=admission.unary.in_use,
            streams_open=admission.streams.in_use,
            queued_writes=self._queued_writes(),
            limits=limits,
        )
