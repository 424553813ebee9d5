"""`Handle`: a workflow execution (its root promise), found by id."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from troth._promise import PromiseState
from troth.errors import AlreadySettledError, Cancelled, PromiseRejectedError, timed_out

if TYPE_CHECKING:
    from troth._promise import Promise
    from troth.client import Client

__all__ = ["Handle", "outcome"]


class Handle:
    """A workflow execution (its root promise), found by id.

    Made by `Client.start` or `Client.handle`; cheap, and makes no call until used.

    Attributes:
        id: The workflow's id (its root promise's id).
        created: True when the `Client.start` that made this handle started the
            run; False when the run existed already (the start was a repeat) and
            for a handle found by id (`Client.handle`).

    .. versionadded:: 0.1.0
    .. versionchanged:: 0.2.0 `created`.
    """

    __slots__ = ("_client", "created", "id")

    def __init__(self, client: Client, id: str, *, created: bool = False) -> None:
        self._client = client
        self.id = id
        self.created = created

    def __repr__(self) -> str:
        return f"Handle({self.id!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Handle) and other.id == self.id and other._client is self._client

    def __hash__(self) -> int:
        return hash(self.id)

    def get(self) -> Promise:
        """The root promise as it is now (pending while the workflow runs).

        Raises:
            NotFoundError: No workflow (promise) has this id.
        """
        return self._client.get(self.id)

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the workflow to finish and return its decoded return value.

        Args:
            timeout: Seconds to wait; None waits as long as it takes.

        Raises:
            PromiseRejectedError: The workflow raised; `.value` is the decoded
                error (`{"type": ..., "message": ...}` for an exception).
            Cancelled: The workflow was cancelled (a `BaseException`: `except
                Exception` does not catch it; name it).
            PromiseTimedOutError: The workflow ran out of time (its ttl).
            DeadlineExceededError: It had not finished within `timeout` (also a `TimeoutError`).
            NotFoundError: No workflow (promise) has this id.
        """
        return outcome(self._client, self._client.wait(self.id, timeout=timeout))

    def cancel(self, value: Any = None) -> bool:
        """Cancel the workflow: it sees `Cancelled` at its next yield; pending steps are cancelled.

        Returns:
            True if this call cancelled it; False if it had already been cancelled.

        Raises:
            AlreadySettledError: It had already finished (the message says how).
            NotFoundError: No workflow (promise) has this id.
        """
        try:
            return self._client.cancel(self.id, value).applied
        except AlreadySettledError:
            if self._client.get(self.id).state is PromiseState.REJECTED_CANCELED:
                return False
            raise


def outcome(client: Client, promise: Promise) -> Any:
    """A settled root promise's value, or the matching error raised (`Handle.result`,
    `Client.execute`)."""
    state = promise.state
    if state is PromiseState.RESOLVED:
        return client.decode(promise.value)
    if state is PromiseState.REJECTED:
        try:
            value = client.decode(promise.value)
        except Exception:  # a value this codec cannot read: hand over the bytes
            value = promise.value.data
        raise PromiseRejectedError(promise.id, value)
    if state is PromiseState.REJECTED_CANCELED:
        raise Cancelled(promise.id)
    raise timed_out(
        promise.id,
        f"workflow {promise.id!r} timed out before it finished; start it with a longer ttl",
    )
