"""Audit lines against a real server with authentication on (issue 11 part 6).

One module-scoped server (token-file auth and settle-token keys) takes a set of
settles (resolve, reject, cancel, with a credential and with a settle token),
approver-policy refusals, settle-token refusals and authentication failures.
Then the captured server log must hold each audit line exactly once, with its
principal, promise id, outcome, rule and peer, and neither the log nor any
error message sent back may hold a token, a secret or a payload.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from _auth import Grant, bearer, write_token_file
from _support import error_info, eventually, start_server
from google.protobuf.duration_pb2 import Duration

from troth.v1 import promises_pb2, promises_pb2_grpc, types_pb2
from troth_server.settle_keys import new_keys_file

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from _support import ServerProcess

HOUR = Duration(seconds=3600)
PAYLOAD_MARK = "payload-must-not-be-logged-7f3a"


class Run:
    """The server, its secrets, and what the calls of this module were told."""

    def __init__(self, server: ServerProcess, tokens: dict[str, str], keys_file: Path) -> None:
        self.server = server
        self.tokens = tokens
        self.keys_file = keys_file
        self.channel = grpc.insecure_channel(server.address)
        self.stub = promises_pb2_grpc.PromiseServiceStub(self.channel)
        self.secrets: list[str] = [*tokens.values(), *_key_secrets(keys_file)]
        self.messages: list[str] = []
        self.ids: dict[str, str] = {}

    def as_(self, name: str) -> tuple[tuple[str, str], ...]:
        return bearer(self.tokens[name])

    def create(self, key: str, approvers: types_pb2.Approvers | None = None) -> str:
        promise_id = self.ids[key] = f"audit-{key}-{uuid.uuid4().hex[:8]}"
        request = promises_pb2.CreatePromiseRequest(
            id=promise_id, ttl=HOUR, param=_payload("param"), approvers=approvers
        )
        self.stub.CreatePromise(request, metadata=self.as_("gateway"), timeout=10)
        return promise_id

    def refused(self, call: Any, request: Any, metadata: Any = ()) -> tuple[grpc.StatusCode, str]:
        with pytest.raises(grpc.RpcError) as caught:
            call(request, metadata=metadata, timeout=10)
        self.messages.append(caught.value.details() or "")
        return caught.value.code(), error_info(caught.value).reason

    def records(self) -> list[dict[str, Any]]:
        found = []
        for line in self.server.log().splitlines():
            if line.startswith("{"):
                found.append(json.loads(line))
        return found


def _payload(what: str) -> types_pb2.Payload:
    return types_pb2.Payload(
        headers={"content-type": "application/json"},
        data=json.dumps({what: PAYLOAD_MARK}).encode(),
    )


def _key_secrets(keys_file: Path) -> list[str]:
    return list(json.loads(keys_file.read_text())["keys"].values())


def _altered(token: str) -> str:
    """The token with a character of its signature changed (a forgery). Not the last
    one: in base64 its low bits may be padding, and the signature would not change."""
    at = len(token) - 5
    swapped = "A" if token[at] != "A" else "B"
    return token[:at] + swapped + token[at + 1 :]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    workdir = tmp_path_factory.mktemp("audit")
    keys_file = workdir / "settle-keys.json"
    keys_file.write_text(new_keys_file(["k1"]))
    tokens = write_token_file(
        workdir / "tokens.toml",
        [
            Grant("gateway", ("gateway",)),
            Grant("alice", ("gateway",)),
            Grant("bob", ("gateway",)),
            Grant("ops", ("operator",)),
        ],
    )
    server = start_server(
        workdir,
        "--auth-tokens",
        str(workdir / "tokens.toml"),
        "--settle-token-keys",
        str(keys_file),
    )
    result = Run(server, tokens, keys_file)
    try:
        yield result
    finally:
        result.channel.close()
        assert server.stop() == 0, server.log()[-3000:]


@pytest.fixture(scope="module")
def acted(run: Run) -> Run:
    """Every settle and refusal of the module, made once (the tests read what it left)."""
    stub, only_alice = run.stub, types_pb2.Approvers(principals=["alice"])

    # Settles with a credential: resolve and reject by the approver, cancel by an operator.
    resolved = run.create("resolved", only_alice)
    code = run.refused(
        stub.ResolvePromise,
        promises_pb2.ResolvePromiseRequest(id=resolved, value=_payload("value")),
        run.as_("bob"),
    )
    assert code == (grpc.StatusCode.PERMISSION_DENIED, "NOT_AN_APPROVER")
    stub.ResolvePromise(
        promises_pb2.ResolvePromiseRequest(
            id=resolved, value=_payload("value"), idempotency_key="k"
        ),
        metadata=run.as_("alice"),
        timeout=10,
    )
    # A repeat with the winner's key changes nothing: it is no second settle.
    repeat = stub.ResolvePromise(
        promises_pb2.ResolvePromiseRequest(
            id=resolved, value=_payload("value"), idempotency_key="k"
        ),
        metadata=run.as_("alice"),
        timeout=10,
    )
    assert not repeat.applied
    rejected = run.create("rejected", only_alice)
    code = run.refused(
        stub.RejectPromise, promises_pb2.RejectPromiseRequest(id=rejected), run.as_("gateway")
    )
    assert code == (grpc.StatusCode.PERMISSION_DENIED, "NOT_AN_APPROVER")
    stub.RejectPromise(
        promises_pb2.RejectPromiseRequest(id=rejected, value=_payload("value")),
        metadata=run.as_("alice"),
        timeout=10,
    )
    cancelled = run.create("cancelled")
    stub.CancelPromise(
        promises_pb2.CancelPromiseRequest(id=cancelled), metadata=run.as_("ops"), timeout=10
    )

    # Settle tokens: one good settle with no other credential, then every refusal.
    by_link = run.create("by-link", only_alice)
    other = run.create("other")
    minted = stub.MintSettleToken(
        promises_pb2.MintSettleTokenRequest(
            promise_id=by_link, outcomes=[types_pb2.PROMISE_STATE_RESOLVED], acts_for="alice"
        ),
        metadata=run.as_("gateway"),
        timeout=10,
    )
    run.secrets.append(minted.token)
    run.ids["by-link-token"] = f"k1:{minted.token_id}"
    refusals = {
        "SETTLE_TOKEN_BAD_SIGNATURE": promises_pb2.ResolvePromiseRequest(
            id=by_link, settle_token=_altered(minted.token)
        ),
        "SETTLE_TOKEN_WRONG_PROMISE": promises_pb2.ResolvePromiseRequest(
            id=other, settle_token=minted.token
        ),
        "SETTLE_TOKEN_OUTCOME_NOT_ALLOWED": promises_pb2.RejectPromiseRequest(
            id=by_link, settle_token=minted.token
        ),
        "SETTLE_TOKEN_MALFORMED": promises_pb2.ResolvePromiseRequest(
            id=by_link, settle_token="troth-st.not-a-token"
        ),
    }
    for reason, request in refusals.items():
        call = stub.RejectPromise if isinstance(request, promises_pb2.RejectPromiseRequest) else (
            stub.ResolvePromise
        )  # fmt: skip
        assert run.refused(call, request)[1] == reason
        run.secrets.append(request.settle_token)
    stub.ResolvePromise(
        promises_pb2.ResolvePromiseRequest(
            id=by_link, value=_payload("value"), settle_token=minted.token
        ),
        timeout=10,
    )
    code = run.refused(
        stub.ResolvePromise,
        promises_pb2.ResolvePromiseRequest(id=by_link, settle_token=minted.token),
    )
    assert code == (grpc.StatusCode.FAILED_PRECONDITION, "SETTLE_TOKEN_USED")

    # Authentication failures: no credentials, an unknown token, a wrong secret, a role.
    wrong_secret = run.tokens["bob"][:-4] + "AAAA"
    unknown = "troth_00000000deadbeef_" + "x" * 43
    run.secrets += [wrong_secret, unknown]
    failures = [
        ((), "CREDENTIALS_MISSING"),
        (bearer(unknown), "TOKEN_UNKNOWN"),
        (bearer(wrong_secret), "TOKEN_INVALID"),
        (run.as_("ops"), "ROLE_NOT_ALLOWED"),
    ]
    for metadata, reason in failures:
        request = promises_pb2.ResolvePromiseRequest(id=other, value=_payload("value"))
        assert run.refused(stub.ResolvePromise, request, metadata)[1] == reason
    return run


def _audit(run: Run, event: str, **fields: str) -> list[dict[str, Any]]:
    return [
        r
        for r in run.records()
        if r.get("event") == event and all(r.get(k) == v for k, v in fields.items())
    ]


def _wait_for_flush(run: Run) -> None:
    # The last call of `acted` is the operator's refused resolve: once its line is in the
    # log, everything before it is (the server flushes its log every 0.2 s, in order).
    eventually(
        lambda: bool(_audit(run, "auth.refused", reason="ROLE_NOT_ALLOWED")),
        timeout=10,
        what="the last refusal's line",
    )


def test_every_settle_is_one_audit_line(acted: Run) -> None:
    _wait_for_flush(acted)
    ids = acted.ids
    expected = [
        (ids["resolved"], "ResolvePromise", "RESOLVED", "alice", "alice", "credential"),
        (ids["rejected"], "RejectPromise", "REJECTED", "alice", "alice", "credential"),
        (ids["cancelled"], "CancelPromise", "REJECTED_CANCELED", "ops", "ops", "credential"),
    ]
    for promise_id, rpc, outcome, principal, settled_by, via in expected:
        lines = _audit(acted, "audit.settled", promise_id=promise_id)
        assert len(lines) == 1, lines
        line = lines[0]
        assert (line["rpc"], line["outcome"], line["principal"]) == (rpc, outcome, principal)
        assert (line["settled_by"], line["via"]) == (settled_by, via)
        assert line["peer"].startswith("ipv4:127.0.0.1:"), line
    for promise_id, *_ in expected:
        (line,) = _audit(acted, "audit.settled", promise_id=promise_id)
        assert line["caller"] == line["principal"]
        assert line["settle_token"] is None
    # A link's settle is its principal's, and says by what means and who presented it.
    (by_link,) = _audit(acted, "audit.settled", promise_id=ids["by-link"])
    assert (by_link["outcome"], by_link["via"]) == ("RESOLVED", "settle_token")
    assert (by_link["principal"], by_link["caller"]) == ("alice", "troth:settle-token")
    assert by_link["settle_token"] == ids["by-link-token"]
    assert by_link["settled_by"] == f"alice via settle-token {ids['by-link-token']}"
    # Nothing else was settled: the refusals and the idempotent repeat left no line.
    assert len(_audit(acted, "audit.settled")) == 4


def test_every_refusal_is_one_audit_line(acted: Run) -> None:
    _wait_for_flush(acted)
    ids = acted.ids
    policy = [
        (ids["resolved"], "ResolvePromise", "RESOLVED", "bob"),
        (ids["rejected"], "RejectPromise", "REJECTED", "gateway"),
    ]
    for promise_id, rpc, outcome, principal in policy:
        (line,) = _audit(acted, "audit.refused", promise_id=promise_id)
        assert (line["rpc"], line["outcome"], line["principal"]) == (rpc, outcome, principal)
        assert (line["reason"], line["rule"]) == ("NOT_AN_APPROVER", "approvers")
        assert (line["via"], line["caller"], line["settle_token"]) == (
            "credential",
            principal,
            None,
        )
        assert line["peer"].startswith("ipv4:127.0.0.1:")
        assert "rule approvers" in line["message"]
    tokens = {
        "SETTLE_TOKEN_BAD_SIGNATURE": ids["by-link"],
        "SETTLE_TOKEN_WRONG_PROMISE": ids["other"],
        "SETTLE_TOKEN_OUTCOME_NOT_ALLOWED": ids["by-link"],
        "SETTLE_TOKEN_MALFORMED": ids["by-link"],
        "SETTLE_TOKEN_USED": ids["by-link"],
    }
    for reason, promise_id in tokens.items():
        (line,) = _audit(acted, "audit.refused", reason=reason)
        assert line["promise_id"] == promise_id
        assert (line["via"], line["caller"]) == ("settle_token", "troth:settle-token")
        if reason == "SETTLE_TOKEN_USED":
            # Verified: the refusal names whom the token acts for, and which it is.
            assert (line["principal"], line["settle_token"]) == ("alice", ids["by-link-token"])
        else:
            # Not a token that verifies for this settle: it acts for nobody.
            assert (line["principal"], line["settle_token"]) == ("troth:settle-token", None)
        assert line["rule"] is None
        assert line["peer"].startswith("ipv4:127.0.0.1:")
    assert len(_audit(acted, "audit.refused")) == len(policy) + len(tokens)
    for reason in ("CREDENTIALS_MISSING", "TOKEN_UNKNOWN", "TOKEN_INVALID", "ROLE_NOT_ALLOWED"):
        (line,) = _audit(acted, "auth.refused", reason=reason)
        assert line["rpc"] == "ResolvePromise"
        assert line["peer"].startswith("ipv4:127.0.0.1:")
    (role,) = _audit(acted, "auth.refused", reason="ROLE_NOT_ALLOWED")
    assert role["principal"] == "ops"
    # A refused call is refused once: auth.refused and audit.refused never both.
    assert len(_audit(acted, "auth.refused")) == 4


def test_no_token_secret_or_payload_in_the_log_or_the_messages(acted: Run) -> None:
    _wait_for_flush(acted)
    log = acted.server.log()
    assert len(acted.messages) == 11
    assert len(acted.secrets) >= 11
    for secret in acted.secrets:
        assert secret, "an empty secret would prove nothing"
        assert secret not in log
        for message in acted.messages:
            assert secret not in message
    # The secret half of each bearer token, on its own, is not there either.
    for token in acted.tokens.values():
        assert token.split("_", 2)[2] not in log
    assert PAYLOAD_MARK not in log
    assert all(PAYLOAD_MARK not in m for m in acted.messages)


def test_get_promise_returns_who_settled_and_when(acted: Run) -> None:
    stub = acted.stub
    for key, settled_by in (("resolved", "alice"), ("rejected", "alice"), ("cancelled", "ops")):
        promise = stub.GetPromise(
            promises_pb2.GetPromiseRequest(id=acted.ids[key]),
            metadata=acted.as_("gateway"),
            timeout=10,
        ).promise
        assert promise.settled_by == settled_by
        assert promise.HasField("settle_time")
        assert promise.settle_time.ToMilliseconds() >= promise.create_time.ToMilliseconds()
    link = stub.GetPromise(
        promises_pb2.GetPromiseRequest(id=acted.ids["by-link"]),
        metadata=acted.as_("gateway"),
        timeout=10,
    ).promise
    assert link.settled_by == f"alice via settle-token {acted.ids['by-link-token']}"
    pending = stub.GetPromise(
        promises_pb2.GetPromiseRequest(id=acted.ids["other"]),
        metadata=acted.as_("gateway"),
        timeout=10,
    ).promise
    assert pending.settled_by == ""
    assert not pending.HasField("settle_time")
