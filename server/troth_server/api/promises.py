"""The `troth.v1.Promises` servicer (grpc.aio).

It is thin: the handlers validate and convert, the service does the work.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeAlias

from troth.client import WATCH_READY_METADATA
from troth.v1 import promises_pb2, promises_pb2_grpc
from troth_server.api import _audit as audit
from troth_server.api import _convert as convert
from troth_server.api._auth import caller, caller_name
from troth_server.api._rpc import aio_server_stream, aio_unary
from troth_server.domain.access import LOCAL_DEVELOPER, Principal
from troth_server.domain.errors import DomainError, InvalidArgument
from troth_server.domain.promise import CreateRequest, Promise, PromiseState, SettleRequest

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import grpc.aio

    AioContext: TypeAlias = grpc.aio.ServicerContext[Any, Any]

    from troth_server.config import Limits
    from troth_server.domain.steps import Fence
    from troth_server.service import PromiseService
    from troth_server.watch import EventFilter


_SettleMessage = (
    promises_pb2.ResolvePromiseRequest
    | promises_pb2.RejectPromiseRequest
    | promises_pb2.CancelPromiseRequest
)


class _Handlers:
    """Request validation and response building."""

    def __init__(self, service: PromiseService, limits: Limits) -> None:
        self._service = service
        self._limits = limits

    def _create_request(
        self, request: promises_pb2.CreatePromiseRequest, context: AioContext
    ) -> tuple[CreateRequest, str | None, SettleRequest | None, Fence | None]:
        create = convert.create_request(request, self._limits)
        too_far = self._service.now() + self._limits.max_ttl_ms
        if create.expire_time is not None and create.expire_time > too_far:
            raise InvalidArgument(
                "expire_time", f"is further away than the limit of {self._limits.max_ttl_ms} ms"
            )
        principal = _recorded(_caller(context, self._limits))
        if create.requested_by is None and principal is not None:
            create = replace(create, requested_by=principal)  # the documented default
        settled_with = convert.settled_with(request, create, self._limits, principal)
        return create, principal, settled_with, convert.fence(request, self._limits)

    def _settle_request(
        self, request: _SettleMessage, state: PromiseState, context: AioContext
    ) -> tuple[SettleRequest, Fence | None, Principal, str | None]:
        caller = _caller(context, self._limits)
        settle = convert.settle_request(request, state, self._limits, _recorded(caller))
        if isinstance(request, promises_pb2.CancelPromiseRequest):
            return settle, None, caller, None
        token = convert.settle_token(request)
        return settle, convert.fence(request, self._limits), caller, token

    async def _settle(
        self, rpc: str, request: _SettleMessage, state: PromiseState, context: AioContext
    ) -> promises_pb2.SettlePromiseResponse:
        """A resolve, reject or cancel, with its audit line (`api/_audit.py`)."""
        settle, fence, caller, token = self._settle_request(request, state, context)
        try:
            promise, applied = await self._service.settle_async(settle, fence, caller, token)
        except DomainError as exc:
            audit.settle_refused(rpc, settle, caller, exc, context)
            raise
        if applied:
            audit.settled(rpc, promise, caller, token is not None, context)
        return _settled((promise, applied))

    def _mint(
        self, request: promises_pb2.MintSettleTokenRequest, caller: Principal
    ) -> promises_pb2.MintSettleTokenResponse:
        promise_id, outcomes, ttl_ms, fence = convert.mint_request(request, self._limits)
        token, granted = self._service.mint_settle_token(
            promise_id, outcomes, ttl_ms, caller, fence
        )
        response = promises_pb2.MintSettleTokenResponse(
            token=token, key_id=granted.key_id, token_id=granted.token_id
        )
        response.expire_time.FromMilliseconds(granted.expire_time)
        return response

    def _get(self, request: promises_pb2.GetPromiseRequest) -> promises_pb2.GetPromiseResponse:
        promise = self._service.get(convert.promise_id(request.id, self._limits))
        return promises_pb2.GetPromiseResponse(promise=convert.to_pb(promise))

    def _search(
        self, request: promises_pb2.SearchPromisesRequest, caller: Principal
    ) -> promises_pb2.SearchPromisesResponse:
        page = self._service.search(
            id_glob=convert.search_id_glob(request.id, self._limits),
            states=convert.search_states(list(request.states)),
            tags=convert.tags(request.tags, self._limits),
            page_size=convert.page_size(request.page_size, self._limits),
            page_token=request.page_token,
            order=convert.search_order(request.order),
            created_before=convert.created_before(request),
            settleable_by=caller if request.mine else None,
        )
        return promises_pb2.SearchPromisesResponse(
            promises=[convert.to_pb(p) for p in page.promises],
            next_page_token=page.next_page_token,
        )

    def _prune(
        self, request: promises_pb2.PrunePromisesRequest
    ) -> promises_pb2.PrunePromisesResponse:
        if not request.HasField("older_than"):
            raise InvalidArgument(
                "older_than",
                "is required: how long ago a promise must have settled to be pruned, "
                "e.g. 2592000s for 30 days",
            )
        age = request.older_than
        if age.seconds < 0 or age.nanos < 0 or age.nanos >= 1_000_000_000:
            raise InvalidArgument(
                "older_than", "must be a duration of 0 or more, with nanos from 0 to 999999999"
            )
        counts = self._service.prune(
            age.seconds * 1000 + age.nanos // 1_000_000, dry_run=request.dry_run
        )
        return promises_pb2.PrunePromisesResponse(
            pruned=counts.promises,
            workflows=counts.workflows,
            standalone=counts.standalone,
            dry_run=request.dry_run,
        )

    def _watch_id(self, request: promises_pb2.WatchPromiseRequest) -> str:
        return convert.promise_id(request.id, self._limits)

    def _event_filter(self, request: promises_pb2.WatchPromisesRequest) -> EventFilter:
        return convert.event_filter(request, self._limits)


def _created(result: tuple[Promise, bool]) -> promises_pb2.CreatePromiseResponse:
    return promises_pb2.CreatePromiseResponse(promise=convert.to_pb(result[0]), created=result[1])


def _settled(result: tuple[Promise, bool]) -> promises_pb2.SettlePromiseResponse:
    return promises_pb2.SettlePromiseResponse(promise=convert.to_pb(result[0]), applied=result[1])


def _watched(promise: Promise) -> promises_pb2.WatchPromiseResponse:
    return promises_pb2.WatchPromiseResponse(promise=convert.to_pb(promise))


def _caller(context: AioContext, limits: Limits) -> Principal:
    """Who makes this call: the one place the api layer decides it. The authenticated
    principal (`api/_auth.py`); with authentication off, the local developer, named by
    its `troth-principal` metadata when it sends one."""
    principal = caller()
    if principal.authenticated:
        return principal
    name = caller_name(context, limits)
    return principal if name is None else replace(principal, name=name)


def _recorded(caller: Principal) -> str | None:
    """The principal recorded as creator or settler (none for an unnamed developer)."""
    return None if caller == LOCAL_DEVELOPER else caller.name


class PromisesServicer(_Handlers, promises_pb2_grpc.PromisesServicer):
    """For the grpc.aio server: one event loop; commits answer a whole batch at once."""

    @aio_unary("CreatePromise")
    async def CreatePromise(
        self, request: promises_pb2.CreatePromiseRequest, context: AioContext
    ) -> promises_pb2.CreatePromiseResponse:
        return _created(await self._service.create_async(*self._create_request(request, context)))

    @aio_unary("GetPromise")
    async def GetPromise(
        self, request: promises_pb2.GetPromiseRequest, context: AioContext
    ) -> promises_pb2.GetPromiseResponse:
        # A point read by primary key: cheaper inline than a hop to a thread. One
        # past its expire_time is decided by the writer, awaited without blocking.
        promise = await self._service.get_async(convert.promise_id(request.id, self._limits))
        return promises_pb2.GetPromiseResponse(promise=convert.to_pb(promise))

    @aio_unary("SearchPromises")
    async def SearchPromises(
        self, request: promises_pb2.SearchPromisesRequest, context: AioContext
    ) -> promises_pb2.SearchPromisesResponse:
        # A search may scan: run it off the loop so it cannot stall other calls.
        return await asyncio.to_thread(self._search, request, _caller(context, self._limits))

    @aio_unary("ResolvePromise")
    async def ResolvePromise(
        self, request: promises_pb2.ResolvePromiseRequest, context: AioContext
    ) -> promises_pb2.SettlePromiseResponse:
        return await self._settle("ResolvePromise", request, PromiseState.RESOLVED, context)

    @aio_unary("RejectPromise")
    async def RejectPromise(
        self, request: promises_pb2.RejectPromiseRequest, context: AioContext
    ) -> promises_pb2.SettlePromiseResponse:
        return await self._settle("RejectPromise", request, PromiseState.REJECTED, context)

    @aio_unary("CancelPromise")
    async def CancelPromise(
        self, request: promises_pb2.CancelPromiseRequest, context: AioContext
    ) -> promises_pb2.SettlePromiseResponse:
        return await self._settle("CancelPromise", request, PromiseState.REJECTED_CANCELED, context)

    @aio_unary("MintSettleToken")
    async def MintSettleToken(
        self, request: promises_pb2.MintSettleTokenRequest, context: AioContext
    ) -> promises_pb2.MintSettleTokenResponse:
        # A point read, and for a worker a look at its task on the writer: off the loop.
        return await asyncio.to_thread(self._mint, request, _caller(context, self._limits))

    @aio_unary("PrunePromises")
    async def PrunePromises(
        self, request: promises_pb2.PrunePromisesRequest, context: AioContext
    ) -> promises_pb2.PrunePromisesResponse:
        # Many small transactions: off the loop, which serves everyone else meanwhile.
        return await asyncio.to_thread(self._prune, request)

    @aio_server_stream("WatchPromise")
    async def WatchPromise(
        self, request: promises_pb2.WatchPromiseRequest, context: AioContext
    ) -> AsyncIterator[promises_pb2.WatchPromiseResponse]:
        watch = self._service.watch_async(self._watch_id(request))
        context.add_done_callback(lambda _ctx: watch.cancel())  # type: ignore[arg-type]
        async for promise in watch:
            yield _watched(promise)

    @aio_server_stream("WatchPromises")
    async def WatchPromises(
        self, request: promises_pb2.WatchPromisesRequest, context: AioContext
    ) -> AsyncIterator[promises_pb2.WatchPromisesResponse]:
        watch = self._service.watch_events_async(
            self._event_filter(request), self._limits.max_watch_backlog
        )
        context.add_done_callback(lambda _ctx: watch.cancel())  # type: ignore[arg-type]
        await context.send_initial_metadata((WATCH_READY_METADATA,))
        async for event in watch:
            yield convert.event_to_pb(event)
