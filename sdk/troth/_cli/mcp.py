"""`troth mcp`: an approval gate for any agent, over the Model Context Protocol.

```
troth mcp [--transport stdio|http] [--listen 127.0.0.1:8765] [--settle-link URL]
```

An MCP server (the official `mcp` package: `pip install 'troth[mcp]'`) whose tools
let an agent that speaks MCP (an IDE assistant, an agent runtime) gate a tool call
on a human's decision recorded by troth:

- `request_decision(title, message, schema, approvers, ttl, id, tags, link_for)`:
  creates a pending promise for a human (tagged as an approval, so it is in the
  inbox and the console) and answers its `promise_id` and, with `--settle-link`
  and `link_for`, a link that settles it (a settle token acting for `link_for`);
- `await_decision(promise_id, wait)`: waits up to `wait` (default 30s, at most
  10m) and answers the decision (`resolved`, with its value), a rejection
  (`rejected`: declined, cancelled or timed out) or, still pending, a `deferred`
  acknowledgment (ask again later; routecraft's deferral);
- `read_decision(promise_id)`: the same without waiting.

The server acts as the troth client the global flags describe (`--server`,
`--token-file` / `TROTH_TOKEN_FILE`, TLS): its principal creates the requests, and
the approver policy decides who may answer them. Bad input is a tool error whose
text starts with the field at fault (`ttl: ...`, `approvers.permissions[1]: ...`),
so that a model can correct its call. Over stdio nothing but MCP goes to stdout.

The MCP package is imported only when the command runs (`troth --help` and every
other command never need it); the tool's shapes are plain dataclasses.
"""

from __future__ import annotations

import ipaddress
import re
import sys
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import IO, TYPE_CHECKING, Any, Literal

from troth._cli.args import add_leaf
from troth._durations import EXAMPLES, duration_ms
from troth.errors import ConfigurationError, InvalidArgumentError, RpcError

if TYPE_CHECKING:
    import argparse

    from troth._promise import Promise
    from troth.client import Client

__all__ = ["add_commands", "build_server", "http_address"]

MAX_WAIT = timedelta(minutes=10)
"""The longest `await_decision` waits in one call (then it answers `deferred`)."""
DEFAULT_WAIT = "30s"
APPROVAL_TAGS = {"troth:kind": "promise"}
"""What makes a standalone promise an approval: listed by the inbox and the console."""
_INSTALL = "pip install 'troth[mcp]'"


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `mcp` to the `troth` command line."""
    command = add_leaf(
        commands,
        "mcp",
        "serve an MCP server whose tools let an agent ask a human for a decision and "
        f"await it (request_decision, await_decision, read_decision); needs {_INSTALL}",
        _cmd_mcp,
    )
    command.add_argument(
        "--transport",
        choices=("stdio", "http"),
        default="stdio",
        help="stdio (default: an MCP host starts this command) or http (streamable HTTP "
        "at http://LISTEN/mcp)",
    )
    command.add_argument(
        "--listen",
        default="127.0.0.1:8765",
        metavar="HOST:PORT",
        help="where --transport http listens (default 127.0.0.1:8765)",
    )
    command.add_argument(
        "--allow-public",
        action="store_true",
        help="let --transport http listen on an address other than loopback: every caller "
        "acts as this server's troth principal, so put it behind a proxy that authenticates",
    )
    command.add_argument(
        "--settle-link",
        metavar="URL",
        help="a URL with {token} (and optionally {id}) in it: request_decision with "
        "link_for answers this link, carrying a settle token that acts for that approver",
    )


def _cmd_mcp(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    if args.settle_link is not None and "{token}" not in args.settle_link:
        raise ConfigurationError(
            f"--settle-link {args.settle_link!r}: put {{token}} where the settle token goes"
        )
    server = build_server(client, settle_link=args.settle_link)
    if args.transport == "stdio":
        server.run("stdio")
        return 0
    host, port = http_address(args.listen, allow_public=args.allow_public)
    print(f"troth mcp: serving MCP at http://{args.listen}/mcp", file=sys.stderr)
    server.run("streamable-http", host=host, port=port)
    return 0


def http_address(listen: str, *, allow_public: bool = False) -> tuple[str, int]:
    """`--listen` as (host, port); a non-loopback host only with `--allow-public`."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ConfigurationError(f"--listen {listen!r}: give HOST:PORT, such as 127.0.0.1:8765")
    if not allow_public and not _loopback(host):
        raise ConfigurationError(
            f"--listen {listen!r} is not a loopback address: every caller of this MCP server "
            "acts as its troth principal, and the server authenticates nobody; serve it on "
            "127.0.0.1 behind a proxy that authenticates, or pass --allow-public"
        )
    return host, int(port)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# -- what the tools take and answer ---------------------------------------------------


@dataclass
class ApproversIn:
    """Who may decide: principals, roles or permission names (any admits), four eyes,
    distinct quorums (troth's `Approvers`)."""

    principals: list[str] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)
    permissions: list[str] = field(default_factory=list)
    not_requester: bool = False
    distinct: bool = False
    quorum: str = ""


@dataclass
class Requested:
    """A decision asked for: await it with its `promise_id`."""

    promise_id: str
    created: bool
    """False: a request with this id existed already (a repeat changes nothing)."""
    expire_time: str | None
    """When it times out unanswered (ISO 8601), None for never."""
    settle_link: str | None = None
    """A link that settles it as `link_for` (with --settle-link)."""
    settle_link_error: str | None = None
    """Why no link was made, when one was asked for."""
    status: Literal["requested"] = "requested"


@dataclass
class Decided:
    """The human's decision."""

    promise_id: str
    decision: Any
    """The value the human resolved it with (JSON)."""
    settled_by: str
    settle_time: str | None
    status: Literal["resolved"] = "resolved"


@dataclass
class Declined:
    """No: rejected by a human, cancelled, or timed out unanswered."""

    promise_id: str
    state: str
    """REJECTED, REJECTED_CANCELED or REJECTED_TIMEDOUT."""
    reason: Any
    """The value it was rejected with (JSON), if any."""
    settled_by: str
    settle_time: str | None
    status: Literal["rejected"] = "rejected"


@dataclass
class Deferred:
    """Still pending: nothing decided yet; ask again later (await_decision)."""

    promise_id: str
    expire_time: str | None
    message: str
    status: Literal["deferred"] = "deferred"


# -- the tools' logic (no MCP in it) --------------------------------------------------


class BadInput(ValueError):
    """A tool argument that cannot be used; the message starts with its name."""


def parse_wait(text: str, name: str = "wait") -> timedelta:
    ms = duration_ms(text)
    if ms is None or ms < 0:
        raise BadInput(f"{name}: {text!r} is no duration; give one such as {EXAMPLES}")
    return timedelta(milliseconds=ms)


def approvers_from(given: ApproversIn | None) -> Any:
    """troth's `Approvers` from the tool's argument (None: anyone may decide)."""
    if given is None:
        return None
    from troth import Approvers

    try:
        return Approvers(
            principals=given.principals,
            roles=given.roles,
            permissions=given.permissions,
            not_requester=given.not_requester,
            distinct=given.distinct,
            quorum=given.quorum,
        )
    except (TypeError, ValueError) as exc:
        raise BadInput(f"approvers: {exc}") from None


_LISTED = re.compile(r"^approvers\.(principals|roles|permissions)\[(\d+)\]")


def as_given(message: str, given: ApproversIn | None) -> str:
    """The server's message about an approvers list entry, its index as the agent gave
    the list (troth sends each list sorted and without repeats, and the server names
    the index it received)."""
    found = _LISTED.match(message)
    if found is None or given is None:
        return message
    kind, index = found[1], int(found[2])
    values: list[str] = getattr(given, kind)
    sent = sorted(set(values))
    if index >= len(sent):
        return message
    return f"approvers.{kind}[{values.index(sent[index])}]" + message[found.end() :]


def outcome(client: Client, promise: Promise) -> Decided | Declined | Deferred:
    """What an agent is told of a promise: the decision, a rejection, or deferred."""
    from troth._promise import PromiseState

    settled_by, settle_time = promise.settled_by, _iso(promise.settle_time)
    if promise.state is PromiseState.PENDING:
        return Deferred(
            promise.id,
            _iso(promise.expire_time),
            "no decision yet: a human has not answered; call await_decision again later",
        )
    value = None if promise.value.is_empty else client.decode(promise.value)
    if promise.state is PromiseState.RESOLVED:
        return Decided(promise.id, value, settled_by, settle_time)
    return Declined(promise.id, promise.state.value, value, settled_by, settle_time)


def _iso(moment: Any) -> str | None:
    return None if moment is None else str(moment.isoformat())


class Gate:
    """The tools' work against one troth `Client` (blocking calls: run on a thread)."""

    def __init__(self, client: Client, settle_link: str | None = None) -> None:
        self.client = client
        self.settle_link = settle_link

    def request(
        self,
        title: str,
        message: str = "",
        schema: dict[str, Any] | None = None,
        approvers: ApproversIn | None = None,
        ttl: str | None = None,
        id: str | None = None,
        tags: dict[str, str] | None = None,
        link_for: str | None = None,
    ) -> Requested:
        if not title.strip():
            raise BadInput("title: say what the human decides, in a few words")
        lifetime = None if ttl is None else parse_wait(ttl, "ttl")
        policy = approvers_from(approvers)
        promise_id = id or f"mcp-{uuid.uuid4().hex}"
        try:
            created = self.client.create(
                promise_id,
                tags={**(tags or {}), **APPROVAL_TAGS},
                ttl=lifetime,
                schema=schema,
                title=title,
                message=message,
                approvers=policy,
            )
        except InvalidArgumentError as exc:
            raise BadInput(as_given(exc.message, approvers)) from None
        answer = Requested(promise_id, created.created, _iso(created.promise.expire_time))
        if link_for is not None:
            self._link(answer, link_for)
        return answer

    def _link(self, answer: Requested, link_for: str) -> None:
        if self.settle_link is None:
            answer.settle_link_error = "this server was started without --settle-link"
            return
        try:
            token = self.client.mint_settle_token(answer.promise_id, acts_for=link_for)
        except RpcError as exc:
            answer.settle_link_error = f"{exc.reason or exc.code.name}: {exc.message}"
            return
        answer.settle_link = self.settle_link.replace("{token}", token).replace(
            "{id}", answer.promise_id
        )

    def read(self, promise_id: str) -> Decided | Declined | Deferred:
        return outcome(self.client, self.client.get(promise_id))

    def wait(self, promise_id: str, wait: str = DEFAULT_WAIT) -> Decided | Declined | Deferred:
        seconds = min(parse_wait(wait), MAX_WAIT).total_seconds()
        if seconds == 0:
            return self.read(promise_id)
        try:
            found = self.client.wait(promise_id, timeout=seconds)
        except TimeoutError:  # DeadlineExceededError: not settled within the wait
            found = self.client.get(promise_id)
        return outcome(self.client, found)


# -- the MCP server -------------------------------------------------------------------


def build_server(client: Client, *, settle_link: str | None = None) -> Any:
    """The `MCPServer` of `troth mcp`, its tools working through `client`."""
    try:
        import anyio.to_thread
        from mcp.server.mcpserver import MCPServer
        from mcp.server.mcpserver.exceptions import ToolError
    except ImportError:
        raise ConfigurationError(f"troth mcp needs the MCP package: {_INSTALL}") from None

    gate = Gate(client, settle_link)
    server = MCPServer(
        "troth",
        instructions="Ask a human for a decision before an action that needs one "
        "(request_decision), then await it (await_decision): the answer is the decision, "
        "a rejection, or 'deferred' while nobody has decided yet.",
    )

    async def run(call: Any, *args: Any) -> Any:
        try:
            return await anyio.to_thread.run_sync(call, *args)
        except BadInput as exc:
            raise ToolError(str(exc)) from None
        except InvalidArgumentError as exc:  # the server's message names the field
            raise ToolError(exc.message) from None
        except RpcError as exc:
            raise ToolError(f"{exc.reason or exc.code.name}: {exc.message}") from None

    @server.tool()
    async def request_decision(
        title: str,
        message: str = "",
        schema: dict[str, Any] | None = None,
        approvers: ApproversIn | None = None,
        ttl: str | None = None,
        id: str | None = None,
        tags: dict[str, str] | None = None,
        link_for: str | None = None,
    ) -> Requested:
        """Ask a human for a decision: a title (and a longer message) they read, the
        JSON Schema their answer must satisfy (none: any JSON), who may decide
        (principals, roles or permission names; four eyes with not_requester), and
        how long it may wait (ttl such as 2h or 3d; the server's default otherwise).
        Give an id to make a retry of the same request harmless. With link_for (an
        approver named in approvers.principals), a link that settles it as them.
        Answers the promise_id to await."""
        request = (title, message, schema, approvers, ttl, id, tags, link_for)
        answer: Requested = await run(gate.request, *request)
        return answer

    @server.tool()
    async def await_decision(
        promise_id: str, wait: str = DEFAULT_WAIT
    ) -> Decided | Declined | Deferred:
        """Wait up to `wait` (such as 30s or 5m; at most 10m) for the human's
        decision on a request: status 'resolved' with the decision, 'rejected' (declined,
        cancelled or timed out), or 'deferred' while it is still pending."""
        answer: Decided | Declined | Deferred = await run(gate.wait, promise_id, wait)
        return answer

    @server.tool()
    async def read_decision(promise_id: str) -> Decided | Declined | Deferred:
        """The decision on a request now, without waiting: 'resolved', 'rejected', or
        'deferred' while it is still pending."""
        answer: Decided | Declined | Deferred = await run(gate.read, promise_id)
        return answer

    return server
