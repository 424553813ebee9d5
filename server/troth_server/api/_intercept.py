"""The shape every troth server interceptor shares: it wraps the handler of each
`troth.v1` method once (cached per method) and leaves every other service (health,
reflection) as gRPC has it. `AdmissionInterceptor` and `AuthInterceptor` say only
what their unary and stream wrappers do."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

TROTH_PREFIX = "/troth.v1."
"""Only troth's own services are wrapped (not health, not reflection)."""


class MethodInterceptor(grpc.aio.ServerInterceptor):
    """Wraps each troth RPC's handler with `_unary` or `_stream`, built once per method."""

    def __init__(self) -> None:
        self._handlers: dict[str, grpc.RpcMethodHandler[Any, Any] | None] = {}

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
        if cached is None:  # health, reflection, or unknown: as gRPC has it
            return await continuation(handler_call_details)
        return cached

    def _wrap(
        self, method: str, handler: grpc.RpcMethodHandler[Any, Any] | None
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        if handler is None or not method.startswith(TROTH_PREFIX):
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
        if handler.stream_stream is not None:
            # `Calls`: the wrappers read no request (the first argument is the stream).
            return grpc.stream_stream_rpc_method_handler(
                self._stream(name, handler.stream_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        raise RuntimeError(f"{method}: troth has no client-only streaming RPCs to wrap")

    def _unary(self, name: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        raise NotImplementedError

    def _stream(self, name: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        raise NotImplementedError
