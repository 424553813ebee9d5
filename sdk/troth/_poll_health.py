"""What a worker says about its task stream: back after a loss (and how long it was
gone), and refused for good (a credential that will never work), which stops it.

Refused for good, the worker stops with one ERROR line saying what to do, rather
than retrying `UNAUTHENTICATED` forever:

- no credential at all (`CREDENTIALS_MISSING`): nothing will send one;
- a fixed token (`Client(token="...")`, `TROTH_TOKEN`) refused for any reason:
  unknown, wrong, malformed, expired or revoked, the same token is refused again;
- a token from a source that may give another (`Client(token=callable)`, a token
  file) refused as unknown, wrong or malformed before the worker ever connected:
  a mistake in its set-up, not a rotation.

A renewable source's token refused once the worker has run (expired, revoked) is
not: the source is asked again at once (`Transport.renewed`), and the worker keeps
trying, slowly, logging an ERROR each time, until it gives a token the server takes.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from troth.errors import Reason

if TYPE_CHECKING:
    import grpc

    from troth._transport import Transport
    from troth.errors import RpcError

__all__ = ["PollHealth", "refusal_line", "refused_for_good"]

_log = logging.getLogger("troth.worker")

_SET_UP_MISTAKES = frozenset(
    {Reason.CREDENTIALS_MISSING, Reason.CREDENTIALS_MALFORMED, Reason.TOKEN_UNKNOWN,
     Reason.TOKEN_INVALID}
)  # fmt: skip
"""Refusals of a credential that was never right (as opposed to one that expired)."""

_HOW = (
    "give the worker a token the server knows: `troth worker` takes --token-file PATH or "
    "TROTH_TOKEN_FILE (or TROTH_TOKEN); in Python, Client(token=...) or "
    "Client(token_file=...)"
)


def refused_for_good(error: RpcError, *, renewable: bool, connected: bool) -> bool:
    """Whether a refusal of the worker's stream (`error`, already past the token source's
    renewal) will be answered the same however long the worker retries."""
    if getattr(error.code, "name", None) != "UNAUTHENTICATED":
        return False
    if error.reason == Reason.CREDENTIALS_MISSING or not renewable:
        return True
    return not connected and error.reason in _SET_UP_MISTAKES


def refusal_line(worker_id: str, error: RpcError, token_label: str | None) -> str:
    """The one ERROR line of a worker that stops, refused for good."""
    if error.reason == Reason.CREDENTIALS_MISSING or token_label is None:
        why = "the server requires authentication and this worker sent no token"
    else:
        why = f"the server refused the token from {token_label} ({error.reason}: {error.message})"
    return f"worker {worker_id} stops: {why}; {_HOW}"


class PollHealth:
    """One worker's task stream over its life: taken, lost, taken again."""

    def __init__(self, worker_id: str, group: str) -> None:
        self._worker_id, self._group = worker_id, group
        self.connected = False
        """A stream of this worker was taken by a server once (its credential worked)."""
        self._lost_at: float | None = None

    def taken(self) -> None:
        """The server took the stream (its initial metadata, or a first task)."""
        self.connected = True
        if self._lost_at is None:
            return
        away = time.monotonic() - self._lost_at
        self._lost_at = None
        _log.info(
            "worker %s reconnected its task stream after %.1fs away",
            self._worker_id,
            away,
            extra={"worker_id": self._worker_id, "away_s": round(away, 1)},
        )

    def lost(self) -> None:
        """The stream ended (not by `stop()`): the next `taken` says it is back."""
        if self._lost_at is None:
            self._lost_at = time.monotonic()

    def refused_for_good(self, exc: grpc.RpcError, transport: Transport) -> RpcError | None:
        """The refusal `exc` ended the stream with, if it is for good (`refused_for_good`),
        logged as the worker's one ERROR line; None otherwise."""
        error = transport.error(exc)
        renewable = transport.token_renewable
        if not refused_for_good(error, renewable=renewable, connected=self.connected):
            return None
        _log.error(
            refusal_line(self._worker_id, error, transport.token_label),
            extra={"worker_id": self._worker_id, "group": self._group, "reason": error.reason},
        )
        return error
