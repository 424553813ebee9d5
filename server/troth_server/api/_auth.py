"""Authentication and the RPC x role gate: one interceptor, and `caller()` for the servicers.

Every call to a `troth.v1` service passes `AuthInterceptor` (after admission):

1. With authentication on, the `authorization: Bearer <token>` metadata is
   checked by the `troth_server.auth.Authenticator` (a token-file token, or a
   JWT). Missing, malformed, unknown, wrong or expired credentials are
   UNAUTHENTICATED, each with its own `ErrorInfo.reason`.
2. `domain.access.may_call` decides whether that principal may call the RPC at
   all: PERMISSION_DENIED, reason `ROLE_NOT_ALLOWED`, naming the RPC, the
   principal and the roles that may. (A `ResolvePromise` / `RejectPromise` that
   carries a settle token needs no role and no credential: the token is its
   permission, verified by `troth_server.guard` before the write.)
3. The principal is set for the call: servicers read it with `caller()`. With
   authentication on, `troth-principal` metadata is ignored; with it off
   (`--no-auth`) the caller is `domain.access.LOCAL_DEVELOPER`, named by
   `troth-principal` when the call sends one (`caller_name`).

Health checks and server reflection are not troth services and stay open:
load balancers probe health with no credentials, and reflection describes only
the public schema (the .proto files of this repository), never data, so that
`grpcurl list` works before one has a token.

Every refusal is logged once (`auth.refused`, by `api/_audit.py`: rpc, reason,
principal if known, peer address), never with the token; successful calls add no
log line.
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc

from troth.errors import Reason
from troth_server.api import _audit as audit
from troth_server.api import _convert as convert
from troth_server.api._intercept import MethodInterceptor
from troth_server.api._status import status_for
from troth_server.auth import AuthError, NotAllowed, bearer_token
from troth_server.domain.access import LOCAL_DEVELOPER, RPC_ROLES, Principal, Role, may_call

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    import grpc.aio

    from troth_server.auth import Authenticator
    from troth_server.config import Limits

    AioContext: TypeAlias = grpc.aio.ServicerContext[Any, Any]

SETTLE_TOKEN_RPCS = frozenset({"ResolvePromise", "RejectPromise"})
SETTLE_TOKEN_BEARER = Principal(name="troth:settle-token", roles=frozenset())
"""The caller of a settle that carries a settle token and no other credential."""

_caller: ContextVar[Principal | None] = ContextVar("troth_caller", default=None)


def caller() -> Principal:
    """The principal of the call being handled (set by `AuthInterceptor`)."""
    principal = _caller.get()
    if principal is None:  # fail closed: a handler outside the interceptor is a server bug
        raise RuntimeError("no caller: the call did not pass the authentication interceptor")
    return principal


def caller_name(context: AioContext, limits: Limits) -> str | None:
    """The name recorded for the caller (`settled_by`, `requested_by`): the authenticated
    principal's; with authentication off, the `troth-principal` metadata, if sent."""
    principal = caller()
    if principal.authenticated:
        return principal.name
    return convert.principal(_declared(context), limits)


def _declared(context: AioContext) -> dict[str, str]:
    # Only the declared principal is read; the rest (user agent and such) is not copied.
    for key, value in context.invocation_metadata() or ():
        if key == "troth-principal" and isinstance(value, str):
            return {key: value}
    return {}


def require_group(group: str, context: AioContext, rpc: str = "Poll") -> None:
    """A worker may poll (and work for) only the task groups its grant names."""
    principal = caller()
    if principal.prefixes:
        # A task group is what a worker is trusted with: its workflows' ids are
        # chosen by whoever starts them, so no id prefix can scope a worker.
        scoped = NotAllowed(
            Reason.OUTSIDE_PREFIXES,
            f"principal {principal.name!r} is scoped to the id prefixes "
            f"{_prefixes(principal)} and so may not {rpc} any task group: give a "
            "worker a grant without prefixes, scoped by its groups",
            rpc=rpc,
            principal=principal.name,
            prefixes=_prefixes(principal),
        )
        _audit(rpc, scoped, principal.name, context)
        raise scoped
    if principal.may_work_for(group):
        return
    names = ", ".join(sorted(principal.groups)) or "none"
    error = NotAllowed(
        Reason.GROUP_NOT_ALLOWED,
        f"principal {principal.name!r} may not {rpc} task group {group!r}: its grant names "
        f"the groups {names}",
        rpc=rpc,
        principal=principal.name,
        group=group,
    )
    _audit(rpc, error, principal.name, context)
    raise error


def require_inside(promise_id: str, context: AioContext, rpc: str) -> None:
    """A principal scoped to id prefixes names only promises inside them. Decided
    from the id alone, before any read: the refusal says nothing of whether the
    promise exists."""
    principal = caller()
    if principal.may_touch(promise_id):
        return
    error = NotAllowed(
        Reason.OUTSIDE_PREFIXES,
        f"principal {principal.name!r} may not {rpc} promise {promise_id!r}: it is "
        f"scoped to ids starting with {_prefixes(principal)}",
        rpc=rpc,
        principal=principal.name,
        promise_id=promise_id,
        prefixes=_prefixes(principal),
    )
    _audit(rpc, error, principal.name, context)
    raise error


def _prefixes(principal: Principal) -> str:
    return ", ".join(repr(p) for p in principal.prefixes)


def _audit(rpc: str, error: AuthError, principal: str | None, context: AioContext) -> None:
    audit.auth_refused(rpc, error, principal, context)


def _authorization(context: AioContext) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return value if isinstance(value, str) else ""
    return None


def bears_settle_token(request: Any) -> bool:
    """Whether `request` (a settle) carries a settle token."""
    descriptor = getattr(request, "DESCRIPTOR", None)
    if descriptor is None or "settle_token" not in descriptor.fields_by_name:
        return False
    value = request.settle_token
    if isinstance(value, str | bytes):
        return bool(value)
    return bool(request.HasField("settle_token"))


def role_refusal(rpc: str, principal: Principal) -> NotAllowed:
    allowed = ", ".join(sorted(RPC_ROLES.get(rpc, frozenset({Role.ADMIN}))))
    has = ", ".join(sorted(principal.roles)) or "none"
    return NotAllowed(
        Reason.ROLE_NOT_ALLOWED,
        f"principal {principal.name!r} (roles: {has}) may not call {rpc}; "
        f"the roles that may: {allowed}",
        rpc=rpc,
        principal=principal.name,
        allowed_roles=allowed,
    )


class AuthInterceptor(MethodInterceptor):
    """Authenticates and gates each troth RPC; the wrapped handlers are built once per method.

    `authenticator` None means authentication is off: every caller is `LOCAL_DEVELOPER`.
    """

    def __init__(self, authenticator: Authenticator | None) -> None:
        self._auth = authenticator
        super().__init__()

    def _unary(self, name: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        async def unary(request: Any, context: AioContext) -> Any:
            _caller.set(await self._authenticate(name, request, context))
            return await inner(request, context)

        return unary

    def _stream(self, name: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        async def stream(request: Any, context: AioContext) -> AsyncIterator[Any]:
            _caller.set(await self._authenticate(name, request, context))
            async for response in inner(request, context):
                yield response

        return stream

    async def _authenticate(self, rpc: str, request: Any, context: AioContext) -> Principal:
        auth = self._auth
        if auth is None:
            return LOCAL_DEVELOPER
        found: list[Principal] = []  # who it was, for the audit line of a role refusal
        try:
            return await self._principal(auth, rpc, request, _authorization(context), found)
        except AuthError as exc:
            _audit(rpc, exc, found[0].name if found else None, context)
            status = status_for(exc)
            await context.abort(status.code, status.details, status.trailing_metadata)
            raise  # not reached: abort raises

    @staticmethod
    async def _principal(
        auth: Authenticator, rpc: str, request: Any, header: str | None, found: list[Principal]
    ) -> Principal:
        settle_token = rpc in SETTLE_TOKEN_RPCS and bears_settle_token(request)
        if settle_token and header is None:
            return SETTLE_TOKEN_BEARER
        token = bearer_token(header)
        principal = auth.cached(token)
        if principal is None:
            # One scrypt or signature check, off the event loop; cached after.
            principal = await asyncio.to_thread(auth.verify, token)
        found.append(principal)
        if not settle_token and not may_call(principal, rpc):
            raise role_refusal(rpc, principal)
        return principal
