"""`MetricsInterceptor` (outermost, before admission): each troth RPC counted by method and
status code when it finishes, a unary call's latency observed, into `troth_server.metrics`.

Outermost, so that what admission refuses (RESOURCE_EXHAUSTED) and what
authentication refuses (UNAUTHENTICATED, PERMISSION_DENIED) count as the
caller saw them. The code is the one the call ended with: an abort's (every
error troth answers is one, `_status`), CANCELLED when the caller went away,
UNKNOWN for an exception that escaped a handler, else OK.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc
import grpc.aio

from troth_server.api._intercept import MethodInterceptor

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from troth_server.metrics import Metrics

    AioContext: TypeAlias = grpc.aio.ServicerContext[Any, Any]


def _code(context: AioContext, exc: BaseException | None) -> str:
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):  # the caller went away
        return grpc.StatusCode.CANCELLED.name
    # What an abort or set_code gave; None at run time when neither did (the stubs
    # say StatusCode).
    code: object = context.code()
    if isinstance(code, grpc.StatusCode):
        return code.name
    return grpc.StatusCode.UNKNOWN.name if exc is not None else grpc.StatusCode.OK.name


class MetricsInterceptor(MethodInterceptor):
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        super().__init__()

    def _unary(self, name: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        metrics = self._metrics

        async def unary(request: Any, context: AioContext) -> Any:
            started = time.perf_counter()
            failure: BaseException | None = None
            try:
                return await inner(request, context)
            except BaseException as exc:
                failure = exc
                raise
            finally:
                metrics.rpc(name, _code(context, failure), time.perf_counter() - started)

        return unary

    def _stream(self, name: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        metrics = self._metrics

        async def stream(request: Any, context: AioContext) -> AsyncIterator[Any]:
            failure: BaseException | None = None
            try:
                async for response in inner(request, context):
                    yield response
            except BaseException as exc:
                failure = exc
                raise
            finally:
                metrics.rpc(name, _code(context, failure), None)

        return stream
