"""End-to-end encryption through the codec hook, with authentication on (issue 11 part 7).

Every client and the worker use `examples/encrypted_payloads/codec.py`
(`EncryptingCodec`, AES-256-GCM around `JsonCodec`): a workflow with two human
approvals, one settled by a principal its policy names and one through a
settle-token link, runs to its end, while

- the server's SQLite file holds only ciphertext (read row by row, raw);
- the approver policy (principals, four-eyes) and the settle token are
  enforced as before: they never read a payload;
- a promise with a JSON Schema refuses a sealed value, clearly (the documented
  limitation), and takes a rejection.
"""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Generator, Iterator
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from _auth import Grant, write_token_file
from _support import ServerProcess, append, eventually, lines, start_server
from cryptography.exceptions import InvalidTag

from troth import (
    Approvers,
    Client,
    Context,
    InvalidArgumentError,
    JsonCodec,
    Payload,
    PermissionDeniedError,
    PromiseState,
    Worker,
)
from troth.errors import Reason
from troth_server.settle_keys import new_keys_file


def _example_codec() -> ModuleType:
    """examples/encrypted_payloads/codec.py, imported by path (it is no package)."""
    path = Path(__file__).resolve().parents[2] / "examples" / "encrypted_payloads" / "codec.py"
    spec = importlib.util.spec_from_file_location("encrypted_payloads_codec", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


_codec = _example_codec()
CONTENT_TYPE: str = _codec.CONTENT_TYPE
EncryptingCodec: Any = _codec.EncryptingCodec

SECRET = "salary-of-the-ceo-7b1e"
"""In the claim, the decisions and the step results: must never reach the server in clear."""
LINKS: list[str] = []
KEY = EncryptingCodec.new_key()


def send_link(promise_id: str, token: str) -> str:
    return append(LINKS[0], f"{promise_id} {token}")


def expense(ctx: Context, claim: dict[str, Any]) -> Generator[Any, Any, dict[str, Any]]:
    manager = yield ctx.promise(
        title="Manager approval", approvers=Approvers(principals=["alice"], not_requester=True)
    )
    finance = yield ctx.promise(title="Finance approval", approvers=Approvers(not_requester=True))
    token = yield finance.settle_token(outcomes=["resolve"], ttl=timedelta(hours=1))
    yield ctx.run(send_link, finance.id, token)
    first = yield manager
    second = yield finance
    return {"claim": claim, "manager": first, "finance": second}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("encrypted")
    keys = workdir / "keys.json"
    keys.write_text(new_keys_file(["k1"]))
    tokens = write_token_file(
        workdir / "tokens.toml",
        [
            Grant("vault-worker", ("worker",), ("vault",)),
            Grant("carol", ("gateway",)),
            Grant("alice", ("gateway",)),
            Grant("bob", ("gateway",)),
        ],
    )
    server = start_server(
        workdir, "--auth-tokens", str(workdir / "tokens.toml"), "--settle-token-keys", str(keys)
    )
    links = workdir / "links.txt"
    links.touch()
    LINKS[:] = [str(links)]
    try:
        yield {"server": server, "tokens": tokens, "links": links, "db": workdir / "troth.db"}
    finally:
        assert server.stop() == 0, server.log()[-3000:]


def _client(setup: dict[str, Any], name: str | None, codec: Any = None) -> Client:
    token = setup["tokens"][name] if name else None
    server: ServerProcess = setup["server"]
    return Client(
        server.address,
        timeout=10,
        token=token,
        codec=codec if codec is not None else EncryptingCodec({"k1": KEY}),
    )


@pytest.fixture(scope="module")
def worker(setup: dict[str, Any]) -> Iterator[Worker]:
    with _client(setup, "vault-worker") as client:
        w = Worker(client, group="vault", lease=timedelta(seconds=5))
        w.workflow(expense)
        w.start()
        yield w
        w.stop()


def _rows(db: Path, prefix: str) -> list[tuple[str, dict[str, str], bytes, dict[str, str], bytes]]:
    with sqlite3.connect(db) as conn:
        found = conn.execute(
            "SELECT id, param_headers, param_data, value_headers, value_data FROM promises "
            "WHERE id = ? OR id LIKE ?",
            (prefix, prefix + ".%"),
        ).fetchall()
    return [
        (i, json.loads(ph), bytes(pd), json.loads(vh), bytes(vd)) for i, ph, pd, vh, vd in found
    ]


def test_a_workflow_with_approvals_runs_on_ciphertext(
    setup: dict[str, Any], worker: Worker
) -> None:
    wid = f"expense-{uuid.uuid4().hex[:8]}"
    with (
        _client(setup, "carol") as carol,
        _client(setup, "alice") as alice,
        _client(setup, "bob") as bob,
        _client(setup, None) as link_holder,
    ):
        handle = carol.start("expense", {"amount": 900, "note": SECRET}, id=wid, group="vault")
        eventually(lambda: any(line.startswith(f"{wid}.1 ") for line in lines(setup["links"])))
        manager_id, finance_id = f"{wid}.0", f"{wid}.1"

        # The policy is enforced on a sealed value exactly as on a clear one.
        with pytest.raises(PermissionDeniedError) as refused:
            bob.resolve(manager_id, {"ok": True, "by": SECRET})
        assert refused.value.reason == Reason.NOT_AN_APPROVER
        with pytest.raises(PermissionDeniedError) as refused:
            carol.resolve(finance_id, {"ok": True})  # four-eyes: carol started it
        assert refused.value.reason == Reason.NOT_AN_APPROVER
        alice.resolve(manager_id, {"ok": True, "by": SECRET})

        # The link: only its outcome, then once.
        token = next(
            line.split(" ", 1)[1] for line in lines(setup["links"]) if line.startswith(finance_id)
        )
        with pytest.raises(PermissionDeniedError) as refused:
            link_holder.reject(finance_id, {"why": SECRET}, settle_token=token)
        assert refused.value.reason == Reason.SETTLE_TOKEN_OUTCOME_NOT_ALLOWED
        link_holder.resolve(finance_id, {"ok": True, "ref": SECRET}, settle_token=token)

        result = handle.result(timeout=20)
        assert result == {
            "claim": {"amount": 900, "note": SECRET},
            "manager": {"ok": True, "by": SECRET},
            "finance": {"ok": True, "ref": SECRET},
        }
        manager = carol.get(manager_id)
        assert manager.settled_by == "alice"
        # The link the worker minted acts for the worker's principal (not carol: four-eyes).
        assert carol.get(finance_id).settled_by.startswith("vault-worker via settle-token k1:")
        # A client without the key reads the sealed bytes, not the decision.
        with Client(setup["server"].address, token=setup["tokens"]["carol"]) as plain:
            sealed = plain.get(manager_id)
            assert isinstance(plain.decode(sealed.value), bytes)
            assert sealed.value.content_type == CONTENT_TYPE

    rows = _rows(setup["db"], wid)
    assert len(rows) == 5  # root, 2 approvals, the settle-token step, the send_link step
    sealed_payloads = 0
    for promise_id, param_headers, param, value_headers, value in rows:
        for headers, data in ((param_headers, param), (value_headers, value)):
            assert SECRET.encode() not in data, promise_id
            assert token.encode() not in data, promise_id
            if data:  # every payload a client or worker wrote is sealed
                assert headers.get("content-type") == CONTENT_TYPE, (promise_id, headers)
                sealed_payloads += 1
    # root param and value, 2 decisions, the token step's value, the run step's value (a
    # step's arguments are recorded by digest only)
    assert sealed_payloads == 6, [(r[0], len(r[2]), len(r[4])) for r in rows]
    assert SECRET not in setup["server"].log()


def test_a_schema_cannot_check_a_sealed_value(setup: dict[str, Any]) -> None:
    promise_id = f"typed-{uuid.uuid4().hex[:8]}"
    with _client(setup, "alice") as alice:
        alice.create(promise_id, schema={"type": "object", "required": ["ok"]})
        with pytest.raises(InvalidArgumentError) as refused:
            alice.resolve(promise_id, {"ok": True})
        assert refused.value.field == "value"
        assert "must be JSON" in str(refused.value)
        assert "encrypted" in str(refused.value)
        assert alice.get(promise_id).state is PromiseState.PENDING
        # A rejection carries a reason, not a decision: no schema applies, it goes through.
        alice.reject(promise_id, {"why": "no schema on ciphertext"})
        assert alice.get(promise_id).state is PromiseState.REJECTED


def test_the_codec_reads_what_the_server_wrote_in_clear() -> None:
    codec = EncryptingCodec({"k1": KEY})
    server_written = Payload({"content-type": "application/json"}, b'{"reason":"workflow ended"}')
    assert codec.decode(server_written) == {"reason": "workflow ended"}
    assert codec.decode(Payload()) is None
    sealed = codec.encode({"a": 1})
    assert codec.decode(sealed) == {"a": 1}
    assert JsonCodec().decode(sealed) == sealed.data  # opaque to a codec without the key
    rotated = EncryptingCodec({"k2": EncryptingCodec.new_key(), "k1": KEY}, active="k2")
    assert rotated.decode(sealed) == {"a": 1}  # old values stay readable after a rotation
    assert rotated.encode(1).headers["troth-key-id"] == "k2"
    tampered = Payload(sealed.headers, sealed.data[:-1] + bytes([sealed.data[-1] ^ 1]))
    with pytest.raises(InvalidTag):
        codec.decode(tampered)


def _python_block_after(text: str, heading: str) -> str:
    section = text.split(heading, 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize(
    ("readme", "heading"),
    [
        ("docs/payload-privacy.md", "# Payload privacy and end-to-end encryption"),
        ("examples/encrypted_payloads/README.md", "# Encrypted payloads"),
    ],
)
def test_the_readme_snippets_run(readme: str, heading: str) -> None:
    root = Path(__file__).resolve().parents[2]
    snippet = _python_block_after((root / readme).read_text(encoding="utf-8"), heading)
    check = "\nassert client.decode(client.encode({'a': 1})) == {'a': 1}\nclient.close()\n"
    done = subprocess.run(
        [sys.executable, "-c", snippet + check],
        cwd=root / "examples" / "encrypted_payloads",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
