"""`Client`: create, read, search, settle and watch durable promises by id (the creates
and settles are its base `troth._writes.PromiseWrites`; the reads, searches and
watches its base `troth._reads.PromiseReads`), and start workflows.

The gateway-facing half of the SDK. The client owns deadlines, idempotency
keys and retries; `troth._transport` owns the channel and turns gRPC errors
into `troth.errors`; `troth._convert` turns wire messages into `Promise`.

Idempotency and retries: every call is retried after `UNAVAILABLE` (and a
server-side `DEADLINE_EXCEEDED`) and after an overload refusal
(`RESOURCE_EXHAUSTED`, reason `OVERLOADED`, waiting at least the server's
`RetryInfo` delay) within its timeout (`troth._backoff` has the policy). An
overload refusal did nothing, so its retry is safe for any call; the others
are safe because every call is idempotent:

- reads and watches change nothing;
- a settle without an `idempotency_key` gets a fresh random one (uuid4 hex),
  so a retry of a settle whose reply was lost is recognised by the server as
  the same settle (`applied=False`) and by the client as the winner, so it
  reports `applied=True`; pass your own key to make repeats from *other*
  processes (a double click reaching two gateways) idempotent too;
- a create without an `idempotency_key` is sent without one on purpose: the
  server answers a repeat with identical param and tags with the existing
  promise, which already makes the retry safe, and a random key would turn
  two independent, identical creates of the same id (the usual "start it
  once" dedupe) into `ALREADY_EXISTS`.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from troth import _arguments as check
from troth._calls import Connection
from troth._credentials import TlsConfig, resolve_tls, token_source
from troth._events import WAIT_CALL_S, WATCH_READY_METADATA, PromiseEventStream, not_settled
from troth._handle import Handle, outcome
from troth._operators import OperatorCalls
from troth._reads import PromiseReads
from troth._schedules import Schedules
from troth._states import StateCalls
from troth._tags import TAG_FUNC, TAG_INVOKE
from troth._tracing import TRACEPARENT_TAG, client_span
from troth._transport import Transport
from troth._writes import PromiseWrites
from troth.codec import Codec, JsonCodec, Payload
from troth.errors import (
    ConfigurationError,
)

if TYPE_CHECKING:
    from troth._promise import Promise

__all__ = [
    "DEFAULT_ADDRESS",
    "WATCH_READY_METADATA",
    "Client",
    "Handle",
    "PromiseEventStream",
    "TlsConfig",
]


DEFAULT_ADDRESS = "127.0.0.1:7070"
"""Where `troth serve` listens by default."""


class Client(PromiseReads, PromiseWrites, OperatorCalls, StateCalls):
    """A connection to a troth server's `PromiseService` (and, for operators, the
    reads of its `TaskService`: `search_tasks`, `list_workers`, `search_workflows`,
    and `retry_workflow_now`).

    Thread-safe; create one per process and share it. Use it as a context
    manager, or call `close()`, to release the channel.

    Args:
        address: `host:port` of the server; or of several replicas of one
            server (sharing one database), as a list or one comma-separated
            string, e.g. "10.0.0.1:7070,10.0.0.2:7070". The client uses the
            first that answers and, when that one stops answering, moves to
            another by itself; calls cut off by the failover are retried
            there (every call is idempotent; see the module docstring).
            Host names in a list are resolved once, here.
        codec: Encodes params and values; default `JsonCodec`.
        timeout: Seconds each call may take, retries included (not `watch`/`wait`,
            which take their own).
        principal: Who is calling, sent as `troth-principal` gRPC metadata;
            the server records it as `settled_by`.
        tls: Connect over TLS: `True` trusts the system's root certificates,
            a `TlsConfig` names a CA file and, for mTLS, this client's
            certificate and key; `False` is plaintext. The default (None)
            reads `TROTH_TLS_CA`, `TROTH_TLS_CERT`, `TROTH_TLS_KEY` (and
            `TROTH_TLS=true` for the system's roots), and is plaintext when
            none is set.
        token: A bearer token, sent as `authorization: Bearer <token>` on
            every call, streams included (a `Worker` on this client sends it
            on its Poll stream and heartbeats too); or a callable taking no
            argument that returns the token to send now, for a token that is
            renewed (a JWT before its `exp`): it is called here, then again at
            most about once a second, from whichever thread makes a call (make
            it quick and thread-safe: return a cached token and renew it ahead
            of time), and at once when the server refuses the token sent. Each
            call, and each stream as it opens, sends its current token; a call
            or stream the server refuses (`UNAUTHENTICATED`; a stream ended
            with it or with `PERMISSION_DENIED`) is made again, once, with a
            new one if the callable now gives another. A callable that raises
            or returns an unusable token later keeps the last good one (and
            logs a warning). Default: `token_file`'s, else `TROTH_TOKEN`.
            A token never appears in a repr, a log line or an error message.
        token_file: A file holding the bearer token (surrounding whitespace
            stripped), read here and again when it changes (its size,
            modification time or inode, looked at most about once a second), and
            at once when the server refuses the token sent: renew the token by
            replacing the file (written whole, then renamed into place, as a
            Kubernetes secret volume does). Gone or empty later, the last good
            token is kept and a warning logged. Not with `token`. Default
            `TROTH_TOKEN_FILE`, when `token` is not given either.
        allow_plaintext_token: A token is refused (ConfigurationError) over
            plaintext to an address that is not loopback, where anyone on the
            path could read it; say True only when something else encrypts
            the path (a service mesh sidecar, a tunnel).
        multiplex_calls: Send the unary calls (creates, reads, settles) as
            messages on one `TaskService.Calls` stream, opened at the first call:
            for a client shared by many threads, a fraction of a unary call's
            cost on both sides. False makes each call its own RPC, as suits a
            process that makes a call or two and exits (the `troth` CLI). A
            server that refuses the stream gets unary calls either way.

    Raises:
        ConfigurationError: An argument is unusable (the message names a bad
            address, an unreadable TLS file, a token sent in plaintext, both
            `token` and `token_file`, a token file missing or empty, or a token
            callable that raised or gave no usable token).

    Example:
        >>> with Client("127.0.0.1:7070") as client:  # doctest: +SKIP
        ...     client.create("approval-7", {"post": 7}, ttl=timedelta(days=3))
        ...     client.resolve("approval-7", {"approved": True})

    .. versionadded:: 0.1.0

    .. versionchanged:: 0.2.0
       `token` may be a callable, and `token_file` (`TROTH_TOKEN_FILE`) names a
       file that is re-read: a long-lived client renews its token.
    """

    def __init__(
        self,
        address: str | Sequence[str] = DEFAULT_ADDRESS,
        *,
        codec: Codec | None = None,
        timeout: float = 10.0,
        principal: str | None = None,
        tls: bool | TlsConfig | None = None,
        token: str | Callable[[], str] | None = None,
        token_file: str | os.PathLike[str] | None = None,
        allow_plaintext_token: bool = False,
        multiplex_calls: bool = True,
    ) -> None:
        if not isinstance(multiplex_calls, bool):
            raise ConfigurationError(f"multiplex_calls={multiplex_calls!r} must be True or False")
        if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
            raise ConfigurationError(
                f"timeout={timeout!r} must be a positive number of seconds, e.g. 10.0"
            )
        if codec is not None and not isinstance(codec, Codec):
            raise ConfigurationError(
                f"codec {codec!r} has no encode(value) -> Payload and decode(payload) "
                "methods; pass a troth.Codec such as troth.JsonCodec()"
            )
        self._codec: Codec = codec if codec is not None else JsonCodec()
        self._timeout = float(timeout)
        self._principal = principal
        transport = Transport(
            address,
            principal=principal,
            tls=resolve_tls(tls),
            token=token_source(token, token_file),
            allow_plaintext_token=allow_plaintext_token,
        )
        # Its unary calls as messages on one `Calls` stream (`troth._mux`), by default.
        self._transport = transport.multiplexed() if multiplex_calls else transport
        self._connection = Connection(self._transport, self._timeout)

    @property
    def schedules(self) -> Schedules:
        """The schedule calls (an operator's or admin's): `create`, `get`, `list`,
        `pause`, `resume`, `delete` (docs/schedules.md).

        .. versionadded:: 0.3.0
        """
        return Schedules(self._connection, self._codec)

    def __repr__(self) -> str:
        return f"Client({self.address!r})"

    @property
    def address(self) -> str:
        """The server address this client talks to; several are comma-separated."""
        return self._transport.address

    @property
    def codec(self) -> Codec:
        """The codec used for params and values."""
        return self._codec

    @property
    def tls(self) -> TlsConfig | None:
        """The TLS settings this client connects with, or None for plaintext."""
        return self._transport.tls

    @property
    def principal(self) -> str | None:
        """The principal sent with every call, if any."""
        return self._principal

    def close(self) -> None:
        """Release the channel. Calls still in flight fail. Safe to call twice."""
        self._transport.close_calls()
        self._transport.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def encode(self, value: Any) -> Payload:
        """Encode a value as this client sends it: `None` is the empty payload."""
        return Payload() if value is None else self._codec.encode(value)

    def decode(self, payload: Payload) -> Any:
        """Decode a promise's `param` or `value` with this client's codec.

        The empty payload (a promise created or settled with no value) is `None`.
        """
        return None if payload.is_empty else self._codec.decode(payload)

    def start(
        self,
        workflow: str | Callable[..., Any],
        *args: Any,
        id: str,
        group: str = "workers",
        ttl: timedelta | None = None,
        idempotency_key: str | None = None,
    ) -> Handle:
        """Start a workflow by id, once: a repeat of the start returns the existing run.

        Creates the workflow's root promise, tagged for `group`, with the
        arguments (encoded with the codec, as a list) as its param; the server
        hands it to a worker of the group. A workflow's id is its identity:
        a later start of the same id (from any process) with the same
        workflow, group and arguments is answered with the existing run
        (`handle.created` is False), which never runs twice; one that names
        another workflow, group or other arguments is refused
        (`AlreadyExistsError`, reason `WORKFLOW_ALREADY_EXISTS`, saying what
        differs), unless it carries the original start's `idempotency_key`.

        Args:
            workflow: The registered workflow name, or the workflow function
                (its `__name__` is the name).
            args: The workflow's arguments after `ctx`; they must be encodable.
            id: The workflow's id, e.g. "publish-post-7": its root promise's
                id and the prefix of its step ids.
            group: The group whose workers run it.
            ttl: How long the workflow may take in all (it times out after);
                None for the server's default workflow lifetime
                (`--default-workflow-ttl`, 30 days). Every step's timeout is
                capped by it (the worker logs a warning when one is).
            idempotency_key: Identifies this start: a later start carrying the
                same key gets the existing run whatever its arguments (e.g. a
                retried request whose arguments were rebuilt). Default none:
                repeats are recognised by workflow, group and arguments.

        Returns:
            A handle to the execution; `created` says whether this call started it.

        Raises:
            AlreadyExistsError: The id is taken by another workflow, group or
                arguments (reason `WORKFLOW_ALREADY_EXISTS`), or by a promise that
                is not a workflow.
            InvalidArgumentError: Bad id or ttl, or arguments over the payload limit.
            TypeError: The codec cannot encode the arguments, or `ttl` is not a timedelta.
        """
        return self._start("Client.start", workflow, args, id, group, ttl, idempotency_key)[0]

    def execute(
        self,
        workflow: str | Callable[..., Any],
        *args: Any,
        id: str,
        group: str = "workers",
        ttl: timedelta | None = None,
        idempotency_key: str | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Start a workflow by id, once (as `start`), and wait for its result (as its
        handle's `result()`): one call while it finishes within a minute.

        Args:
            workflow: The registered workflow name, or the workflow function.
            args: The workflow's arguments after `ctx`; they must be encodable.
            id: The workflow's id (a repeat returns the existing run's result).
            group: The group whose workers run it.
            ttl: How long the workflow may take in all (see `start`).
            idempotency_key: Identifies this start (see `start`).
            timeout: Seconds to wait for the result; None waits as long as it takes.

        Returns:
            The workflow's decoded return value.

        Raises:
            PromiseRejectedError: The workflow raised (see `Handle.result`).
            Cancelled: The workflow was cancelled.
            PromiseTimedOutError: The workflow ran out of time (its ttl).
            DeadlineExceededError: It had not finished within `timeout`.
            AlreadyExistsError: The id is taken by another workflow, group or
                arguments (reason `WORKFLOW_ALREADY_EXISTS`).
            InvalidArgumentError: Bad id or ttl, or arguments over the payload limit.
            TypeError: The codec cannot encode the arguments.

        .. versionadded:: 0.4.0
        """
        timeout = check.seconds("Client.execute", timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        first = WAIT_CALL_S if timeout is None else min(timeout, WAIT_CALL_S)
        handle, root = self._start(
            "Client.execute", workflow, args, id, group, ttl, idempotency_key, wait=first
        )
        if root.is_settled:
            return outcome(self, root)
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise not_settled(id, timeout)
        return handle.result(timeout=left)

    def _start(
        self,
        call: str,
        workflow: str | Callable[..., Any],
        args: tuple[Any, ...],
        id: str,
        group: str,
        ttl: timedelta | None,
        idempotency_key: str | None,
        *,
        wait: float | None = None,
    ) -> tuple[Handle, Promise]:
        """`start`, and with `wait` seconds the root as the server answered after up to
        that long a wait for its settle (`CreatePromiseRequest.wait`)."""
        check.promise_id(call, id)
        check.text(call, group, "group")
        ttl = check.duration(call, ttl, "ttl")
        name = check.workflow_name(workflow)
        tags = {TAG_INVOKE: group, TAG_FUNC: name}
        with client_span("troth.start", **{"troth.workflow.id": id, "troth.workflow.name": name,
                                           "troth.group": group}) as traceparent:  # fmt: skip
            if traceparent:
                # Where the workflow's tasks continue the trace (troth._tracing). A
                # repeat start of this id keeps the first one's (the server compares
                # a start by workflow, group and arguments, not by its other tags).
                tags[TRACEPARENT_TAG] = traceparent
            request = self._connection.create_request(
                id,
                self._codec.encode(list(args)),
                tags=tags,
                ttl=ttl,
                idempotency_key=idempotency_key,
                wait=wait,
            )
            longer = None if wait is None else self._connection.timeout + wait
            result = self._connection.create(request, timeout=longer)
        return Handle(self, id, created=result.created), result.promise

    def handle(self, id: str) -> Handle:
        """A handle to the workflow (or any promise) with this id; makes no call."""
        return Handle(self, check.promise_id("Client.handle", id))


def connection(client: Client) -> Connection:
    """The client's transport and call deadline, for the SDK's own modules (the worker,
    `troth tasks`): not a public API."""
    return client._connection
