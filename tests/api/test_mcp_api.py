"""`troth mcp`, an approval gate for any agent over MCP (issue 31 item 4), driven by
the `mcp` package's own client over stdio against a real troth server with
authentication on, on both stores.

The agent asks (`request_decision`), a human decides through troth's `Client`, and
`await_decision` answers the decision, a rejection, or `deferred` while nobody has
decided; a settle link acts for the approver it names; bad input is a tool error
naming the field. The MCP server authenticates as any troth client: its token
comes from `TROTH_TOKEN_FILE`.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import pytest
from _auth import Grant, write_token_file
from _pg import fresh_schema
from _support import start_server
from mcp import Client as McpClient
from mcp import StdioServerParameters

from troth import Client
from troth.errors import PermissionDeniedError, Reason
from troth_server.settle_keys import new_keys_file

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator
    from pathlib import Path

    from _support import ServerProcess

PAYOUTS = "payouts:approve"
LINK = "https://approve.example/settle?id={id}&token={token}"


@dataclass
class Setup:
    server: ServerProcess
    workdir: Path
    tokens: dict[str, str]

    def client(self, name: str | None) -> Client:
        return Client(self.server.address, token=self.tokens[name] if name else None, timeout=10)

    def mcp(self) -> StdioServerParameters:
        """`troth mcp` as an MCP host starts it: authenticated by TROTH_TOKEN_FILE."""
        token_file = self.workdir / "agent.token"
        token_file.write_text(self.tokens["agent"])
        env = {k: v for k, v in os.environ.items() if k not in ("TROTH_TOKEN", "TROTH_SERVER")}
        env["TROTH_TOKEN_FILE"] = str(token_file)
        return StdioServerParameters(
            command=sys.executable,
            args=["-m", "troth", "mcp", "--server", self.server.address, "--settle-link", LINK],
            env=env,
        )


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def setup(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Setup]:
    workdir = tmp_path_factory.mktemp("mcp")
    (workdir / "settle-keys.json").write_text(new_keys_file(["k1"]))
    tokens = write_token_file(
        workdir / "tokens.toml",
        [
            Grant("agent", ("gateway",)),
            Grant("ann", ("gateway",), permissions=(PAYOUTS,)),
            Grant("carol", ("gateway",)),
        ],
    )
    with ExitStack() as stack:
        db_url = stack.enter_context(fresh_schema()) if request.param == "postgres" else None
        server = start_server(
            workdir,
            "--auth-tokens", str(workdir / "tokens.toml"),
            "--settle-token-keys", str(workdir / "settle-keys.json"),
            db_url=db_url,
        )  # fmt: skip
        try:
            yield Setup(server, workdir, tokens)
        finally:
            assert server.stop() == 0, server.log()[-3000:]


def _with_mcp(setup: Setup, body: Callable[[McpClient], Awaitable[None]]) -> None:
    async def run() -> None:
        async with McpClient(setup.mcp(), read_timeout_seconds=30) as agent:
            await body(agent)

    asyncio.run(run())


async def _call(agent: McpClient, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's structured answer (the union's member under `result`, or the object)."""
    answer = await agent.call_tool(tool, arguments)
    assert not answer.is_error, answer.content
    content = answer.structured_content
    assert content is not None
    found: dict[str, Any] = content.get("result", content)
    return found


async def _refused(agent: McpClient, tool: str, **arguments: Any) -> str:
    """A tool error's text, after the MCP package's "Error executing tool NAME: "."""
    answer = await agent.call_tool(tool, arguments)
    assert answer.is_error, answer.structured_content
    text: str = answer.content[0].text  # type: ignore[union-attr]
    return text.removeprefix(f"Error executing tool {tool}: ")


def _payout(**more: Any) -> dict[str, Any]:
    return {
        "title": "Pay out 120 EUR to ACME?",
        "message": "Invoice 42, due today.",
        "schema": {
            "type": "object",
            "required": ["approved"],
            "properties": {"approved": {"type": "boolean"}},
        },
        "approvers": {"principals": ["ann"], "permissions": [PAYOUTS]},
        "ttl": "1h",
        **more,
    }


def test_the_tools_and_their_union_of_answers_are_advertised(setup: Setup) -> None:
    async def body(agent: McpClient) -> None:
        tools = {t.name: t for t in (await agent.list_tools()).tools}
        assert set(tools) == {"request_decision", "await_decision", "read_decision"}
        schema = tools["await_decision"].output_schema
        assert schema is not None
        assert set(schema["$defs"]) == {"Decided", "Declined", "Deferred"}
        asked = tools["request_decision"].input_schema
        assert asked["required"] == ["title"]
        assert {"title", "message", "schema", "approvers", "ttl"} <= set(asked["properties"])

    _with_mcp(setup, body)


def test_a_request_awaited_while_a_human_decides_returns_the_decision(setup: Setup) -> None:
    async def body(agent: McpClient) -> None:
        asked = await _call(agent, "request_decision", **_payout(link_for="ann"))
        promise_id = asked["promise_id"]
        assert asked["status"] == "requested" and asked["created"]
        # Pending: a read is deferred at once.
        read = await _call(agent, "read_decision", promise_id=promise_id)
        assert (read["status"], read["promise_id"]) == ("deferred", promise_id)
        # The human, in the inbox: created by the agent's principal, tagged an approval.
        with setup.client("ann") as ann:
            found = ann.get(promise_id)
            assert found.title == "Pay out 120 EUR to ACME?" and found.started_by == "agent"
            assert promise_id in [p.id for p in ann.search(promise_id, mine=True).promises]
        waiting = asyncio.ensure_future(
            _call(agent, "await_decision", promise_id=promise_id, wait="20s")
        )
        await asyncio.to_thread(_decide, setup, promise_id)
        decided = await waiting
        assert decided["status"] == "resolved"
        assert decided["decision"] == {"approved": True}
        assert decided["settled_by"] == "ann"
        # The link: a settle token that acts for ann, usable with no credential.
        link = urlsplit(asked["settle_link"])
        query = parse_qs(link.query)
        assert link.netloc == "approve.example" and query["id"] == [promise_id]
        # A named approver's: it carries no permissions (the server cannot know hers).
        assert query["token"][0].startswith("st2.")

    _with_mcp(setup, body)


def _decide(setup: Setup, promise_id: str) -> None:
    with setup.client("ann") as ann:
        ann.resolve(promise_id, {"approved": True})


def test_a_settle_link_settles_as_its_approver(setup: Setup) -> None:
    async def body(agent: McpClient) -> None:
        asked = await _call(agent, "request_decision", **_payout(link_for="ann"))
        token = parse_qs(urlsplit(asked["settle_link"]).query)["token"][0]
        with setup.client(None) as anyone:
            settled = anyone.resolve(asked["promise_id"], {"approved": False}, settle_token=token)
        assert settled.promise.settled_by.startswith("ann via settle-token k1:")
        decided = await _call(agent, "read_decision", promise_id=asked["promise_id"])
        assert (decided["status"], decided["decision"]) == ("resolved", {"approved": False})
        # A link for someone the policy does not name is refused, saying why; the
        # request stands.
        other = await _call(agent, "request_decision", **_payout(link_for="carol"))
        assert other["settle_link"] is None and "NOT_AN_APPROVER" in other["settle_link_error"]

    _with_mcp(setup, body)


def test_a_rejection_is_the_answer_and_only_an_approver_gives_it(setup: Setup) -> None:
    async def body(agent: McpClient) -> None:
        asked = await _call(agent, "request_decision", **_payout())
        promise_id = asked["promise_id"]
        with setup.client("carol") as carol, pytest.raises(PermissionDeniedError) as refused:
            carol.reject(promise_id, {"reason": "not mine"})
        assert refused.value.reason == Reason.NOT_AN_APPROVER
        with setup.client("ann") as ann:
            ann.reject(promise_id, {"reason": "the invoice is a duplicate"})
        declined = await _call(agent, "await_decision", promise_id=promise_id, wait="5s")
        assert declined["status"] == "rejected" and declined["state"] == "REJECTED"
        assert declined["reason"] == {"reason": "the invoice is a duplicate"}
        assert declined["settled_by"] == "ann"

    _with_mcp(setup, body)


def test_a_pending_await_is_deferred_and_a_repeat_request_changes_nothing(setup: Setup) -> None:
    async def body(agent: McpClient) -> None:
        promise_id = f"payout-{uuid.uuid4().hex[:8]}"
        first = await _call(agent, "request_decision", **_payout(id=promise_id))
        again = await _call(agent, "request_decision", **_payout(id=promise_id))
        assert (first["created"], again["created"]) == (True, False)
        deferred = await _call(agent, "await_decision", promise_id=promise_id, wait="200ms")
        assert deferred["status"] == "deferred"
        assert deferred["expire_time"] == first["expire_time"]
        assert "await_decision again" in deferred["message"]

    _with_mcp(setup, body)


def test_bad_input_is_a_tool_error_naming_the_field(setup: Setup) -> None:
    async def body(agent: McpClient) -> None:
        bad = {"approvers": {"permissions": [PAYOUTS, "pay outs"]}}
        text = await _refused(agent, "request_decision", **_payout(**bad))
        assert text.startswith("approvers.permissions[1]:"), text
        assert (await _refused(agent, "request_decision", **_payout(ttl="soon"))).startswith(
            "ttl: 'soon' is no duration"
        )
        bad_quorum = {"approvers": {"quorum": "q"}}
        text = await _refused(agent, "request_decision", **_payout(**bad_quorum))
        assert text.startswith("approvers:") and "distinct" in text, text
        assert "title" in await _refused(agent, "request_decision", message="no title")
        assert (await _refused(agent, "await_decision", promise_id="p", wait="x")).startswith(
            "wait:"
        )
        text = await _refused(agent, "read_decision", promise_id=f"nope-{uuid.uuid4().hex}")
        assert text.startswith("NOT_FOUND"), text

    _with_mcp(setup, body)
