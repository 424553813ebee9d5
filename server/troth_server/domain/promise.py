"""The durable-promise state machine: create, settle, expire, and what a reader sees.

Times are integer milliseconds since the Unix epoch; `now` is always a
parameter. Every function is pure: it returns the new promise (and a flag) or
raises a `DomainError`; the caller decides what to persist.

Legal moves, the one table of this machine:

| from     | event                 | to                                     |
|----------|-----------------------|----------------------------------------|
| (none)   | create                | PENDING                                |
| PENDING  | resolve               | RESOLVED                               |
| PENDING  | reject                | REJECTED                               |
| PENDING  | cancel                | REJECTED_CANCELED                      |
| PENDING  | expire (now ≥ expiry) | REJECTED_TIMEDOUT (RESOLVED if a timer)|
| settled  | anything              | unchanged (repeat, or an error)        |
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from troth_server.domain import starts
from troth_server.domain.errors import (
    InvalidArgument,
    PromiseAlreadyExists,
    PromiseAlreadySettled,
    PromiseNotFound,
    PromiseTimedOut,
    SettleTargetNotFound,
    ValueNotChecked,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from troth_server.domain.approvers import Approvers
    from troth_server.domain.settle_tokens import SettleToken

TIMER_TAG = "troth:timer"
"""A promise tagged `troth:timer=true` resolves, rather than times out, at expiry."""

EARLY_TAG = "troth:early"
"""Tag `true` on a promise settled before anyone created it (`create_if_missing`).

The first create of its id adopts it: the promise takes the create's param,
tags and metadata (so it reads as its creator made it, minus this tag) and the
create answers with it, settled. Until then it is only an answer waiting."""

TIMEOUT_PRINCIPAL = "troth:timeout"
"""`settled_by` of a promise that settled by reaching its expire_time."""


class PromiseState(enum.StrEnum):
    PENDING = "PENDING"
    RESOLVED = "RESOLVED"
    REJECTED = "REJECTED"
    REJECTED_CANCELED = "REJECTED_CANCELED"
    REJECTED_TIMEDOUT = "REJECTED_TIMEDOUT"


SETTLE_VERBS: Mapping[PromiseState, str] = {
    PromiseState.RESOLVED: "resolved",
    PromiseState.REJECTED: "rejected",
    PromiseState.REJECTED_CANCELED: "canceled",
    PromiseState.REJECTED_TIMEDOUT: "timed out",
}


@dataclass(frozen=True, slots=True)
class Payload:
    headers: Mapping[str, str] = field(default_factory=dict)
    data: bytes = b""


EMPTY = Payload()


@dataclass(frozen=True, slots=True)
class Promise:
    id: str
    state: PromiseState
    param: Payload
    value: Payload
    tags: Mapping[str, str]
    create_time: int
    settle_time: int | None = None
    expire_time: int | None = None
    idempotency_key_for_create: str | None = None
    idempotency_key_for_settle: str | None = None
    settled_by: str | None = None
    schema: str | None = None
    """JSON Schema text that a resolve value must satisfy."""
    title: str | None = None
    message: str | None = None
    requested_by: str | None = None
    workflow_version: str | None = None
    """A root's workflow code version, recorded when a worker first takes it."""
    root_id: str | None = None
    """A workflow's step: the top-level workflow root it belongs to (DESIGN §4.13)."""
    parent_id: str | None = None
    """A workflow's step: the workflow (root or child root) whose task created it."""
    approvers: Approvers | None = None
    """Who may resolve or reject it (`domain.approvers`); None: anyone."""
    started_by: str | None = None
    """The authenticated creator; on a workflow's step, its top-level root's."""
    settle_token_id: str | None = None
    """The settle token it was settled with, if any: what makes a token single-use."""
    instance: int = 0
    """Drawn at random when the promise is created (1 to 2**63 - 1): what tells it from
    an earlier promise of the same id, pruned since, whose settle tokens are void for
    it. 0: created before instances were recorded, or settled before it was created."""

    @property
    def is_timer(self) -> bool:
        return self.tags.get(TIMER_TAG) == "true"

    @property
    def is_settled(self) -> bool:
        return self.state is not PromiseState.PENDING


@dataclass(frozen=True, slots=True)
class CreateRequest:
    id: str
    param: Payload
    tags: Mapping[str, str]
    expire_time: int | None = None
    """Absolute expiry in ms."""
    ttl: int | None = None
    """Expiry relative to the create's `now`, in ms. Neither set: never expires."""
    idempotency_key: str | None = None
    strict: bool = False
    schema: str | None = None
    """JSON Schema text, already checked (`domain.schema.check_schema`)."""
    title: str | None = None
    message: str | None = None
    requested_by: str | None = None
    approvers: Approvers | None = None


@dataclass(frozen=True, slots=True)
class SettleRequest:
    id: str
    state: PromiseState
    """The state asked for: RESOLVED, REJECTED or REJECTED_CANCELED."""
    value: Payload
    idempotency_key: str | None = None
    strict: bool = False
    principal: str | None = None
    create_if_missing: bool = False
    """Settle before the wait exists: an unknown id is created already settled."""
    checked_schema: str | None = None
    """The schema text `value` was checked against (`domain.schema.check_value`),
    before the write: a resolve of a promise with another schema is refused with
    `ValueNotChecked`, so the writer never runs a schema check itself."""
    token: SettleToken | None = None
    """The verified settle token this settle carries (`domain.settle_tokens`): the
    settle is then its principal's, and `principal` says so with the means."""
    checked_policy: Approvers | None = None
    """The approver policy the caller was checked against before the write; the
    writer refuses (`PolicyNotChecked`) when the promise's is another."""
    quorum: tuple[str, ...] = ()
    """The other promises of the promise's distinct quorum, found before the write:
    the writer checks that none was settled by this settle's principal."""


def is_expired(promise: Promise, now: int) -> bool:
    return (
        promise.state is PromiseState.PENDING
        and promise.expire_time is not None
        and now >= promise.expire_time
    )


def expire(promise: Promise) -> Promise:
    """The promise as settled by its own expiry (call only when `is_expired`)."""
    return replace(
        promise,
        state=PromiseState.RESOLVED if promise.is_timer else PromiseState.REJECTED_TIMEDOUT,
        settle_time=promise.expire_time,
        settled_by=TIMEOUT_PRINCIPAL,
    )


def effective(promise: Promise, now: int) -> Promise:
    """What a reader at `now` sees: an expired PENDING promise is already settled."""
    return expire(promise) if is_expired(promise, now) else promise


def create(
    existing: Promise | None,
    request: CreateRequest,
    now: int,
    *,
    cap: int | None = None,
    links: tuple[str, str] | None = None,
    started_by: str | None = None,
    instance: int = 0,
) -> tuple[Promise, bool]:
    """Create a promise, or recognise a repeat of the create that made `existing`.

    `cap` is the latest expire_time allowed (a workflow step never outlives its
    root, DESIGN §4.5); the effective expire_time is in the returned promise.
    `links` is (root_id, parent_id) of a workflow's step, recorded on a promise
    this create makes (or adopts); `started_by` the principal recorded as its
    starter (the creator, or a step's root's starter); `instance` the random number a
    promise this create makes records (`Promise.instance`). Returns the promise (as a
    reader at `now` sees it) and whether it was created.
    """
    if existing is None:
        expire_time = request.expire_time
        if request.ttl is not None:
            if request.ttl <= 0:
                raise InvalidArgument("ttl", "must be positive, e.g. 30s; omit it for the default")
            expire_time = now + request.ttl
        elif expire_time is not None and expire_time <= now:
            raise InvalidArgument(
                "expire_time",
                f"{_iso(expire_time)} is not in the future (server time "
                f"{_iso(now)}); send a later expire_time or a ttl",
            )
        promise = Promise(
            id=request.id,
            state=PromiseState.PENDING,
            param=request.param,
            value=EMPTY,
            tags=request.tags,
            create_time=now,
            expire_time=expire_time if cap is None else min(expire_time or cap, cap),
            idempotency_key_for_create=request.idempotency_key,
            schema=request.schema,
            title=request.title,
            message=request.message,
            requested_by=request.requested_by,
            root_id=None if links is None else links[0],
            parent_id=None if links is None else links[1],
            approvers=request.approvers,
            started_by=started_by,
            instance=instance,
        )
        return promise, True

    if is_early(existing):
        return adopt(existing, request, links, started_by), False
    current = effective(existing, now)
    if starts.is_start(request.tags):
        starts.check_repeat(existing, request)  # a workflow's id is its identity
    elif request.idempotency_key or existing.idempotency_key_for_create:
        if request.idempotency_key != existing.idempotency_key_for_create:
            raise PromiseAlreadyExists(
                request.id,
                "it was created with a different idempotency key; use another id, or "
                "send the original create's idempotency key to get the existing promise",
            )
    elif request.param != existing.param or dict(request.tags) != dict(existing.tags):
        raise PromiseAlreadyExists(
            request.id,
            "it was created with a different param or tags; use another id, or repeat "
            "the original create exactly (or with its idempotency key)",
        )
    if request.strict and current.is_settled:
        raise PromiseAlreadyExists(
            request.id,
            f"it is already {SETTLE_VERBS[current.state]} and the create is strict; "
            "read it with GetPromise, or repeat the create without strict",
        )
    return current, False


def is_early(promise: Promise) -> bool:
    """Whether the promise was settled before anyone created it, and is not adopted
    yet. Settled, too: a creator's own `troth:early` tag on a pending promise does
    not let a later create rewrite it."""
    return promise.is_settled and promise.tags.get(EARLY_TAG) == "true"


def adopt(
    early: Promise,
    request: CreateRequest,
    links: tuple[str, str] | None = None,
    started_by: str | None = None,
) -> Promise:
    """The settled-early promise `early` as the create `request` would have made it.

    Its settlement (state, value, time, who) is kept; everything the creator
    decides is taken from the create. A repeat of that create is then
    recognised by the usual rules.
    """
    return replace(
        early,
        param=request.param,
        tags=request.tags,
        idempotency_key_for_create=request.idempotency_key,
        schema=request.schema,
        title=request.title,
        message=request.message,
        requested_by=request.requested_by,
        approvers=request.approvers,
        started_by=started_by,
        root_id=early.root_id if links is None else links[0],
        parent_id=early.parent_id if links is None else links[1],
    )


def settle(existing: Promise | None, request: SettleRequest, now: int) -> tuple[Promise, bool]:
    """Settle a pending promise, or recognise a repeat of the settle that won.

    With `create_if_missing`, an unknown id is created already settled (tagged
    `EARLY_TAG`). Returns the promise and whether this settle was the one applied.
    """
    if existing is None:
        if not request.create_if_missing:
            if request.state is PromiseState.REJECTED_CANCELED:
                raise PromiseNotFound(request.id)  # (create_if_missing is not for a cancel)
            raise SettleTargetNotFound(request.id)
        if request.state is PromiseState.REJECTED_CANCELED:
            raise InvalidArgument(
                "create_if_missing", "applies to resolve and reject only, not to cancel"
            )
        early = Promise(
            id=request.id,
            state=request.state,
            param=EMPTY,
            value=request.value,
            tags={EARLY_TAG: "true"},
            create_time=now,
            settle_time=now,
            idempotency_key_for_settle=request.idempotency_key,
            settled_by=request.principal,
        )
        return early, True
    if existing.state is PromiseState.PENDING:
        if is_expired(existing, now):
            raise _timed_out(expire(existing))
        if (
            existing.schema is not None
            and request.state is PromiseState.RESOLVED
            and request.checked_schema != existing.schema
        ):
            raise ValueNotChecked(existing.id, existing.schema)
        settled = replace(
            existing,
            state=request.state,
            value=request.value,
            settle_time=now,
            idempotency_key_for_settle=request.idempotency_key,
            settled_by=request.principal,
            settle_token_id=None if request.token is None else request.token.token_id,
        )
        return settled, True

    if (
        request.idempotency_key
        and request.idempotency_key == existing.idempotency_key_for_settle
        and (not request.strict or request.state is existing.state)
    ):
        return existing, False
    if existing.settled_by == TIMEOUT_PRINCIPAL and existing.state in (
        PromiseState.REJECTED_TIMEDOUT,
        PromiseState.RESOLVED,
    ):
        raise _timed_out(existing)
    by = f" by {existing.settled_by!r}" if existing.settled_by else ""
    # The winner's key is its own (DESIGN §7): the message says only whether it was
    # this settle's, which the caller knows; GetPromise shows it to its writer.
    if not existing.idempotency_key_for_settle:
        key = " without an idempotency key"
    elif existing.idempotency_key_for_settle == request.idempotency_key:
        key = " with this settle's idempotency key (a strict repeat must ask the same state)"
    else:
        key = " with another idempotency key"
    assert existing.settle_time is not None
    raise PromiseAlreadySettled(
        existing,
        f"promise {existing.id!r} was already {SETTLE_VERBS[existing.state]}"
        f"{by} at {_iso(existing.settle_time)}{key}{_why(existing)}; this settle was not "
        "applied. "
        "Read the promise to see its value; only a repeat with the winner's "
        "idempotency key is answered with success",
    )


def _why(promise: Promise) -> str:
    """The reason a cancelled promise's value gives (`{"reason": ...}`), for messages."""
    if promise.state is not PromiseState.REJECTED_CANCELED or not promise.value.data:
        return ""
    try:
        value = json.loads(promise.value.data)
    except ValueError:
        return ""
    if not isinstance(value, dict) or not isinstance(value.get("reason"), str):
        return ""
    workflow = value.get("workflow")
    of = f", workflow {workflow!r}" if isinstance(workflow, str) else ""
    return f" (reason: {value['reason']}{of})"


def _timed_out(promise: Promise) -> PromiseTimedOut:
    assert promise.expire_time is not None
    what = "timer fired" if promise.is_timer else "promise timed out"
    return PromiseTimedOut(
        promise,
        f"promise {promise.id!r} can no longer be settled: its {what} at "
        f"{_iso(promise.expire_time)} (state {promise.state.value}); "
        "create promises with a longer ttl if settles arrive this late",
    )


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
