"""Errors the domain raises when a request cannot be applied.

Each carries a stable `reason` (from `troth.errors.Reason`) and a message that
says what was wrong and what to do. `api/_status.py` is the only place that
maps them to gRPC status codes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from troth.errors import Reason

if TYPE_CHECKING:
    from troth_server.domain.promise import Promise


class DomainError(Exception):
    """A request that the current state does not allow."""

    reason: Reason = Reason.INTERNAL

    def __init__(self, message: str, **metadata: str) -> None:
        super().__init__(message)
        self.message = message
        self.metadata = metadata


class InvalidArgument(DomainError):
    """A request field is malformed or out of bounds; `field` names it."""

    reason = Reason.INVALID_ARGUMENT

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}", field=field)
        self.field = field
        self.detail = message
        """What is wrong with the field, without its name."""

    def within(self, path: str) -> InvalidArgument:
        """The same mistake in a message nested at `path` (`record_step.tags[x]`)."""
        return InvalidArgument(f"{path}.{self.field}", self.detail)


class ValueNotChecked(DomainError):
    """A resolve reached the writer without its value checked against the schema the
    writer sees (the promise was created, with a schema, after the check read it).

    The service answers it by checking the value against `schema`, off the
    writer, and sending the settle again; it never reaches a client.
    """

    def __init__(self, promise_id: str, schema: str) -> None:
        super().__init__(
            f"promise {promise_id!r}: the resolve value was not checked against the "
            "promise's schema before the write; this is a server bug, please report it",
            promise_id=promise_id,
        )
        self.schema = schema


class InvalidPageToken(InvalidArgument):
    reason = Reason.INVALID_PAGE_TOKEN

    def __init__(self, message: str) -> None:
        super().__init__("page_token", message)


class PromiseNotFound(DomainError):
    reason = Reason.NOT_FOUND

    def __init__(self, promise_id: str, message: str | None = None) -> None:
        super().__init__(
            message or f"promise {promise_id!r} does not exist; create it first or check the id",
            promise_id=promise_id,
        )
        self.promise_id = promise_id


class SettleTargetNotFound(PromiseNotFound):
    """A resolve or reject of an id no promise has: it may be a settle that came before
    the wait was created, which `create_if_missing` is for."""

    def __init__(self, promise_id: str) -> None:
        super().__init__(
            promise_id,
            f"promise {promise_id!r} does not exist; check the id, or, to settle it before "
            "it is created, send create_if_missing (Client.resolve/reject(..., "
            "create_if_missing=True), `troth promises resolve/reject ID --create-if-missing`): "
            "the first create of that id then finds it settled",
        )


class NotAWorkflow(DomainError):
    """A workflow operation (FailWorkflow) on a promise that is not a workflow's root."""

    reason = Reason.NOT_A_WORKFLOW

    def __init__(self, promise_id: str) -> None:
        super().__init__(
            f"promise {promise_id!r} is not a workflow (it has no troth:invoke tag); "
            "name a workflow's root, as client.start created it, or reject the promise "
            "with `troth promises reject`",
            promise_id=promise_id,
        )
        self.promise_id = promise_id


class PromiseAlreadyExists(DomainError):
    reason = Reason.ALREADY_EXISTS

    def __init__(self, promise_id: str, why: str) -> None:
        super().__init__(f"promise {promise_id!r} already exists: {why}", promise_id=promise_id)
        self.promise_id = promise_id


class PromiseAlreadySettled(DomainError):
    """A settle lost: the promise was settled before, by someone else."""

    reason = Reason.ALREADY_SETTLED

    def __init__(self, promise: Promise, message: str) -> None:
        super().__init__(message, promise_id=promise.id, state=promise.state.value)
        self.promise = promise


class PromiseTimedOut(DomainError):
    """A settle came after the promise's expire_time."""

    reason = Reason.TIMED_OUT

    def __init__(self, promise: Promise, message: str) -> None:
        super().__init__(message, promise_id=promise.id, state=promise.state.value)
        self.promise = promise


class Overloaded(DomainError):
    """The server is at one of its capacity limits: refused for now, retry later.

    `limit` names the flag that sets it (`max-concurrent-rpcs`, `max-streams`,
    `max-queued-writes`, `max-queue-delay`); `retry_after_ms` is the delay the answer's
    RetryInfo asks for.
    """

    reason = Reason.OVERLOADED
    retry_after_ms: int = 100

    def __init__(self, limit: str, value: int | str, what: str, retry_after_ms: int) -> None:
        super().__init__(
            f"the server is overloaded: {what} (--{limit}={value}); nothing was done, "
            f"retry after {retry_after_ms} ms with backoff (the troth SDK does), or raise "
            f"--{limit} if the machine has room",
            limit=limit,
        )
        self.limit = limit
        self.retry_after_ms = retry_after_ms
