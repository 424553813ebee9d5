"""The `troth.v1.PromiseService` servicer (grpc.aio).

It is thin: the handlers validate and convert, the service does the work.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

from troth.client import WATCH_READY_METADATA
from troth.v1 import promises_pb2, promises_pb2_grpc, types_pb2
from troth_server import _tracing as tracing
from troth_server.api import _audit as audit
from troth_server.api import _convert as convert
from troth_server.api import _states as states_api
from troth_server.api._auth import caller, caller_name, require_inside
from troth_server.api._rpc import aio_server_stream, aio_unary
from troth_server.domain import steps, visibility
from troth_server.domain.access import LOCAL_DEVELOPER, Principal
from troth_server.domain.errors import DomainError, InvalidArgument
from troth_server.domain.promise import CreateRequest, Promise, PromiseState, SettleRequest
from troth_server.units import duration_text

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import grpc.aio

    AioContext: TypeAlias = grpc.aio.ServicerContext[Any, Any]

    from troth_server.config import Limits
    from troth_server.domain.steps import Fence
    from troth_server.domain.task import Task
    from troth_server.service import PromiseService
    from troth_server.watch import EventFilter


_SettleMessage = (
    promises_pb2.ResolvePromiseRequest
    | promises_pb2.RejectPromiseRequest
    | promises_pb2.CancelPromiseRequest
)
# Each settle RPC has its own response message (buf STANDARD), all of one shape.
_SettleResponse = TypeVar(
    "_SettleResponse",
    promises_pb2.ResolvePromiseResponse,
    promises_pb2.RejectPromiseResponse,
    promises_pb2.CancelPromiseResponse,
)
_SETTLE_RPCS = {
    PromiseState.RESOLVED: "ResolvePromise",
    PromiseState.REJECTED: "RejectPromise",
    PromiseState.REJECTED_CANCELED: "CancelPromise",
}


class WorkflowWaits(Protocol):
    """Why a workflow's task waits for a version no worker here runs, or "" if not."""

    def workflow_waiting(self, root_id: str) -> str:
        """Of the workflow `root_id` (reads its task)."""

    def task_waiting(self, task: Task) -> str:
        """Of the workflow whose active task is `task` (no read)."""


_DEADLINE_MARGIN_S = 0.5
"""A `WaitPromise` with a deadline answers this long before it (a tenth of what is left,
if less), so that its caller gets the pending promise rather than DEADLINE_EXCEEDED."""


class _Handlers:
    """Request validation and response building."""

    workflow_waits: WorkflowWaits | None = None
    """Why a workflow waits for a version no worker here runs (the task servicer; set
    once both servicers are built)."""

    def __init__(self, service: PromiseService, limits: Limits) -> None:
        self._service = service
        self._limits = limits

    def _create_request(
        self, request: promises_pb2.CreatePromiseRequest, context: AioContext
    ) -> tuple[CreateRequest, str | None, SettleRequest | None, Fence | None]:
        return create_args(request, context, self._limits, self._service.now())

    def _settle_request(
        self, request: _SettleMessage, state: PromiseState, context: AioContext
    ) -> tuple[SettleRequest, Fence | None, Principal, str | None]:
        caller = _caller(context, self._limits)
        settle = convert.settle_request(request, state, self._limits, _recorded(caller))
        require_inside(settle.id, context, _SETTLE_RPCS[state])
        if isinstance(request, promises_pb2.CancelPromiseRequest):
            return settle, None, caller, None
        token = convert.settle_token(request)
        return settle, convert.fence(request, self._limits), caller, token

    async def _settle(
        self,
        rpc: str,
        request: _SettleMessage,
        state: PromiseState,
        context: AioContext,
        response: type[_SettleResponse],
    ) -> _SettleResponse:
        """A resolve, reject or cancel, with its audit line (`api/_audit.py`)."""
        settle, fence, caller, token = self._settle_request(request, state, context)
        try:
            if token is not None:
                # Verified first: the settle is then its principal's, and says so.
                settle = self._service.with_settle_token(settle, token)
            settled = await self._service.settle_async(settle, fence, caller)
            promise, applied = settled.promise, settled.applied
        except DomainError as exc:
            audit.settle_refused(rpc, settle, caller, token is not None, exc, context)
            raise
        if applied:
            audit.settled(rpc, promise, caller, settle.token, context)
        if tracing.tracer() is not None:
            await self._link_workflow(promise)
        answer = response(
            promise=self._one(promise, caller, settle.idempotency_key), applied=applied
        )
        if (
            self.workflow_waits is not None
            and fence is None  # a worker's own step: it knows
            and promise.parent_id is not None
            and not isinstance(answer, promises_pb2.CancelPromiseResponse)
        ):
            # A human's decision on a workflow's step: say so if the workflow it resumes
            # (its parent: the root, or a child workflow) cannot resume now for want of
            # a worker of its version: from the workflow's task as the settle's own
            # write read it (`Keys.parents_of`), else (a repeat) by two point reads.
            if settled.workflow_known:
                task = settled.workflow_task
                waiting = "" if task is None else self.workflow_waits.task_waiting(task)
            else:
                waiting = await asyncio.to_thread(
                    self.workflow_waits.workflow_waiting, promise.parent_id
                )
            answer.workflow_waiting = waiting
        return answer

    async def _link_workflow(self, promise: Promise) -> None:
        """The settle's span joins the workflow's trace (a link to the context its
        start recorded on the root): one point read of the root, only when tracing."""
        root = None
        if promise.root_id is not None:
            try:
                root = await self._service.get_async(promise.root_id)
            except DomainError:  # pruned meanwhile: nothing to link to
                root = None
        tracing.annotate_settle(promise, root)

    def _mint(
        self, request: promises_pb2.MintSettleTokenRequest, caller: Principal
    ) -> promises_pb2.MintSettleTokenResponse:
        mint = convert.mint_request(request, self._limits)
        token, granted = self._service.mint_settle_token(
            mint.promise_id, mint.outcomes, mint.ttl_ms, caller, mint.fence, mint.acts_for
        )
        response = promises_pb2.MintSettleTokenResponse(
            token=token,
            key_id=granted.key_id,
            token_id=granted.token_id,
            acts_for=granted.principal,
        )
        response.expire_time.FromMilliseconds(granted.expire_time)
        return response

    def _shown(
        self, promises: list[Promise], reader: Principal, sent_key: str | None = None
    ) -> list[types_pb2.Promise]:
        """`promises` on the wire as `reader` may see them (`domain.visibility`)."""
        views = [visibility.view(p, reader, sent_key=sent_key) for p in promises]
        # A worker's view of a step may need its workflow's group (a point read):
        # only when, without it, something was withheld.
        wanted = {
            p.parent_id
            for p, seen in zip(promises, views, strict=True)
            if seen is not p and p.parent_id is not None and visibility.needs_group(p, reader)
        }
        if wanted:
            groups = self._service.workflow_groups(wanted)
            views = [
                visibility.view(p, reader, groups.get(p.parent_id), sent_key=sent_key)
                if p.parent_id in wanted
                else seen
                for p, seen in zip(promises, views, strict=True)
            ]
        return [convert.to_pb(seen) for seen in views]

    def _one(
        self, promise: Promise, reader: Principal, sent_key: str | None = None
    ) -> types_pb2.Promise:
        return self._shown([promise], reader, sent_key)[0]

    def _read_id(self, value: str, context: AioContext, rpc: str) -> str:
        promise_id = convert.promise_id(value, self._limits)
        require_inside(promise_id, context, rpc)
        return promise_id

    def _search(
        self, request: promises_pb2.SearchPromisesRequest, reader: Principal
    ) -> promises_pb2.SearchPromisesResponse:
        id_glob = convert.search_id_glob(request.id, self._limits)
        prefixes = reader.scope(id_glob)
        if prefixes is None:
            # Every id the glob matches is outside the reader's prefixes.
            return promises_pb2.SearchPromisesResponse()
        page = self._service.search(
            id_glob=id_glob,
            states=convert.search_states(list(request.states)),
            tags=convert.tags(request.tags, self._limits),
            page_size=convert.page_size(request.page_size, self._limits),
            page_token=request.page_token,
            order=convert.search_order(request.order),
            created_before=convert.created_before(request),
            settleable_by=reader if request.mine else None,
            prefixes=prefixes,
            parent_id=convert.search_parent(request.parent_id, self._limits),
        )
        return promises_pb2.SearchPromisesResponse(
            promises=self._shown(page.promises, reader),
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

    def _event_filter(
        self, request: promises_pb2.WatchPromisesRequest, reader: Principal
    ) -> EventFilter | None:
        """The filter of a WatchPromises stream (None: nothing the reader may see)."""
        wanted = convert.event_filter(request, self._limits)
        prefixes = reader.scope(wanted.id_glob)
        return None if prefixes is None else replace(wanted, prefixes=prefixes)

    def _created(
        self, result: tuple[Promise, bool], reader: Principal, sent_key: str | None
    ) -> promises_pb2.CreatePromiseResponse:
        return promises_pb2.CreatePromiseResponse(
            promise=self._one(result[0], reader, sent_key), created=result[1]
        )


def create_args(
    request: promises_pb2.CreatePromiseRequest, context: AioContext, limits: Limits, now: int
) -> tuple[CreateRequest, str | None, SettleRequest | None, Fence | None]:
    """What a `CreatePromise` asks, checked: the one reading of a create request, for
    `CreatePromise` and for a step carried in `CompleteTask` (`record_step`)."""
    create = convert.create_request(request, limits)
    require_inside(create.id, context, "CreatePromise")
    if not request.HasField("fence"):
        steps.check_worker_start(_caller(context, limits), create.id, create.tags)
    too_far = now + limits.max_ttl_ms
    if create.expire_time is not None and create.expire_time > too_far:
        raise InvalidArgument(
            "expire_time",
            f"is further away than the limit of {duration_text(limits.max_ttl_ms)}",
        )
    principal = _recorded(_caller(context, limits))
    if create.requested_by is None and principal is not None:
        create = replace(create, requested_by=principal)  # the documented default
    settled_with = convert.settled_with(request, create, limits, principal)
    return create, principal, settled_with, convert.fence(request, limits)


def _waited(
    request: promises_pb2.WaitPromiseRequest | promises_pb2.CreatePromiseRequest,
    context: AioContext,
) -> float:
    """How long a wait for a settle may take, in seconds: what the request asks, and an
    answer (pending) before the caller gives up on the call."""
    wait = convert.wait_ms(request) / 1000
    left = context.time_remaining()
    if left is not None:
        wait = max(0.0, min(wait, left - min(_DEADLINE_MARGIN_S, left / 10)))
    return wait


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


class PromiseServiceServicer(_Handlers, promises_pb2_grpc.PromiseServiceServicer):
    """For the grpc.aio server: one event loop; commits answer a whole batch at once."""

    @aio_unary("CreatePromise")
    async def CreatePromise(
        self, request: promises_pb2.CreatePromiseRequest, context: AioContext
    ) -> promises_pb2.CreatePromiseResponse:
        create = self._create_request(request, context)
        reader = _caller(context, self._limits)
        if request.HasField("state"):  # a workflow's read or write of its state slot
            name, value = states_api.state_step(request, create[2], create[3] is not None)
            request_, principal, _, fence = create
            assert fence is not None
            stepped = await self._service.state_step_async(request_, principal, fence, name, value)
            return self._created(stepped, reader, request_.idempotency_key)
        wait = None
        if request.HasField("wait"):  # checked before the write, as every field
            if create[3] is not None:
                raise InvalidArgument(
                    "wait",
                    "a workflow's step does not wait for its own settle; wait with WaitPromise",
                )
            wait = _waited(request, context)
        result = await self._service.create_async(*create)
        if not result[1] and create[3] is None:
            # A repeat answers with the promise as it is: a read, by the reader's reach.
            self._service.check_reach(result[0], reader, "read")
        if wait is not None and not result[0].is_settled:
            # Then as `WaitPromise` answers: once settled, or as it is after the wait.
            self._service.check_reach(result[0], reader, "read")
            settled = await self._service.wait_async(result[0].id, wait)
            result = (settled, result[1])
        return self._created(result, reader, create[0].idempotency_key)

    @aio_unary("GetPromise")
    async def GetPromise(
        self, request: promises_pb2.GetPromiseRequest, context: AioContext
    ) -> promises_pb2.GetPromiseResponse:
        # A point read by primary key: cheaper inline than a hop to a thread. One
        # past its expire_time is decided by the writer, awaited without blocking.
        promise_id = self._read_id(request.id, context, "GetPromise")
        promise = await self._service.get_async(promise_id)
        reader = _caller(context, self._limits)
        self._service.check_reach(promise, reader, "read")
        return promises_pb2.GetPromiseResponse(promise=self._one(promise, reader))

    @aio_unary("SearchPromises")
    async def SearchPromises(
        self, request: promises_pb2.SearchPromisesRequest, context: AioContext
    ) -> promises_pb2.SearchPromisesResponse:
        # A search may scan: run it off the loop so it cannot stall other calls.
        return await asyncio.to_thread(self._search, request, _caller(context, self._limits))

    @aio_unary("ResolvePromise")
    async def ResolvePromise(
        self, request: promises_pb2.ResolvePromiseRequest, context: AioContext
    ) -> promises_pb2.ResolvePromiseResponse:
        return await self._settle(
            "ResolvePromise",
            request,
            PromiseState.RESOLVED,
            context,
            promises_pb2.ResolvePromiseResponse,
        )

    @aio_unary("RejectPromise")
    async def RejectPromise(
        self, request: promises_pb2.RejectPromiseRequest, context: AioContext
    ) -> promises_pb2.RejectPromiseResponse:
        return await self._settle(
            "RejectPromise",
            request,
            PromiseState.REJECTED,
            context,
            promises_pb2.RejectPromiseResponse,
        )

    @aio_unary("CancelPromise")
    async def CancelPromise(
        self, request: promises_pb2.CancelPromiseRequest, context: AioContext
    ) -> promises_pb2.CancelPromiseResponse:
        return await self._settle(
            "CancelPromise",
            request,
            PromiseState.REJECTED_CANCELED,
            context,
            promises_pb2.CancelPromiseResponse,
        )

    @aio_unary("MintSettleToken")
    async def MintSettleToken(
        self, request: promises_pb2.MintSettleTokenRequest, context: AioContext
    ) -> promises_pb2.MintSettleTokenResponse:
        # A point read, and for a worker a look at its task on the writer: off the loop.
        require_inside(request.promise_id, context, "MintSettleToken")
        return await asyncio.to_thread(self._mint, request, _caller(context, self._limits))

    @aio_unary("WhoAmI")
    async def WhoAmI(
        self, request: promises_pb2.WhoAmIRequest, context: AioContext
    ) -> promises_pb2.WhoAmIResponse:
        # The door's principal: nothing is read.
        return promises_pb2.WhoAmIResponse(
            principal=convert.principal_to_pb(_caller(context, self._limits))
        )

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
        reader = _caller(context, self._limits)
        watch = self._service.watch_async(self._read_id(request.id, context, "WatchPromise"))
        context.add_done_callback(lambda _ctx: watch.cancel())  # type: ignore[arg-type]
        async for promise in watch:
            self._service.check_reach(promise, reader, "watch")
            yield promises_pb2.WatchPromiseResponse(promise=self._one(promise, reader))

    @aio_unary("WaitPromise")
    async def WaitPromise(
        self, request: promises_pb2.WaitPromiseRequest, context: AioContext
    ) -> promises_pb2.WaitPromiseResponse:
        promise_id = self._read_id(request.id, context, "WaitPromise")
        reader = _caller(context, self._limits)
        if steps.is_confined(reader):  # refused before the wait, not after it
            self._service.check_reach(await self._service.get_async(promise_id), reader, "read")
        promise = await self._service.wait_async(promise_id, _waited(request, context))
        return promises_pb2.WaitPromiseResponse(promise=self._one(promise, reader))

    @aio_server_stream("WatchPromises")
    async def WatchPromises(
        self, request: promises_pb2.WatchPromisesRequest, context: AioContext
    ) -> AsyncIterator[promises_pb2.WatchPromisesResponse]:
        reader = _caller(context, self._limits)
        wanted = self._event_filter(request, reader)
        if wanted is None:
            # Nothing the reader may see can match: no subscription, and the stream
            # ends at once, as it would at shutdown.
            await context.send_initial_metadata((WATCH_READY_METADATA,))
            return
        watch = self._service.watch_events_async(wanted, self._limits.max_watch_backlog)
        context.add_done_callback(lambda _ctx: watch.cancel())  # type: ignore[arg-type]
        await context.send_initial_metadata((WATCH_READY_METADATA,))
        async for event in watch:
            yield convert.event_to_pb(event, self._one(event.promise, reader))
