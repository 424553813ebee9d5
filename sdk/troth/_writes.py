"""What `Client` writes: promises created and settled (resolved, rejected, cancelled)
by id, and the settle tokens that let the bearer of a link settle one.

`PromiseWrites` is a base of `Client` (its methods are `Client`'s), as
`troth._reads.PromiseReads` is: the half of the promise calls that change a promise.
Each is safe to retry by its idempotency key (the `troth.client` module docstring
says how a create and a settle are each made so). The calls go through
`troth._calls.Connection`, which the worker's runner shares; a settle is a span of
its own (`troth._tracing`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from troth import _arguments as check
from troth._schema import decision_schema
from troth._tracing import client_span
from troth.v1 import promises_pb2

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from datetime import datetime, timedelta

    from troth._approvers import Approvers
    from troth._calls import Connection, SettleRequest
    from troth._promise import CreateResult, SettleResult
    from troth.codec import Payload

__all__ = ["PromiseWrites"]

_SPANS: dict[type[SettleRequest], str] = {
    promises_pb2.ResolvePromiseRequest: "troth.resolve",
    promises_pb2.RejectPromiseRequest: "troth.reject",
    promises_pb2.CancelPromiseRequest: "troth.cancel",
}
"""The span of each settle (`troth._tracing`)."""


class PromiseWrites:
    """`Client`'s creates and settles of promises (a base class of `Client`)."""

    _connection: Connection

    def encode(self, value: Any) -> Payload:
        raise NotImplementedError

    def create(
        self,
        id: str,
        param: Any = None,
        *,
        tags: Mapping[str, str] | None = None,
        ttl: timedelta | None = None,
        expire_time: datetime | None = None,
        never_expires: bool = False,
        idempotency_key: str | None = None,
        strict: bool = False,
        schema: Mapping[str, Any] | type | None = None,
        title: str = "",
        message: str = "",
        requested_by: str = "",
        approvers: Approvers | None = None,
    ) -> CreateResult:
        """Create a pending promise, or get the existing one if this is a repeat.

        A create of an existing id is a repeat (answered with `created=False`)
        when it carries the original create's idempotency key, or when neither
        carries one and param and tags are identical; any other is refused.

        Args:
            id: The promise id you choose, e.g. "approval-7".
            param: Any value the codec can encode; None sends no param.
            tags: String labels, searchable with `search(tags=...)`.
            ttl: Time until the promise times out. At most one of `ttl`,
                `expire_time` and `never_expires`; none means the server's default.
            expire_time: Aware datetime at which the promise times out.
            never_expires: Keep it pending until someone settles it.
            idempotency_key: Makes repeats of this create recognisable as such.
            strict: Answer a repeat with the existing promise only while it is pending.
            schema: What a resolve value must look like: a JSON Schema dict, a
                dataclass or a pydantic model class; the server refuses values
                that do not match, naming the field.
            title: A short line for the human who settles it.
            message: The longer text for that human.
            requested_by: Who asks; default the caller's principal.
            approvers: Who may resolve or reject it (`Approvers`), enforced by the server.

        Returns:
            The promise, with the effective `expire_time`, and whether this call created it.

        Raises:
            AlreadyExistsError: The id exists and this create is not a repeat.
            InvalidArgumentError: Bad id, ttl or payload (see `.field`).
            ValueError: More than one of ttl, expire_time, never_expires; naive datetime.
        """
        call = "Client.create"
        check.promise_id(call, id)
        tags = check.tags(call, tags)
        ttl = check.duration(call, ttl, "ttl")
        expire_time = check.moment(call, expire_time, "expire_time")
        check.flags(call, never_expires=never_expires, strict=strict)
        check.texts(call, title=title, message=message, requested_by=requested_by)
        check.texts(call, optional=True, idempotency_key=idempotency_key)
        check.approvers(call, approvers)
        check.at_most_one_expiry(f"create({id!r})", ttl, expire_time, never_expires)
        return self._connection.create(
            self._connection.create_request(
                id,
                self.encode(param),
                tags=tags,
                ttl=ttl,
                expire_time=expire_time,
                never_expires=never_expires,
                idempotency_key=idempotency_key,
                strict=strict,
                schema=None if schema is None else decision_schema(schema).json_schema,
                title=title,
                message=message,
                requested_by=requested_by,
                approvers=approvers,
            )
        )

    def resolve(
        self,
        id: str,
        value: Any = None,
        *,
        idempotency_key: str | None = None,
        strict: bool = False,
        create_if_missing: bool = False,
        settle_token: str | None = None,
    ) -> SettleResult:
        """Settle a pending promise as `RESOLVED` with `value`.

        Args:
            id: The promise id.
            value: Any value the codec can encode (dataclasses and pydantic
                models too); None sends no value.
            idempotency_key: Identifies this settle so that repeats of it
                succeed with `applied=False`; a random one is used if None.
            strict: A repeat succeeds only if it asks for the state the promise
                was settled in.
            create_if_missing: Settle before the wait exists: if no promise has
                this id yet, create it settled; the workflow's later
                `ctx.promise(id=...)` finds it so and goes on at once. Without
                it an unknown id is `NotFoundError`. A schema the workflow gives
                later is not checked by the server against an early value; the
                workflow's typed decode still is.
            settle_token: A token from `mint_settle_token` (e.g. from a link): the
                permission to settle this one promise, once; no other is needed.

        Returns:
            The settled promise, and whether this call's settlement counted; for
            a workflow's step whose workflow cannot resume now because no worker
            connected to the server runs its recorded version, `workflow_waiting`
            says so (the decision is recorded all the same).

        Raises:
            AlreadySettledError: Someone else settled it first (the message says how).
            PromiseTimedOutError: It expired before this settle arrived.
            NotFoundError: No promise has this id.
        """
        return self._settle(
            promises_pb2.ResolvePromiseRequest,
            id,
            value,
            idempotency_key,
            strict,
            create_if_missing=create_if_missing,
            settle_token=settle_token,
        )

    def reject(
        self,
        id: str,
        value: Any = None,
        *,
        idempotency_key: str | None = None,
        strict: bool = False,
        create_if_missing: bool = False,
        settle_token: str | None = None,
    ) -> SettleResult:
        """Settle a pending promise as `REJECTED` with `value` (e.g. an error description).

        Arguments, result and errors are those of `resolve`.
        """
        return self._settle(
            promises_pb2.RejectPromiseRequest,
            id,
            value,
            idempotency_key,
            strict,
            create_if_missing=create_if_missing,
            settle_token=settle_token,
        )

    def mint_settle_token(
        self,
        id: str,
        *,
        outcomes: Iterable[str] = (),
        ttl: timedelta | None = None,
        acts_for: str | None = None,
    ) -> str:
        """A settle token for the pending promise `id`, to put in a link: it lets its
        bearer resolve or reject that promise (`outcomes`: "resolve", "reject";
        default both), until `ttl` (default: the promise's expiry), once.

        The token acts for a principal: the settle made with it is that principal's,
        checked against the promise's approver policy (four-eyes and distinct quorums
        count the principal) and recorded as `settled_by` "<principal> via
        settle-token <key>:<id>". By default it acts for this client's principal,
        and is minted only if the policy lets that principal settle the promise now.
        `acts_for` names another one, e.g. the approver a link is mailed to: that
        needs the gateway role (`admin` does not imply it), and a policy that lists
        the name among its principals (the server cannot know its roles). Refusals:
        `PermissionDeniedError` with reason `NOT_AN_APPROVER` or `ROLE_NOT_ALLOWED`.
        """
        call = "Client.mint_settle_token"
        ttl = check.duration(call, ttl, "ttl")
        check.texts(call, optional=True, acts_for=acts_for)
        return self._connection.mint_settle_token(
            check.promise_id(call, id), outcomes=outcomes, ttl=ttl, acts_for=acts_for
        )

    def cancel(
        self,
        id: str,
        value: Any = None,
        *,
        idempotency_key: str | None = None,
        strict: bool = False,
    ) -> SettleResult:
        """Settle a pending promise as `REJECTED_CANCELED`.

        Cancelling a workflow's root promise also cancels its pending steps.
        Arguments, result and errors are those of `resolve`.
        """
        return self._settle(
            promises_pb2.CancelPromiseRequest,
            id,
            value,
            idempotency_key,
            strict,
        )

    def _settle(
        self,
        kind: type[SettleRequest],
        id: str,
        value: Any,
        idempotency_key: str | None,
        strict: bool,
        *,
        create_if_missing: bool = False,
        settle_token: str | None = None,
    ) -> SettleResult:
        call = f"Client.{kind.__name__.removesuffix('PromiseRequest').lower()}"
        check.promise_id(call, id)
        check.texts(call, optional=True, idempotency_key=idempotency_key, settle_token=settle_token)
        check.flags(call, strict=strict, create_if_missing=create_if_missing)
        with client_span(_SPANS[kind], **{"troth.promise.id": id}):
            return self._connection.settle(
                kind,
                id,
                self.encode(value),
                idempotency_key=idempotency_key,
                strict=strict,
                create_if_missing=create_if_missing,
                settle_token=settle_token,
            )
