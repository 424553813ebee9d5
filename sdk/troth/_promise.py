"""The SDK's records of a durable promise and of the answers to calls about one.

These are what `Client` returns; `troth._convert` builds them from the wire
types in `troth.v1`, which stay an implementation detail.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from troth._approvers import Approvers
    from troth.codec import Payload


class PromiseState(enum.StrEnum):
    """The state of a durable promise. Values match the proto enum names.

    `PENDING` moves to exactly one of the other states, and never again.

    .. versionadded:: 0.1.0
    """

    PENDING = "PENDING"
    RESOLVED = "RESOLVED"
    REJECTED = "REJECTED"
    REJECTED_CANCELED = "REJECTED_CANCELED"
    REJECTED_TIMEDOUT = "REJECTED_TIMEDOUT"


@dataclass(frozen=True, slots=True)
class Promise:
    """A durable promise as the server returned it.

    Attributes:
        id: The caller-chosen id.
        state: Where it is in its life.
        param: The payload given at creation (decode it with `Client.decode`).
        value: The payload given at settlement; empty while pending.
        tags: String labels given at creation.
        create_time: When it was created (UTC).
        settle_time: When it was settled (UTC); None while pending.
        expire_time: When it times out (UTC); None only if it never expires.
        idempotency_key_for_create: The key its create carried, or "".
        idempotency_key_for_settle: The key its winning settle carried, or "".
        settled_by: The principal that settled it ("troth:timeout" for expiry), or "".
        schema: The JSON Schema (a dict) its resolve value must satisfy, or None.
        title: For the human who settles it, or "".
        message: For the human who settles it, or "".
        requested_by: Who asked for it: a workflow, or the creator's principal; or "".
        workflow_version: A workflow root's code version, once a worker took it; or "".
        root_id: A workflow's step: the top-level workflow root it belongs to, as the
            server recorded it; "" for roots and standalone promises.
        parent_id: A workflow's step: the workflow whose task created it; or "".
        approvers: Who may settle it (`Approvers`), or None for anyone.
        started_by: The authenticated principal that created it (on a workflow's
            step: that started the workflow); or "".

    .. versionadded:: 0.1.0
    """

    id: str
    state: PromiseState
    param: Payload
    value: Payload
    tags: Mapping[str, str]
    create_time: datetime
    settle_time: datetime | None = None
    expire_time: datetime | None = None
    idempotency_key_for_create: str = ""
    idempotency_key_for_settle: str = ""
    settled_by: str = ""
    schema: Mapping[str, Any] | None = None
    title: str = ""
    message: str = ""
    requested_by: str = ""
    workflow_version: str = ""
    root_id: str = ""
    parent_id: str = ""
    approvers: Approvers | None = None
    started_by: str = ""

    @property
    def is_settled(self) -> bool:
        """True once the promise has left `PENDING`; it will never change again."""
        return self.state is not PromiseState.PENDING


@dataclass(frozen=True, slots=True)
class CreateResult:
    """The answer to `Client.create`.

    Attributes:
        promise: The promise, with the effective `expire_time` the server chose.
        created: False when the promise already existed and the create was a
            repeat of the original (same idempotency key, or neither had a key
            and param and tags were identical).

    .. versionadded:: 0.1.0
    """

    promise: Promise
    created: bool


@dataclass(frozen=True, slots=True)
class SettleResult:
    """The answer to `Client.resolve`, `reject` and `cancel`.

    Attributes:
        promise: The promise as settled.
        applied: True if this call's settlement is the one that counted.
        workflow_waiting: For a decision on a workflow's step: when it was recorded
            but the workflow cannot resume now because no worker connected to the
            server runs the version of its code it recorded, that in words
            ("waiting for a worker of group ... version ... (none connected since
            ...)"); None otherwise. An operator runs the old code again, or moves
            the workflow (`troth workflows move`).

    .. versionadded:: 0.1.0
    """

    promise: Promise
    applied: bool
    workflow_waiting: str | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """A settled promise as a workflow reads it with `decisions=True`: its value and
    who decided (`yield ctx.decision(approval)`, `ctx.at_least(..., decisions=True)`).

    Read from the recorded promise, so every replay sees the same decision.

    Attributes:
        promise_id: The promise that was settled.
        value: Its decoded value (an instance of its schema's class, if it has one).
        settled_by: The authenticated principal that settled it (`<principal>
            via settle-token <key id>:<token id>` for a settle token, which acts for
            that principal); "" if none was recorded (authentication off and no
            `troth-principal`).
        settle_time: When it was settled (UTC).

    .. versionadded:: 0.2.0
    """

    promise_id: str
    value: Any
    settled_by: str = ""
    settle_time: datetime | None = None


class PromiseOrder(enum.StrEnum):
    """The order of `Client.search` results. Values match the proto enum names.

    .. versionadded:: 0.2.0
    """

    CREATED_ASC = "CREATED_ASC"
    """Oldest first (the default)."""
    CREATED_DESC = "CREATED_DESC"
    """Newest first."""
    EXPIRE_TIME_ASC = "EXPIRE_TIME_ASC"
    """Soonest deadline first; promises that never expire come last."""


class PromiseEventType(enum.StrEnum):
    """What happened to a promise, in a `Client.watch_promises` event.

    .. versionadded:: 0.2.0
    """

    CREATED = "CREATED"
    SETTLED = "SETTLED"
    """Resolved, rejected or cancelled by someone (`promise.settled_by` says who)."""
    TIMED_OUT = "TIMED_OUT"
    """Reached its `expire_time`: `REJECTED_TIMEDOUT` (or `RESOLVED`, for a timer)."""


@dataclass(frozen=True, slots=True)
class PromiseEvent:
    """One event of `Client.watch_promises`.

    Attributes:
        type: What happened.
        promise: The promise as the server saw it when it sent the event (for
            a change made through another replica, possibly already later:
            a CREATED event may show it settled, with its SETTLED event next).

    .. versionadded:: 0.2.0
    """

    type: PromiseEventType
    promise: Promise


@dataclass(frozen=True, slots=True)
class SearchPage:
    """One page of `Client.search` results.

    Attributes:
        promises: The matching promises, in the order asked for.
        next_page_token: Pass to `search(page_token=...)` for the next page;
            None when there are no more.

    .. versionadded:: 0.1.0
    """

    promises: tuple[Promise, ...] = field(default_factory=tuple)
    next_page_token: str | None = None


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a client is to the server (`Client.whoami`): the principal its credential
    stands for, as the server authenticated it.

    Attributes:
        name: The principal's name (what `settled_by` records).
        roles: `worker`, `gateway`, `operator`, `admin`.
        groups: The task groups a worker may poll (`*`: all).
        prefixes: The id prefixes it may see and touch; empty: every id.
        permissions: The permission names `Approvers(permissions=...)` may list.
        authenticated: False only on a server without authentication (the local
            developer, named by the client's `principal`).

    .. versionadded:: 0.2.0
    """

    name: str
    roles: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()
    permissions: tuple[str, ...] = ()
    authenticated: bool = True
