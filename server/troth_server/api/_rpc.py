"""Wraps every handler: requests refused as they were decoded (`_decode`), error mapping
(via `_status`) and one canonical log line per RPC.

An `Overloaded` refusal (the write queue is full) is the one error let through
unanswered and unlogged: `_admission` answers it, counts it and reports it once
a second, so that an overload costs no log line per refused call.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import structlog

from troth.errors import Reason
from troth_server import _tracing as tracing
from troth_server.api._decode import Refused
from troth_server.api._status import status_for
from troth_server.domain.errors import DomainError, Overloaded
from troth_server.store import StoreError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    import grpc
    import grpc.aio
    from opentelemetry.trace import Tracer

    AioContext: TypeAlias = grpc.aio.ServicerContext[Any, Any]

S = TypeVar("S")
Req = TypeVar("Req")
Resp = TypeVar("Resp")

log = structlog.get_logger("troth.rpc")


def _finish(
    method: str, request: Any, started: float, exc: Exception | None, **fields: Any
) -> grpc.Status | None:
    """Log the canonical line; return the status to abort with, if any."""
    status: grpc.Status | None = None
    code = "OK"
    if exc is not None:
        status = status_for(exc)
        code = status.code.name
        if not isinstance(exc, DomainError | StoreError):
            log.error("rpc.crashed", method=method, exc_info=exc)
        else:
            fields["reason"] = (
                exc.reason.value if isinstance(exc, DomainError) else Reason.STORE_UNAVAILABLE.value
            )
    log.info(
        "rpc",
        method=method,
        code=code,
        duration_ms=round((time.perf_counter() - started) * 1000, 3),
        promise_id=getattr(request, "id", None) or None,
        **fields,
    )
    return status


def _refuse(request: object) -> None:
    """A request the deserializer refused (undecodable, or failing the input checks)."""
    if isinstance(request, Refused):
        raise request.error


def aio_unary(
    method: str,
) -> Callable[
    [Callable[[S, Req, AioContext], Awaitable[Resp]]],
    Callable[[S, Req, AioContext], Awaitable[Resp]],
]:
    def decorate(
        fn: Callable[[S, Req, AioContext], Awaitable[Resp]],
    ) -> Callable[[S, Req, AioContext], Awaitable[Resp]]:
        @functools.wraps(fn)
        async def handler(self: S, request: Req, context: AioContext) -> Resp:
            started = time.perf_counter()
            tracer = tracing.tracer()
            if tracer is not None:
                return await _traced(tracer, method, fn, self, request, context)
            try:
                _refuse(request)
                response = await fn(self, request, context)
            except Overloaded:
                raise
            except Exception as exc:
                status = _finish(method, request, started, exc)
                assert status is not None
                await context.abort(status.code, status.details, status.trailing_metadata)
                raise
            _finish(method, request, started, None)
            return response

        return handler

    return decorate


async def _traced(
    tracer: Tracer,
    method: str,
    fn: Callable[[S, Req, AioContext], Awaitable[Resp]],
    servicer: S,
    request: Req,
    context: AioContext,
) -> Resp:
    """`aio_unary`'s handler inside the RPC's span (`troth_server._tracing`)."""
    started = time.perf_counter()
    span = tracing.RpcSpan(tracer, method, request, context)
    code = "CANCELLED"  # unless it ends otherwise
    try:
        _refuse(request)
        response = await fn(servicer, request, context)
        code = "OK"
    except Overloaded:
        code = "RESOURCE_EXHAUSTED"
        raise
    except Exception as exc:
        status = _finish(method, request, started, exc)
        assert status is not None
        code = status.code.name
        await context.abort(status.code, status.details, status.trailing_metadata)
        raise
    finally:
        span.end(code)
    _finish(method, request, started, None)
    return response


def aio_server_stream(
    method: str,
) -> Callable[
    [Callable[[S, Req, AioContext], AsyncIterator[Resp]]],
    Callable[[S, Req, AioContext], AsyncIterator[Resp]],
]:
    def decorate(
        fn: Callable[[S, Req, AioContext], AsyncIterator[Resp]],
    ) -> Callable[[S, Req, AioContext], AsyncIterator[Resp]]:
        @functools.wraps(fn)
        async def handler(self: S, request: Req, context: AioContext) -> AsyncIterator[Resp]:
            started = time.perf_counter()
            sent = 0
            tracer = tracing.tracer()
            if tracer is not None:
                tracing.stream_opened(tracer, method, request, context)
            try:
                _refuse(request)
                async for response in fn(self, request, context):
                    sent += 1
                    yield response
            except Overloaded:
                raise
            except Exception as exc:
                status = _finish(method, request, started, exc, messages=sent)
                assert status is not None
                await context.abort(status.code, status.details, status.trailing_metadata)
                raise
            _finish(method, request, started, None, messages=sent)

        return handler

    return decorate
