"""The door: every troth call passes here, whatever road it takes (DESIGN §4 rule 15, §7).

The roads: a unary RPC, the opening of a stream (both through `DoorInterceptor`),
each call on the `Calls` stream (`CallMux` asks `Door.call`), and each delivery on
a long-lived stream: a task on `Poll`, an event on `WatchPromise(s)`, the answer
of a `WaitPromise` (`DoorInterceptor` asks `Door.recheck` before it sends one).
Health checks and reflection are not troth services and pass no door.

What the door does, in this order, each written once here:

1. **Admits**: the call takes a slot of its gate, or is refused `RESOURCE_EXHAUSTED`
   (`Admission.admit`, api/_admission.py: the limits and the queue delay).
2. **Authenticates**: the `authorization: Bearer <token>` metadata -> `Principal`
   (`troth_server.auth.Authenticator`). A credential is looked up *per call*, from a
   cache keyed by the credential: a `Pass` (principal, token, the authenticator's
   generation, when it stops) is trusted while its generation is current and its
   JWT's `exp` (with the leeway) is ahead; after a reload of the token file (SIGHUP)
   or past that `exp` it is looked up again, so a revoked, expired or narrowed
   credential stops working on the next call of every road.
3. **Authorizes**: the RPC x role table (`domain.access.may_call`; a settle carrying
   a settle token needs no role: the token is its permission, checked against the
   approver policy for the principal it acts for by `troth_server.guard`). What
   depends on the request's content (an id inside the caller's prefixes, a task
   group its grant names) is decided by `api/_auth.py`'s `require_*`, called by the
   servicer methods that every road shares.
4. **Records**: every refusal is one `auth.refused` audit line (`api/_audit.py`).

**Open streams are patrolled.** Every stream (and every `WaitPromise` long poll) is
held here while it is open. Twice a second, and at once after a reload, each is
checked as its next delivery would be (`recheck`): a stream whose credential is
revoked or expired, whose principal lost the RPC's role or the task group it polls,
or whose id prefixes changed, is ended with `UNAUTHENTICATED` / `PERMISSION_DENIED`
and the reason, and a `Poll` stream so ended gives its tasks back (its handler's
`finally`). A delivery is checked before it is sent, so a stream never delivers a
task or an event its principal may no longer have, even within that half second.
Permission names grant no RPC and decide no stream's reads, so a change of them ends
no stream: each settle is decided with the principal as it is now (a call on `Calls`
gets the renewed principal from `call`), so a narrowed permission stops admitting at
the next settle after the reload.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc
import structlog

from troth.errors import Reason
from troth_server.api import _audit as audit
from troth_server.api._admission import LONG_POLLS, TIMEOUT_METADATA, waited_s
from troth_server.api._auth import (
    SETTLE_TOKEN_BEARER,
    SETTLE_TOKEN_RPCS,
    bears_settle_token,
    group_refusal,
    role_refusal,
    set_caller,
)
from troth_server.api._intercept import MethodInterceptor
from troth_server.api._status import status_for
from troth_server.auth import AuthError, NotAllowed, bearer_token
from troth_server.domain.access import LOCAL_DEVELOPER, Principal, may_call
from troth_server.domain.errors import InvalidArgument, Overloaded

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    import grpc.aio

    from troth_server.api._admission import Admission, Gate
    from troth_server.auth import Authenticator

    AioContext: TypeAlias = grpc.aio.ServicerContext[Any, Any]

log = structlog.get_logger("troth.door")

PATROL_INTERVAL_S = 0.5
"""How often open streams are checked (and at once after a reload): a credential
revoked, expired or narrowed stops an open stream within this (DESIGN §4 rule 15)."""


@dataclass(frozen=True, slots=True)
class Pass:
    """What the door let in: who, with which credential, and until when it is trusted
    without a look-up (the authenticator's `generation`, a JWT's `exp` + leeway)."""

    principal: Principal
    token: str | None = field(default=None, repr=False)
    """The bearer token (a secret: never in a repr); None when there is none to check
    again (authentication off, or a settle carried by its settle token alone)."""
    generation: int = 0
    expires_at: float | None = None
    """Epoch seconds past which the credential is looked up again (and refused)."""


OPEN_PASS = Pass(LOCAL_DEVELOPER)
"""Every call's pass with authentication off."""
_TOKEN_BEARER_PASS = Pass(SETTLE_TOKEN_BEARER)


@dataclass(eq=False, slots=True)
class Held:
    """An open stream (or long poll) the door watches over."""

    rpc: str
    request: Any = field(repr=False)
    opened: Principal
    """The principal it was opened by: a change of its prefixes ends the stream."""
    pass_: Pass
    task: asyncio.Task[Any] | None
    waiting: bool = False
    """Its task is waiting inside the handler for the next thing to send (where ending
    it by cancellation is safe), not sending."""
    ended: AuthError | None = None
    """Why the door ended it (set once)."""


_held: ContextVar[Held | None] = ContextVar("troth_held", default=None)


def held_stream() -> Held | None:
    """The stream the current call came on (set by `DoorInterceptor`), if any."""
    return _held.get()


def stream_refusal(rpc: str, request: Any, opened: Principal, now: Principal) -> AuthError | None:
    """Why an open stream of `rpc` may no longer go on for `now` (the principal its
    credential gives today), opened by `opened`; None while it may."""
    if not may_call(now, rpc):
        return role_refusal(rpc, now)
    if rpc == "Poll":
        refused = group_refusal(now, str(getattr(request, "group", "")), rpc)
        if refused is not None:
            return refused
    if now.prefixes != opened.prefixes:
        return NotAllowed(
            Reason.OUTSIDE_PREFIXES,
            f"the id prefixes of principal {now.name!r} changed while its {rpc} stream was "
            "open; open it again to be served under the new ones",
            rpc=rpc,
            principal=now.name,
        )
    if rpc in _READS_DECIDED_AT_OPEN and (now.roles != opened.roles or now.groups != opened.groups):
        # What a watch may read (a worker's reach: its groups' workflows) was decided
        # when it opened.
        return NotAllowed(
            Reason.GRANT_CHANGED,
            f"the roles or task groups of principal {now.name!r} changed while its {rpc} "
            "was open; open it again to be served under the new grant",
            rpc=rpc,
            principal=now.name,
        )
    return None


_READS_DECIDED_AT_OPEN = frozenset({"WatchPromise", "WatchPromises", "WaitPromise"})


class Door:
    """Admission, authentication, authorization and their record, for every road.

    `authenticator` None means authentication is off: every caller is
    `LOCAL_DEVELOPER`. `verify` is the slow path of authentication (one scrypt or
    one signature check), awaited off the event loop; `wall` the clock JWT expiry is
    read by.
    """

    def __init__(
        self,
        authenticator: Authenticator | None,
        admission: Admission,
        *,
        verify: Callable[[str], Awaitable[Principal]] | None = None,
        wall: Callable[[], float] = time.time,
        patrol_interval_s: float = PATROL_INTERVAL_S,
    ) -> None:
        self._auth = authenticator
        self.admission = admission
        self._verify = verify if verify is not None else self._verify_on_thread
        self._wall = wall
        self._interval = patrol_interval_s
        self._held: set[Held] = set()
        self._wake: asyncio.Event | None = None
        self._patrol: asyncio.Task[None] | None = None

    # -- 1. admission --------------------------------------------------------------

    def admit(self, rpc: str, gate: Gate, context: AioContext | None = None) -> None:
        """Take a slot of `gate` for a call of `rpc` (its time queued measured from its
        metadata, for a unary call or a stream's opening), or raise its refusal
        (`Overloaded`, counted; `InvalidArgument` for malformed timeout metadata)."""
        waited = None
        if context is not None:
            timeout_ms = None
            for key, value in context.invocation_metadata() or ():
                if key == TIMEOUT_METADATA:
                    timeout_ms = value if isinstance(value, str) else None
                    break
            waited = waited_s(timeout_ms, context.time_remaining())
        refusal = self.admission.admit(rpc, gate, waited, time.monotonic())
        if refusal is not None:
            raise refusal

    # -- 2. authentication ---------------------------------------------------------

    async def _verify_on_thread(self, token: str) -> Principal:
        """The slow path without a pool of its own (tests): the cache, else a thread."""
        assert self._auth is not None
        principal = self._auth.cached(token)
        if principal is not None:
            return principal
        return await asyncio.to_thread(self._auth.verify, token)

    async def _authenticate(self, token: str) -> Pass:
        """A new call's credential: from the cache, else verified by `verify` (the
        server's `VerifierPool`: bounded, off the loop, refusals answered late)."""
        auth = self._auth
        assert auth is not None
        generation = auth.generation  # before the look-up: a reload meanwhile looks again
        principal = await self._verify(token)
        return Pass(principal, token, generation, auth.expires_at(token))

    async def _reauthenticate(self, token: str) -> Pass:
        """An open stream's credential, looked up again (a reload, an expiry): refused at
        once when the cache knows it is not valid any more; a JWT checked here (cheap),
        a token-file token whose secret changed through `verify`."""
        auth = self._auth
        assert auth is not None
        generation = auth.generation
        principal = auth.cached(token) or auth.verify_cheaply(token)
        if principal is None:
            principal = await self._verify(token)
        return Pass(principal, token, generation, auth.expires_at(token))

    def current(self, pass_: Pass) -> bool:
        """Whether `pass_` may be trusted without a look-up: nothing to check, or its
        authenticator generation is current and its expiry ahead."""
        if pass_.token is None or self._auth is None:
            return True
        if pass_.generation != self._auth.generation:
            return False
        return pass_.expires_at is None or self._wall() < pass_.expires_at

    async def renew(self, pass_: Pass) -> Pass:
        """`pass_` if it is current, else its credential looked up again (raises
        `Unauthenticated` if it was revoked or has expired)."""
        if self.current(pass_):
            return pass_
        assert pass_.token is not None
        return await self._reauthenticate(pass_.token)

    # -- 3. authorization ------------------------------------------------------------

    @staticmethod
    def authorize(principal: Principal, rpc: str, request: Any) -> None:
        """The RPC x role table; a settle that carries a settle token needs no role."""
        if rpc in SETTLE_TOKEN_RPCS and bears_settle_token(request):
            return
        if not may_call(principal, rpc):
            raise role_refusal(rpc, principal)

    # -- the roads -------------------------------------------------------------------

    async def enter(self, rpc: str, request: Any, context: AioContext) -> Pass:
        """A unary call or a stream's opening: authenticated and authorized (each
        refusal recorded, then raised)."""
        if self._auth is None:
            return OPEN_PASS
        header = _authorization(context)
        if header is None and rpc in SETTLE_TOKEN_RPCS and bears_settle_token(request):
            return _TOKEN_BEARER_PASS  # the token is the permission (`troth_server.guard`)
        found: Principal | None = None
        try:
            pass_ = await self._authenticate(bearer_token(header))
            found = pass_.principal
            self.authorize(found, rpc, request)
        except AuthError as exc:
            audit.auth_refused(rpc, exc, None if found is None else found.name, context)
            raise
        return pass_

    def authorized(
        self, held: Held | None, rpc: str, request: Any, context: AioContext
    ) -> Principal | None:
        """`call` without awaiting, while the stream's credential is current (the hot
        path: a few comparisons); None when it must be looked up again (await `call`)."""
        if held is None or held.ended is not None or not self.current(held.pass_):
            return None
        return self._authorized_as(held.pass_.principal, rpc, request, context)

    async def call(
        self, held: Held | None, rpc: str, request: Any, context: AioContext
    ) -> Principal:
        """A call on the `Calls` stream `held`: its credential renewed, then authorized
        as its own RPC. Returns who makes it."""
        if held is None:  # authentication off (or a stream that passed no door: tests)
            if self._auth is not None:
                raise RuntimeError("a call on a stream that did not pass the door")
            return LOCAL_DEVELOPER
        try:
            await self.recheck(held)
        except AuthError as exc:
            audit.auth_refused(rpc, exc, held.pass_.principal.name, context)
            raise
        return self._authorized_as(held.pass_.principal, rpc, request, context)

    def _authorized_as(
        self, principal: Principal, rpc: str, request: Any, context: AioContext
    ) -> Principal:
        """`authorize`, its refusal recorded: the one check of a call on `Calls`."""
        try:
            self.authorize(principal, rpc, request)
        except AuthError as exc:
            audit.auth_refused(rpc, exc, principal.name, context)
            raise
        return principal

    async def recheck(self, held: Held) -> None:
        """Before a delivery on (or a call of) an open stream: raises the `AuthError`
        that ends it if its credential or grant no longer allows it."""
        if held.ended is not None:
            raise held.ended
        if self.current(held.pass_):
            return
        renewed = await self.renew(held.pass_)
        refusal = stream_refusal(held.rpc, held.request, held.opened, renewed.principal)
        if refusal is not None:
            raise refusal
        held.pass_ = renewed

    # -- open streams ----------------------------------------------------------------

    @contextlib.contextmanager
    def hold(self, pass_: Pass, rpc: str, request: Any) -> Any:
        """Watch over the stream (or long poll) the current task serves while the block
        runs; the `Held` is also what `held_stream()` answers inside it."""
        held = Held(rpc, request, pass_.principal, pass_, asyncio.current_task())
        _held.set(held)  # the task serves this one call: nothing to restore after it
        if pass_.token is not None:
            self._held.add(held)
        try:
            yield held
        finally:
            self._held.discard(held)

    def reloaded(self) -> None:
        """The credentials changed (SIGHUP): check every open stream now."""
        if self._wake is not None:
            self._wake.set()

    def start(self) -> None:
        """Start the patrol of open streams, on the server's event loop."""
        if self._auth is None or self._patrol is not None:
            return
        self._wake = asyncio.Event()
        self._patrol = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._patrol is not None:
            self._patrol.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._patrol
            self._patrol = None

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._interval)
            self._wake.clear()
            await self.patrol()

    async def patrol(self) -> int:
        """Check every open stream; end those that may no longer go on. Returns how
        many were ended."""
        ended = 0
        for held in list(self._held):
            if held.ended is not None:
                continue
            try:
                await self.recheck(held)
            except AuthError as exc:
                self._end(held, exc)
                ended += 1
            except Exception:  # a verification that failed for another reason: next round
                log.exception("door.recheck_failed", rpc=held.rpc)
        return ended

    @staticmethod
    def _end(held: Held, error: AuthError) -> None:
        held.ended = error
        # Cancelled only while it waits inside its handler; one that is sending finds
        # `ended` before it waits again.
        if held.waiting and held.task is not None:
            held.task.cancel()

    @property
    def open_streams(self) -> int:
        return len(self._held)


def _authorization(context: AioContext) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return value if isinstance(value, str) else ""
    return None


class DoorInterceptor(MethodInterceptor):
    """The door for unary RPCs and for the opening (and every delivery) of streams; the
    wrapped handlers are built once per method."""

    def __init__(self, door: Door) -> None:
        self._door = door
        self._statuses: dict[str, grpc.Status] = {}
        super().__init__()

    def _unary(self, name: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        door = self._door
        gate = door.admission.gate_for(name)
        long_poll = name in LONG_POLLS

        async def unary(request: Any, context: AioContext) -> Any:
            await self._admit(name, gate, context)
            try:
                pass_ = await self._enter(name, request, context)
                if not long_poll:
                    return await inner(request, context)
                return await self._long_poll(name, request, context, pass_, inner)
            except Overloaded as exc:  # the write queue is full (`_rpc` lets it through)
                door.admission.refused(name, exc.limit)
                await self._refuse(name, context, exc)
            finally:
                gate.leave()

        return unary

    def _stream(self, name: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        door = self._door
        gate = door.admission.streams

        async def stream(request: Any, context: AioContext) -> AsyncIterator[Any]:
            await self._admit(name, gate, context)
            # However the stream ends, the slot comes back when gRPC is done with the
            # call, not when the generator happens to be collected. (The stubs type the
            # callback as their own `_DoneCallback` class, not a callable.)
            context.add_done_callback(lambda _context: gate.leave())  # type: ignore[arg-type]
            pass_ = await self._enter(name, request, context)
            with door.hold(pass_, name, request) as held:
                responses = inner(request, context)
                try:
                    while True:
                        if held.ended is not None:
                            raise held.ended
                        held.waiting = True
                        try:
                            response = await responses.__anext__()
                        except StopAsyncIteration:
                            return
                        finally:
                            held.waiting = False
                        if not door.current(held.pass_):
                            await door.recheck(held)
                        yield response
                except asyncio.CancelledError:
                    if held.ended is None:
                        raise  # the caller went away, or the server stops
                    _uncancel()
                    await self._end(name, context, held, held.ended)
                except AuthError as exc:
                    await self._end(name, context, held, exc)
                except Overloaded as exc:
                    door.admission.refused(name, exc.limit)
                    await self._refuse(name, context, exc)
                finally:
                    await responses.aclose()

        return stream

    async def _long_poll(
        self, name: str, request: Any, context: AioContext, pass_: Pass, inner: Callable[..., Any]
    ) -> Any:
        """A `WaitPromise`: held while it waits, checked again before it answers."""
        door = self._door
        with door.hold(pass_, name, request) as held:
            try:
                held.waiting = True
                try:
                    response = await inner(request, context)
                finally:
                    held.waiting = False
                await door.recheck(held)
            except asyncio.CancelledError:
                if held.ended is None:
                    raise
                _uncancel()
                await self._end(name, context, held, held.ended)
            except AuthError as exc:
                await self._end(name, context, held, exc)
            return response

    async def _admit(self, name: str, gate: Gate, context: AioContext) -> None:
        try:
            self._door.admit(name, gate, context)
        except InvalidArgument as exc:
            status = status_for(exc)
            await context.abort(status.code, status.details, status.trailing_metadata)
        except Overloaded as exc:
            await self._refuse(name, context, exc, gate)

    async def _enter(self, name: str, request: Any, context: AioContext) -> Pass:
        try:
            pass_ = await self._door.enter(name, request, context)
        except AuthError as exc:
            status = status_for(exc)
            await context.abort(status.code, status.details, status.trailing_metadata)
            raise  # not reached: abort raises
        set_caller(pass_.principal)
        return pass_

    async def _end(self, name: str, context: AioContext, held: Held, error: AuthError) -> None:
        """End a held stream the door no longer lets go on, saying why."""
        audit.auth_refused(name, error, held.pass_.principal.name, context)
        status = status_for(error)
        await context.abort(status.code, status.details, status.trailing_metadata)

    async def _refuse(
        self, name: str, context: AioContext, why: Overloaded, gate: Gate | None = None
    ) -> None:
        if gate is not None and why.limit == gate.flag:
            status = self._statuses.get(gate.flag)
            if status is None:  # the same answer every time: built once
                status = self._statuses[gate.flag] = status_for(why)
        else:
            status = status_for(why)
        await context.abort(status.code, status.details, status.trailing_metadata)


def _uncancel() -> None:
    """The door's own cancellation was caught: the task goes on to answer."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
