"""An in-memory model of the Promises API (DESIGN §4 rules 2-5, README "Semantics").

Pure: no I/O, no clock (times are parameters). The model test drives a live
server and checks every answer against this model. It is written from the
contract, not from the server's code:

- rule 2, create is idempotent by id: a repeat with the original create's key,
  or (neither carrying one) with identical param and tags, is answered with the
  existing promise and `created=false`; `strict` only while it is PENDING; any
  other create of the id is ALREADY_EXISTS. A promise settled early
  (`create_if_missing`) is adopted by its first create.
- rule 3, settle happens at most once: one settle applies; a repeat with the
  winner's key is answered `applied=false` (with `strict`, only for the same
  final state); any other is FAILED_PRECONDITION ALREADY_SETTLED, or TIMED_OUT
  once the promise expired.
- rule 4, timeouts are exact for readers: past its expire_time a promise is
  never PENDING (RESOLVED for a timer, else REJECTED_TIMEDOUT, settled at
  expire_time by `troth:timeout`).
- rule 5 (for promises outside workflows): the effective expire_time is in
  the reply: create_time + ttl, the given expire_time, 24 h by default, or
  none with `never_expires`.

The client cannot know the server's clock exactly, so whether a promise has
expired is decided for a window [t0 - margin, t1 + margin] around each call:
outside it the model knows; inside it both answers are accepted and the one
the server gave is recorded (a timeout, once seen, is final).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

PENDING = "PENDING"
RESOLVED = "RESOLVED"
REJECTED = "REJECTED"
CANCELED = "REJECTED_CANCELED"
TIMEDOUT = "REJECTED_TIMEDOUT"
TIMEOUT_PRINCIPAL = "troth:timeout"
TIMER_TAG = "troth:timer"
EARLY_TAG = "troth:early"
DEFAULT_TTL_MS = 86_400_000
MARGIN_MS = 250
"""How far the server's clock (and the moment it decided) may be from the client's."""

VERBS = {RESOLVED: "resolved", REJECTED: "rejected", CANCELED: "canceled", TIMEDOUT: "timed out"}


@dataclass
class Entry:
    """A promise as the model knows it."""

    id: str
    order: int
    """Creation order among the run's promises (search pages follow it)."""
    param: bytes
    tags: dict[str, str]
    ikey_create: str | None
    create_time: int
    expire_time: int | None
    state: str = PENDING
    value: bytes = b""
    ikey_settle: str | None = None
    settled_by: str = ""
    settle_time: int | None = None
    early: bool = False
    """Settled with `create_if_missing` before anyone created it; not adopted yet."""

    @property
    def timer(self) -> bool:
        return self.tags.get(TIMER_TAG) == "true"


def expired(entry: Entry) -> Entry:
    """The entry as its own expiry settles it."""
    return replace(
        entry,
        state=RESOLVED if entry.timer else TIMEDOUT,
        settle_time=entry.expire_time,
        settled_by=TIMEOUT_PRINCIPAL,
        ikey_settle=None,
        value=b"",
    )


def views(entry: Entry, t0: int, t1: int) -> list[Entry]:
    """What a reader between client times t0 and t1 may see: one view, or two when
    the promise's expire_time falls in the uncertain window."""
    if entry.state != PENDING or entry.expire_time is None:
        return [entry]
    if entry.expire_time > t1 + MARGIN_MS:
        return [entry]
    if entry.expire_time <= t0 - MARGIN_MS:
        return [expired(entry)]
    return [entry, expired(entry)]


@dataclass(frozen=True)
class Create:
    id: str
    param: bytes
    tags: dict[str, str]
    ikey: str | None
    strict: bool
    expiry: str
    """`default`, `ttl`, `at` (an absolute expire_time), `past` or `never`."""
    ms: int = 0
    """The ttl, or the absolute expire_time (ms since the epoch)."""


def create_outcome(view: Entry | None, request: Create) -> str:
    """CREATED, REPEAT, ADOPTED, ALREADY_EXISTS or INVALID_ARGUMENT (rule 2)."""
    if view is None:
        return "INVALID_ARGUMENT" if request.expiry == "past" else "CREATED"
    if view.early:
        return "ADOPTED"
    if request.ikey or view.ikey_create:
        if request.ikey != view.ikey_create:
            return "ALREADY_EXISTS"
    elif request.param != view.param or request.tags != view.tags:
        return "ALREADY_EXISTS"
    if request.strict and view.state != PENDING:
        return "ALREADY_EXISTS"
    return "REPEAT"


def expected_expire_time(request: Create, create_time: int) -> int | None:
    if request.expiry == "never":
        return None
    if request.expiry == "at":
        return request.ms
    ttl = request.ms if request.expiry == "ttl" else DEFAULT_TTL_MS
    return create_time + ttl


@dataclass(frozen=True)
class Settle:
    id: str
    state: str
    """RESOLVED, REJECTED or REJECTED_CANCELED."""
    value: bytes
    ikey: str | None
    strict: bool = False
    create_if_missing: bool = False
    principal: str = ""


def settle_outcome(view: Entry | None, request: Settle) -> str:
    """APPLIED, REPEAT, ALREADY_SETTLED, TIMED_OUT, NOT_FOUND or INVALID_ARGUMENT (rule 3)."""
    if view is None:
        if not request.create_if_missing:
            return "NOT_FOUND"
        return "INVALID_ARGUMENT" if request.state == CANCELED else "APPLIED"
    if view.state == PENDING:
        return "APPLIED"
    if (
        request.ikey
        and request.ikey == view.ikey_settle
        and (not request.strict or request.state == view.state)
    ):
        return "REPEAT"
    if view.settled_by == TIMEOUT_PRINCIPAL:
        return "TIMED_OUT"
    return "ALREADY_SETTLED"


def settled(view: Entry, request: Settle, settle_time: int) -> Entry:
    return replace(
        view,
        state=request.state,
        value=request.value,
        ikey_settle=request.ikey,
        settled_by=request.principal,
        settle_time=settle_time,
    )


def early(request: Settle, order: int, now: int) -> Entry:
    """A promise that a settle with `create_if_missing` made."""
    return Entry(
        id=request.id,
        order=order,
        param=b"",
        tags={EARLY_TAG: "true"},
        ikey_create=None,
        create_time=now,
        expire_time=None,
        state=request.state,
        value=request.value,
        ikey_settle=request.ikey,
        settled_by=request.principal,
        settle_time=now,
        early=True,
    )


def adopted(entry: Entry, request: Create) -> Entry:
    """A settled-early promise as its first create rewrites it (README, Semantics)."""
    return replace(
        entry, param=request.param, tags=dict(request.tags), ikey_create=request.ikey, early=False
    )


def glob_matches(glob: str, promise_id: str) -> bool:
    """An id glob: only `*` is special (any run of characters)."""
    pattern = ".*".join(re.escape(part) for part in (glob or "*").split("*"))
    return re.fullmatch(pattern, promise_id, flags=re.DOTALL) is not None


@dataclass(frozen=True)
class Query:
    glob: str
    states: frozenset[str] = frozenset()
    tags: dict[str, str] = field(default_factory=dict)
    newest_first: bool = False

    def selects(self, view: Entry) -> bool:
        return (
            glob_matches(self.glob, view.id)
            and (not self.states or view.state in self.states)
            and all(view.tags.get(k) == v for k, v in self.tags.items())
        )


def differences(view: Entry, got: dict[str, object]) -> list[str]:
    """How a promise the server returned (as a dict of its fields) differs from `view`."""
    want: dict[str, object] = {
        "id": view.id,
        "state": view.state,
        "param": view.param,
        "value": view.value,
        "tags": view.tags,
        "idempotency_key_for_create": view.ikey_create or "",
        "idempotency_key_for_settle": view.ikey_settle or "",
        "settled_by": view.settled_by,
        "create_time": view.create_time,
        "expire_time": view.expire_time,
    }
    found = [f"{k}: server {got.get(k)!r}, model {v!r}" for k, v in want.items() if got.get(k) != v]
    settle_time = got.get("settle_time")
    if view.state == PENDING and settle_time is not None:
        found.append(f"settle_time {settle_time} on a PENDING promise")
    if view.state != PENDING and view.settle_time is not None and settle_time != view.settle_time:
        found.append(f"settle_time: server {settle_time!r}, model {view.settle_time!r}")
    return found
