"""What `Client` reads: a promise by id, searches, and watches until a promise settles.

`PromiseReads` is a base of `Client` (its methods are `Client`'s), as
`troth._operators.OperatorCalls` is: the read-only half of the promise calls,
apart from the creates and settles that `troth._writes.PromiseWrites` makes with their
idempotency keys. Nothing here changes a promise, so every call is retried freely.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from troth import _arguments as check
from troth._convert import (
    datetime_to_proto,
    order_to_proto,
    parse_order,
    parse_state,
    promise_from_proto,
    search_cut_off,
    state_to_proto,
)
from troth._events import PromiseEventStream, wait_promise, watch_promise
from troth._promise import Caller, Promise, PromiseOrder, PromiseState, SearchPage
from troth.v1 import promises_pb2

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping
    from datetime import datetime, timedelta

    from troth._transport import PromiseServiceStub, Transport

__all__ = ["PromiseReads"]


class PromiseReads:
    """`Client`'s reads of promises (a base class of `Client`)."""

    _transport: Transport
    _timeout: float

    @property
    def _stub(self) -> PromiseServiceStub:
        return self._transport.promises

    def whoami(self) -> Caller:
        """Who this client is to the server: the principal its credential stands for,
        with its roles, task groups, id prefixes and permission names.

        .. versionadded:: 0.2.0
        """
        request = promises_pb2.WhoAmIRequest()
        response = self._transport.call(self._stub.WhoAmI, request, timeout=self._timeout)
        found = response.principal
        return Caller(
            name=found.name,
            roles=tuple(found.roles),
            groups=tuple(found.groups),
            prefixes=tuple(found.prefixes),
            permissions=tuple(found.permissions),
            authenticated=found.authenticated,
        )

    def get(self, id: str) -> Promise:
        """Read a promise. A promise past its `expire_time` is never shown `PENDING`.

        Raises:
            NotFoundError: No promise has this id.
        """
        request = promises_pb2.GetPromiseRequest(id=check.promise_id("Client.get", id))
        response = self._transport.call(self._stub.GetPromise, request, timeout=self._timeout)
        return promise_from_proto(response.promise)

    def search(
        self,
        id: str = "*",
        *,
        states: Iterable[PromiseState | str] = (),
        tags: Mapping[str, str] | None = None,
        page_size: int | None = None,
        page_token: str | None = None,
        order: PromiseOrder | str = PromiseOrder.CREATED_ASC,
        created_before: datetime | None = None,
        older_than: timedelta | None = None,
        mine: bool = False,
        parent_id: str | None = None,
    ) -> SearchPage:
        """Read one page of the promises matching a query, in creation order by default.

        Args:
            id: Glob over ids; `*` matches any run of characters.
            states: Any of these states; empty means all.
            tags: Every tag given must be present with this exact value.
            page_size: Results per page; None for the server's default (100).
            page_token: `next_page_token` of the previous page; keep the rest
                of the query unchanged.
            order: `CREATED_ASC` (oldest first), `CREATED_DESC` (newest first)
                or `EXPIRE_TIME_ASC` (soonest deadline first, never-expiring last).
            created_before: Only promises created before this aware datetime.
            older_than: Only promises created more than this long ago (by this
                machine's clock): `created_before=now - older_than`. As it moves
                with the clock, a page token cannot follow it: page with
                `created_before`, or use `search_all`.
            mine: Only the PENDING promises this client's principal may resolve or
                reject now (its roles, prefixes and each promise's approver policy,
                checked by the server row by row): its inbox. A page may then hold
                fewer than `page_size`, even none, and still have a next page.
            parent_id: Only the steps of this workflow (its root's id), by record:
                steps with explicit ids too, not a child workflow's steps.

        Raises:
            InvalidArgumentError: Bad glob, page size or page token.
            ValueError: A state or order that is not a known name; a naive
                datetime; `created_before` with `older_than`, or `older_than`
                with `page_token`.
        """
        call = "Client.search"
        check.promise_id(call, id)
        tags = check.tags(call, tags)
        check.count(call, page_size, "page_size")
        check.optional_text(call, page_token, "page_token")
        created_before = check.moment(call, created_before, "created_before")
        older_than = check.duration(call, older_than, "older_than")
        check.flag(call, mine, "mine")
        parent_id = check.optional_id(call, parent_id, "parent_id")
        if older_than is not None and page_token:
            raise ValueError(
                "older_than is relative to now, so the next page would be another search; "
                "pass created_before=<the first page's cut-off> with page_token, or use "
                "search_all(older_than=...)"
            )
        request = promises_pb2.SearchPromisesRequest(
            id=id,
            states=[state_to_proto(parse_state(state)) for state in states],
            tags=tags,
            page_size=page_size or 0,
            page_token=page_token or "",
            order=order_to_proto(parse_order(order)),
            mine=mine,
            parent_id=parent_id or "",
        )
        cut_off = search_cut_off(created_before, older_than)
        if cut_off is not None:
            request.created_before.CopyFrom(datetime_to_proto(cut_off))
        response = self._transport.call(self._stub.SearchPromises, request, timeout=self._timeout)
        return SearchPage(
            promises=tuple(promise_from_proto(message) for message in response.promises),
            next_page_token=response.next_page_token or None,
        )

    def search_all(
        self,
        id: str = "*",
        *,
        states: Iterable[PromiseState | str] = (),
        tags: Mapping[str, str] | None = None,
        page_size: int | None = None,
        order: PromiseOrder | str = PromiseOrder.CREATED_ASC,
        created_before: datetime | None = None,
        older_than: timedelta | None = None,
        mine: bool = False,
        parent_id: str | None = None,
    ) -> Iterator[Promise]:
        """Iterate over every matching promise, fetching pages as needed.

        Takes the arguments of `search` (except `page_token`); `older_than` is
        turned into `created_before` once, when iteration starts. Each page is
        one call with the client's timeout.
        """
        states = tuple(states)
        call = "Client.search_all"
        created_before = check.moment(call, created_before, "created_before")
        older_than = check.duration(call, older_than, "older_than")
        cut_off = search_cut_off(created_before, older_than)
        token: str | None = None
        while True:
            page = self.search(
                id,
                states=states,
                tags=tags,
                page_size=page_size,
                page_token=token,
                order=order,
                created_before=cut_off,
                mine=mine,
                parent_id=parent_id,
            )
            yield from page.promises
            if page.next_page_token is None:
                return
            token = page.next_page_token

    def workflow_steps(self, workflow_id: str) -> list[Promise]:
        """A workflow's steps in creation order, every page read: the promises its task
        created (their `parent_id` is the workflow), found by that link, so a step with
        an id of its own (`ctx.promise(id=...)`) is there, after the run ends too. A
        child workflow is one step (its root); its own steps are its own
        (`workflow_steps(child_id)`). The root itself is `get(workflow_id)`.

        Raises:
            InvalidArgumentError: The id is not a valid promise id.
        """
        check.promise_id("Client.workflow_steps", workflow_id, "workflow_id")
        return list(
            self.search_all(parent_id=workflow_id, page_size=1000, order=PromiseOrder.CREATED_ASC)
        )

    def watch(self, id: str, *, timeout: float | None = None) -> Iterator[Promise]:
        """Yield the promise as it is now, then once more when it settles.

        The stream survives server restarts and failovers: it reconnects with
        backoff and does not yield the same state twice. Stop iterating at any
        time to end the watch.

        Args:
            id: The promise id.
            timeout: Seconds to wait in all; None waits as long as it takes.

        Raises:
            NotFoundError: No promise has this id.
            DeadlineExceededError: It had not settled within `timeout` (also a `TimeoutError`).
        """
        check.promise_id("Client.watch", id)
        timeout = check.seconds("Client.watch", timeout)
        yield from watch_promise(self._transport, self._stub, id, timeout)

    def watch_promises(
        self,
        id: str = "*",
        *,
        tags: Mapping[str, str] | None = None,
        on_reconnect: Callable[[], None] | None = None,
    ) -> PromiseEventStream:
        """Watch every promise matching a filter: an event each time one is created,
        settled or times out, from now on (what an inbox page listens to).

        Returns once the server has the watch in place, so everything committed
        after this call returns is seen. To show a live list, call this first,
        then list what is there with `search_all`, then apply the events (by
        promise id: an event may repeat what the listing already showed).

        The stream runs until `close()` (or the end of a `with` block, or a
        `break` out of the loop followed by `close()`). When it breaks (the
        server restarts, a failover, or this client read too slowly and the
        server ended the watch), it reconnects with backoff, as `watch` does,
        and resumes from *now*: events in between are not replayed. So
        `on_reconnect` is called each time, after the watch is in place again;
        re-list there (with `search_all`) to catch up. A watch the server ends
        refusing the client's token (revoked, expired, a narrowed grant)
        reconnects so, at once, when the client's token callable or file now
        gives another token; with the same token the refusal is raised.

        Args:
            id: Glob over ids; `*` matches any run of characters.
            tags: Every tag given must be present on the promise with this value.
            on_reconnect: Called (in the iterating thread) after each reconnect.

        Raises:
            InvalidArgumentError: Bad glob or tags.
            UnavailableError: The server could not be reached.
            UnauthenticatedError: The server refused the token, and the client
                has no other (`PermissionDeniedError`: its roles do not allow it).

        Example:
            >>> inbox = {"troth:kind": "promise"}
            >>> with client.watch_promises(tags=inbox) as events:  # doctest: +SKIP
            ...     for event in events:
            ...         print(event.type, event.promise.id)

        .. versionadded:: 0.2.0
        """
        call = "Client.watch_promises"
        tags = check.tags(call, tags)
        request = promises_pb2.WatchPromisesRequest(id=check.promise_id(call, id), tags=tags)
        return PromiseEventStream(self._transport, request, on_reconnect)

    def wait(self, id: str, timeout: float | None = None) -> Promise:
        """Block until the promise settles, and return it settled.

        Waits by `WaitPromise` calls of up to a minute each (on the client's `Calls`
        stream, one message each); once the server was reached (the client's
        stream is open, or a first call answered at once), however young the
        wait, they ride out restarts and failovers as `watch` does (within
        `timeout`); a server never reached fails the wait as fast as any call.

        Args:
            id: The promise id.
            timeout: Seconds to wait; None waits as long as it takes.

        Raises:
            NotFoundError: No promise has this id.
            DeadlineExceededError: It had not settled within `timeout` (also a `TimeoutError`).
        """
        check.promise_id("Client.wait", id)
        timeout = check.seconds("Client.wait", timeout)
        return wait_promise(self._transport, self._stub, id, timeout)
