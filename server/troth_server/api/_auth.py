"""Who the caller is, for the servicers, and the rules that depend on a request's content.

The door (`api/_door.py`) authenticates and authorizes every call on every road
and sets its principal: the servicers read it with `caller()` (with
authentication off, `domain.access.LOCAL_DEVELOPER`, named by `troth-principal`
metadata when the call sends one: `caller_name`). What a request names is checked
here, by the servicer methods that unary calls and calls on `Calls` share:
`require_group` (a worker polls and works only for the task groups its grant
names; never a principal scoped to prefixes) and `require_inside` (an id named by a
principal scoped to prefixes). `role_refusal` and `group_refusal` are the refusals
the door also ends an open stream with. Each refusal is recorded once
(`auth.refused`, `api/_audit.py`), never with the token.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeAlias

from troth.errors import Reason
from troth_server.api import _audit as audit
from troth_server.api import _convert as convert
from troth_server.auth import AuthError, NotAllowed
from troth_server.domain.access import RPC_ROLES, Principal, Role

if TYPE_CHECKING:
    import grpc.aio

    from troth_server.config import Limits

    AioContext: TypeAlias = grpc.aio.ServicerContext[Any, Any]

SETTLE_TOKEN_RPCS = frozenset({"ResolvePromise", "RejectPromise"})
SETTLE_TOKEN_BEARER = Principal(name="troth:settle-token", roles=frozenset())
"""The caller of a settle that carries a settle token and no other credential."""

_caller: ContextVar[Principal | None] = ContextVar("troth_caller", default=None)


def caller() -> Principal:
    """The principal of the call being handled (set by the door, `api/_door.py`)."""
    principal = _caller.get()
    if principal is None:  # fail closed: a handler outside the interceptor is a server bug
        raise RuntimeError("no caller: the call did not pass the door (api/_door.py)")
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


def set_caller(principal: Principal) -> None:
    """Who makes the call being handled (the door sets it, for the current task)."""
    _caller.set(principal)


def group_refusal(principal: Principal, group: str, rpc: str = "Poll") -> NotAllowed | None:
    """Why `principal` may not poll (or work for) task group `group`; None if it may."""
    if principal.prefixes:
        # A task group is what a worker is trusted with: its workflows' ids are
        # chosen by whoever starts them, so no id prefix can scope a worker.
        return NotAllowed(
            Reason.OUTSIDE_PREFIXES,
            f"principal {principal.name!r} is scoped to the id prefixes "
            f"{_prefixes(principal)} and so may not {rpc} any task group: give a "
            "worker a grant without prefixes, scoped by its groups",
            rpc=rpc,
            principal=principal.name,
            prefixes=_prefixes(principal),
        )
    if principal.may_work_for(group):
        return None
    names = ", ".join(sorted(principal.groups)) or "none"
    return NotAllowed(
        Reason.GROUP_NOT_ALLOWED,
        f"principal {principal.name!r} may not {rpc} task group {group!r}: its grant names "
        f"the groups {names}",
        rpc=rpc,
        principal=principal.name,
        group=group,
    )


def require_group(group: str, context: AioContext, rpc: str = "Poll") -> None:
    """A worker may poll (and work for) only the task groups its grant names."""
    principal = caller()
    error = group_refusal(principal, group, rpc)
    if error is not None:
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
