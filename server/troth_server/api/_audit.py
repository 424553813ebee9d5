"""Audit lines: the one home of every log line that says who did, or was refused, what.

Three events, each logged once per call, at the api layer (the only place that
knows the caller's peer address) and never with a token, a secret or a payload:

- `auth.refused` (warning): a call refused by authentication or the RPC x role
  table (`api/_auth.py`): rpc, reason, principal (when it was authenticated),
  peer, message. Rate-limited, since anyone can cause one: at most
  `REFUSED_LINES` lines per `REFUSED_INTERVAL_S` per reason and subject (the
  principal; else the key id of a token-file token the file holds; else none),
  and the first line written after some were left out says how many
  (`suppressed`). Every refusal is counted, written or not, by the callback
  `count_auth_refusals` sets (`troth_auth_refusals_total{reason}`).
- `audit.refused` (warning): a settle refused by the promise's approver policy
  (`NOT_AN_APPROVER`, with the `rule`) or a settle token that does not allow it
  (`SETTLE_TOKEN_*`): rpc, promise_id, outcome asked for, principal (whom the
  settle acts for: the caller, or the principal of a verified settle token), via
  (`credential` or `settle_token`), settle_token (`<key id>:<token id>` of a
  verified one), caller (who made the call: `troth:settle-token` for a link with
  no other credential), reason, rule, peer, message. Other failures of a settle
  (not found, already settled, a bad value) are not refusals of a person and are
  left to the `rpc` line.
- `audit.settled` (info): a resolve, reject or cancel that changed the promise, or a
  `CompleteTask` that settled its workflow's root
  (`applied`; a repeat with the winner's idempotency key is not a settle):
  rpc, promise_id, outcome, principal (whom the settle acted for), settled_by (what
  is recorded on the promise: the principal, or `<principal> via settle-token
  <key>:<id>` when a settle token was its means), via (`credential` or
  `settle_token`), settle_token, caller, peer.

`promise.state_changed` (`service.py`) stays the state machine's log: every
change of every promise, including the ones nobody asked for (timeouts,
children cancelled with their root, a workflow's steps ended with it), without a
peer. It is not an audit line and this module does not repeat it.

The settle path is hot: each function is one log call and reads nothing but
the call's peer.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import structlog

from troth.errors import Reason

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable

    import grpc.aio

    from troth_server.auth import AuthError
    from troth_server.domain.access import Principal
    from troth_server.domain.errors import DomainError
    from troth_server.domain.promise import Promise, SettleRequest
    from troth_server.domain.settle_tokens import SettleToken

    AioContext: TypeAlias = grpc.aio.ServicerContext[Any, Any]

log = structlog.get_logger("troth.audit")

REFUSALS = frozenset(
    {
        Reason.NOT_AN_APPROVER,
        Reason.SETTLE_TOKEN_MALFORMED,
        Reason.SETTLE_TOKEN_OUTDATED,
        Reason.SETTLE_TOKEN_UNKNOWN_KEY,
        Reason.SETTLE_TOKEN_BAD_SIGNATURE,
        Reason.SETTLE_TOKEN_EXPIRED,
        Reason.SETTLE_TOKEN_WRONG_PROMISE,
        Reason.SETTLE_TOKEN_PROMISE_REPLACED,
        Reason.SETTLE_TOKEN_OUTCOME_NOT_ALLOWED,
        Reason.SETTLE_TOKEN_USED,
        Reason.SETTLE_TOKEN_VOID,
        Reason.SETTLE_TOKENS_OFF,
    }
)
"""The settle refusals that are audited: a person (or a link) not allowed to settle."""


REFUSED_LINES = 10
"""`auth.refused` lines written per `REFUSED_INTERVAL_S` per reason and subject."""
REFUSED_INTERVAL_S = 10.0
REFUSED_SUBJECTS = 1024
"""(reason, subject) pairs whose lines are counted; past it the one unseen longest is
forgotten (with the count of its lines left out, which the metric still has)."""


@dataclass(slots=True)
class _Window:
    start: float
    written: int = 1
    suppressed: int = 0


class LineLimit:
    """At most `lines` log lines per `interval_s` per key, counting the ones left out.

    `admit(key)` is None when the line is to be left out, else the number of lines
    of `key` left out since the last one written (to be written with it). Holds at
    most `max_keys` keys, forgetting the one unseen longest. Thread-safe.
    """

    def __init__(
        self,
        lines: int,
        interval_s: float,
        max_keys: int = REFUSED_SUBJECTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lines = lines
        self.interval_s = interval_s
        self.max_keys = max_keys
        self._clock = clock
        self._windows: OrderedDict[Hashable, _Window] = OrderedDict()
        self._lock = threading.Lock()

    def admit(self, key: Hashable) -> int | None:
        now = self._clock()
        with self._lock:
            window = self._windows.get(key)
            if window is None or now - window.start >= self.interval_s:
                suppressed = window.suppressed if window is not None else 0
                self._windows[key] = _Window(now)
                self._windows.move_to_end(key)
                while len(self._windows) > self.max_keys:
                    self._windows.popitem(last=False)
                return suppressed
            self._windows.move_to_end(key)
            if window.written < self.lines:
                window.written += 1
                suppressed, window.suppressed = window.suppressed, 0
                return suppressed
            window.suppressed += 1
            return None


_refused_lines = LineLimit(REFUSED_LINES, REFUSED_INTERVAL_S)
_count_refused: Callable[[str], None] | None = None


def count_auth_refusals(callback: Callable[[str], None] | None) -> None:
    """Report each `auth.refused` refusal (its reason), written or not, to `callback`
    (`Metrics.auth_refused`); None stops it. One per process (the server's)."""
    global _count_refused
    _count_refused = callback


def auth_refused(rpc: str, error: AuthError, principal: str | None, context: AioContext) -> None:
    """A call refused by authentication or authorization (`auth.refused`), rate-limited
    per reason and subject; counted always."""
    reason = error.reason.value
    if _count_refused is not None:
        _count_refused(reason)
    suppressed = _refused_lines.admit((reason, _subject(error, principal)))
    if suppressed is None:
        return
    extra = {"suppressed": suppressed} if suppressed else {}
    log.warning(
        "auth.refused",
        rpc=rpc,
        reason=reason,
        principal=principal,
        peer=context.peer(),
        message=error.message,
        **extra,
    )


def _subject(error: AuthError, principal: str | None) -> tuple[str, str] | None:
    """Whose refusals a line stands for: the principal; else the key id of a token the
    token file holds (a key id it does not hold is the caller's to invent, and counts
    with every other unknown one); else nobody in particular."""
    if principal is not None:
        return "principal", principal
    key_id = error.metadata.get("key_id")
    if key_id is None or error.reason is Reason.TOKEN_UNKNOWN:
        return None
    return "key_id", key_id


def settle_refused(
    rpc: str,
    request: SettleRequest,
    caller: Principal,
    by_token: bool,
    error: DomainError,
    context: AioContext,
) -> None:
    """A settle refused by approver policy or settle token (`audit.refused`); any other
    error is not logged here. `by_token`: the call carried a settle token, which
    `request` carries once verified."""
    if error.reason not in REFUSALS:
        return
    token = request.token
    log.warning(
        "audit.refused",
        rpc=rpc,
        promise_id=request.id,
        outcome=request.state.value,
        principal=caller.name if token is None else token.principal,
        via="settle_token" if by_token else "credential",
        settle_token=None if token is None else f"{token.key_id}:{token.token_id}",
        caller=caller.name,
        reason=error.reason.value,
        rule=error.metadata.get("rule"),
        peer=context.peer(),
        message=error.message,
    )


def settled(
    rpc: str,
    promise: Promise,
    caller: Principal,
    token: SettleToken | None,
    context: AioContext,
) -> None:
    """A settle that changed the promise (`audit.settled`), made with `token` or not."""
    log.info(
        "audit.settled",
        rpc=rpc,
        promise_id=promise.id,
        outcome=promise.state.value,
        principal=caller.name if token is None else token.principal,
        settled_by=promise.settled_by,
        via="credential" if token is None else "settle_token",
        settle_token=None if token is None else f"{token.key_id}:{token.token_id}",
        caller=caller.name,
        peer=context.peer(),
    )
