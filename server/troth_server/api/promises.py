"""The `troth.v1.Promises` servicer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from troth.v1 import promises_pb2, promises_pb2_grpc
from troth_server.api import _convert as convert
from troth_server.api._rpc import server_stream, unary
from troth_server.domain.errors import InvalidArgument
from troth_server.domain.promise import PromiseState

if TYPE_CHECKING:
    from collections.abc import Iterator

    import grpc

    from troth_server.config import Limits
    from troth_server.service import PromiseService


class PromisesServicer(promises_pb2_grpc.PromisesServicer):
    def __init__(self, service: PromiseService, limits: Limits) -> None:
        self._service = service
        self._limits = limits

    @unary("CreatePromise")
    def CreatePromise(
        self, request: promises_pb2.CreatePromiseRequest, context: grpc.ServicerContext
    ) -> promises_pb2.CreatePromiseResponse:
        create = convert.create_request(request, self._limits)
        too_far = self._service.now() + self._limits.max_ttl_ms
        if create.expire_time is not None and create.expire_time > too_far:
            raise InvalidArgument(
                "expire_time", f"is further away than the limit of {self._limits.max_ttl_ms} ms"
            )
        principal = convert.principal(_metadata(context), self._limits)
        promise, created = self._service.create(create, principal)
        return promises_pb2.CreatePromiseResponse(promise=convert.to_pb(promise), created=created)

    @unary("GetPromise")
    def GetPromise(
        self, request: promises_pb2.GetPromiseRequest, context: grpc.ServicerContext
    ) -> promises_pb2.GetPromiseResponse:
        promise = self._service.get(convert.promise_id(request.id, self._limits))
        return promises_pb2.GetPromiseResponse(promise=convert.to_pb(promise))

    @unary("SearchPromises")
    def SearchPromises(
        self, request: promises_pb2.SearchPromisesRequest, context: grpc.ServicerContext
    ) -> promises_pb2.SearchPromisesResponse:
        page = self._service.search(
            id_glob=convert.search_id_glob(request.id, self._limits),
            states=convert.search_states(list(request.states)),
            tags=convert.tags(request.tags, self._limits),
            page_size=convert.page_size(request.page_size, self._limits),
            page_token=request.page_token,
        )
        return promises_pb2.SearchPromisesResponse(
            promises=[convert.to_pb(p) for p in page.promises],
            next_page_token=page.next_page_token,
        )

    @unary("ResolvePromise")
    def ResolvePromise(
        self, request: promises_pb2.ResolvePromiseRequest, context: grpc.ServicerContext
    ) -> promises_pb2.SettlePromiseResponse:
        return self._settle(request, PromiseState.RESOLVED, context)

    @unary("RejectPromise")
    def RejectPromise(
        self, request: promises_pb2.RejectPromiseRequest, context: grpc.ServicerContext
    ) -> promises_pb2.SettlePromiseResponse:
        return self._settle(request, PromiseState.REJECTED, context)

    @unary("CancelPromise")
    def CancelPromise(
        self, request: promises_pb2.CancelPromiseRequest, context: grpc.ServicerContext
    ) -> promises_pb2.SettlePromiseResponse:
        return self._settle(request, PromiseState.REJECTED_CANCELED, context)

    @server_stream("WatchPromise")
    def WatchPromise(
        self, request: promises_pb2.WatchPromiseRequest, context: grpc.ServicerContext
    ) -> Iterator[promises_pb2.WatchPromiseResponse]:
        watch = self._service.watch(convert.promise_id(request.id, self._limits))
        context.add_callback(watch.cancel)
        for promise in watch:
            yield promises_pb2.WatchPromiseResponse(promise=convert.to_pb(promise))

    def _settle(
        self,
        request: promises_pb2.ResolvePromiseRequest
        | promises_pb2.RejectPromiseRequest
        | promises_pb2.CancelPromiseRequest,
        state: PromiseState,
        context: grpc.ServicerContext,
    ) -> promises_pb2.SettlePromiseResponse:
        principal = convert.principal(_metadata(context), self._limits)
        settle = convert.settle_request(request, state, self._limits, principal)
        promise, applied = self._service.settle(settle)
        return promises_pb2.SettlePromiseResponse(promise=convert.to_pb(promise), applied=applied)


def _metadata(context: grpc.ServicerContext) -> dict[str, str]:
    return {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
