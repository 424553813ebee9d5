"""`troth mcp`'s logic without MCP (`troth._cli.mcp`): what an agent is told of a
promise, the durations it gives, the field its bad input is named by."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta

import pytest

from troth import Client, JsonCodec, PromiseState
from troth._cli.mcp import (
    ApproversIn,
    BadInput,
    Decided,
    Declined,
    Deferred,
    approvers_from,
    as_given,
    build_server,
    http_address,
    outcome,
    parse_wait,
)
from troth._promise import Promise
from troth.codec import Payload
from troth.errors import ConfigurationError

NOW = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)
CODEC = JsonCodec()


def _promise(state: PromiseState, value: object = None, **more: object) -> Promise:
    encoded = Payload() if value is None else CODEC.encode(value)
    return Promise(
        "p-1", state, Payload(), encoded, {}, NOW, expire_time=NOW + timedelta(hours=1),
        **more,  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.fixture
def client() -> Client:
    return Client("127.0.0.1:1")  # no call is made: decode only


def test_an_agent_is_told_the_decision_a_rejection_or_deferred(client: Client) -> None:
    later = NOW + timedelta(minutes=5)
    pending = outcome(client, _promise(PromiseState.PENDING))
    assert pending == Deferred(
        "p-1", (NOW + timedelta(hours=1)).isoformat(), pending.message
    )  # fmt: skip
    assert "await_decision again" in pending.message
    yes = _promise(PromiseState.RESOLVED, {"ok": True}, settled_by="ann", settle_time=later)
    assert outcome(client, yes) == Decided("p-1", {"ok": True}, "ann", later.isoformat())
    for state in (PromiseState.REJECTED, PromiseState.REJECTED_TIMEDOUT):
        no = _promise(state, settled_by="troth:timeout", settle_time=later)
        assert outcome(client, no) == Declined(
            "p-1", state.value, None, "troth:timeout", later.isoformat()
        )
    client.close()


def test_durations_are_troth_s_and_a_bad_one_names_its_argument() -> None:
    assert parse_wait("1h30m", "ttl") == timedelta(minutes=90)
    assert parse_wait("250ms") == timedelta(milliseconds=250)
    for text in ("soon", "", "-1s", "10"):
        with pytest.raises(BadInput, match=r"^wait: "):
            parse_wait(text)


def test_an_approvers_entry_is_named_by_the_index_the_agent_gave() -> None:
    given = ApproversIn(permissions=["payouts:approve", "pay outs", "payouts:approve"])
    # troth sends the list sorted without repeats: "pay outs" is the server's [0].
    message = "approvers.permissions[0]: 'pay outs' is no permission name"
    assert as_given(message, given) == "approvers.permissions[1]: 'pay outs' is no permission name"
    assert as_given("ttl: bad", given) == "ttl: bad"
    assert as_given(message, None) == message


def test_an_approvers_argument_is_troth_s_policy_or_a_bad_input_naming_it() -> None:
    policy = approvers_from(ApproversIn(principals=["ann"], permissions=["p:a"], distinct=True))
    assert (policy.principals, policy.permissions, policy.distinct) == (("ann",), ("p:a",), True)
    assert approvers_from(None) is None
    with pytest.raises(BadInput, match=r"^approvers: .*distinct"):
        approvers_from(ApproversIn(quorum="q"))


def test_streamable_http_listens_on_loopback_unless_told_otherwise() -> None:
    assert http_address("127.0.0.1:8765") == ("127.0.0.1", 8765)
    assert http_address("[::1]:8765") == ("::1", 8765)
    assert http_address("localhost:1") == ("localhost", 1)
    for public in ("0.0.0.0:8765", "10.1.2.3:8765", "mcp.internal:8765"):
        with pytest.raises(ConfigurationError, match="not a loopback address"):
            http_address(public)
        assert http_address(public, allow_public=True)[1] == 8765
    for bad in ("8765", ":8765", "127.0.0.1:http", "127.0.0.1:70000"):
        with pytest.raises(ConfigurationError, match="give HOST:PORT"):
            http_address(bad)


def test_without_the_mcp_package_the_command_says_how_to_install_it(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "mcp.server.mcpserver", None)  # import fails
    with pytest.raises(ConfigurationError, match=r"pip install 'troth\[mcp\]'"):
        build_server(client)
    client.close()
