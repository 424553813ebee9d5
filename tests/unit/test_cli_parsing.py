"""The `troth` command line without a server: parsing, errors, output formats, `serve`."""

from __future__ import annotations

import argparse
import json
import sys
import types
from datetime import UTC, datetime, timedelta

import grpc
import pytest

from troth import Client, NotFoundError, Payload, Promise, PromiseState
from troth._cli import main
from troth._cli.args import parse_duration, parse_json, parse_state, parse_tag
from troth._cli.output import format_block, format_table, payload_preview, promise_to_json

T0 = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
JSON = {"content-type": "application/json"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("5m", timedelta(minutes=5)),
        ("2h", timedelta(hours=2)),
        ("3d", timedelta(days=3)),
        ("250ms", timedelta(milliseconds=250)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1.5h", timedelta(minutes=90)),
        (" 2H ", timedelta(hours=2)),
    ],
)
def test_durations(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "30", "s", "5x", "-5m", "5 m", "1h-30m", "0s"])
def test_bad_durations_say_how_to_write_one(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"invalid duration"):
        parse_duration(text)


def test_bad_ttl_exits_2_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["promises", "create", "a", "--ttl", "5x"]) == 2
    err = capsys.readouterr().err
    assert "argument --ttl: invalid duration '5x'" in err
    assert "30s, 5m, 2h, 3d" in err


def test_json_values() -> None:
    assert parse_json('{"ok": true}') == {"ok": True}
    assert parse_json('"text"') == "text"
    assert parse_json("null") is None


@pytest.mark.parametrize("flag", ["--value"])
@pytest.mark.parametrize("command", ["resolve", "reject", "cancel"])
def test_invalid_json_value_exits_2_naming_the_flag(
    command: str, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["promises", command, "p", flag, "{ok: true}"]) == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: invalid JSON '{{ok: true}}'" in err
    assert "Traceback" not in err


def test_invalid_json_param_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["promises", "create", "p", "--param", "approved"]) == 2
    err = capsys.readouterr().err
    assert "argument --param: invalid JSON 'approved'" in err
    assert "'\"text\"'" in err  # shows how to pass a string


def test_tags_and_states() -> None:
    assert parse_tag("team=billing") == ("team", "billing")
    assert parse_tag("k=a=b") == ("k", "a=b")
    assert parse_tag("k=") == ("k", "")
    for bad in ("k", "=v"):
        with pytest.raises(argparse.ArgumentTypeError, match="key=value"):
            parse_tag(bad)
    assert parse_state("resolved") is PromiseState.RESOLVED
    with pytest.raises(argparse.ArgumentTypeError, match="REJECTED_TIMEDOUT"):
        parse_state("done")


def test_ttl_and_never_expires_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["promises", "create", "a", "--ttl", "5m", "--never-expires"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_missing_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["promises"]) == 2
    assert main(["--help"]) == 0
    assert "promises" in capsys.readouterr().out


def test_server_error_is_one_line_on_stderr_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def get(self: Client, id: str) -> Promise:
        raise NotFoundError(
            grpc.StatusCode.NOT_FOUND, "NOT_FOUND", f"promise {id!r} does not exist"
        )

    monkeypatch.setattr(Client, "get", get)
    assert main(["promises", "get", "nope"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "troth: error: not found: promise 'nope' does not exist [NOT_FOUND]\n"


def test_global_options_work_before_and_after_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str | None, float]] = []

    def get(self: Client, id: str) -> Promise:
        seen.append((self.address, self.principal, self._timeout))
        return promise()

    monkeypatch.setattr(Client, "get", get)
    monkeypatch.setenv("TROTH_SERVER", "envhost:1")
    monkeypatch.delenv("TROTH_PRINCIPAL", raising=False)
    assert main(["promises", "get", "p", "--json"]) == 0
    assert (
        main(["--server", "a:1", "promises", "get", "p", "--principal", "ann", "--timeout", "2s"])
        == 0
    )
    assert main(["promises", "get", "p", "--server", "b:2"]) == 0
    assert seen == [("envhost:1", None, 10.0), ("a:1", "ann", 2.0), ("b:2", None, 10.0)]


@pytest.mark.parametrize(
    "argv", [["serve", "--listen", "127.0.0.1:0"], ["db", "upgrade"], ["--json", "db", "current"]]
)
def test_serve_without_the_server_package(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "troth_server", None)
    monkeypatch.delitem(sys.modules, "troth_server.cli", raising=False)
    command = next(arg for arg in argv if not arg.startswith("-"))
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"troth {command} needs the server, troth-server, which is not installed")
    # The command that works: troth-server installs from the checkout, beside the SDK.
    assert "pip install ./server from a troth checkout" in err
    assert "./server[postgres] for PostgreSQL" in err


def test_db_forwards_the_rest_of_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    received: list[list[str]] = []

    def db(argv: list[str]) -> int:
        received.append(argv)
        return 4

    fake = types.ModuleType("troth_server.cli")
    fake.db = db  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "troth_server.cli", fake)
    assert main(["db", "upgrade", "--db", "sqlite:///x.db"]) == 4
    assert received == [["upgrade", "--db", "sqlite:///x.db"]]


def test_serve_forwards_the_rest_of_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    received: list[list[str]] = []

    def serve(argv: list[str]) -> int:
        received.append(argv)
        return 3

    fake = types.ModuleType("troth_server.cli")
    fake.serve = serve  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "troth_server.cli", fake)
    assert main(["serve", "--listen", "0.0.0.0:9", "--db", "sqlite:///x.db"]) == 3
    assert main(["serve", "--help"]) == 3
    assert received == [["--listen", "0.0.0.0:9", "--db", "sqlite:///x.db"], ["--help"]]


# --- output -----------------------------------------------------------------


def promise(**overrides: object) -> Promise:
    fields: dict[str, object] = {
        "id": "approval-7",
        "state": PromiseState.RESOLVED,
        "param": Payload(JSON, b'{"post": 7}'),
        "value": Payload(JSON, b'{"approved":true}'),
        "tags": {"team": "x"},
        "create_time": T0,
        "settle_time": T0 + timedelta(minutes=1),
        "expire_time": T0 + timedelta(days=3),
        "settled_by": "alice",
        "idempotency_key_for_settle": "k1",
    }
    fields.update(overrides)
    return Promise(**fields)  # type: ignore[arg-type]


def test_json_output_decodes_json_and_marks_bytes() -> None:
    obj = promise_to_json(
        promise(
            param=Payload({"content-type": "application/octet-stream"}, b"\x00\x01"),
            value=Payload(),
        )
    )
    assert obj["param"] == {
        "$base64": "AAE=",
        "headers": {"content-type": "application/octet-stream"},
    }
    assert obj["value"] is None
    assert obj["create_time"] == "2030-01-02T03:04:05.000Z"
    assert obj["state"] == "RESOLVED"
    json.dumps(obj)  # serialisable as is


def test_json_output_of_a_get(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(Client, "get", lambda self, id: promise())
    assert main(["--json", "promises", "get", "approval-7"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["value"] == {"approved": True}
    assert obj["param"] == {"post": 7}
    assert obj["expire_time"] == "2030-01-05T03:04:05.000Z"


def test_block_and_table_are_readable() -> None:
    block = format_block(promise(expire_time=None))
    assert "state:      RESOLVED\n" in block
    assert 'value:      {"approved":true}\n' in block
    assert "expires:    never\n" in block
    assert "settled by: alice\n" in block
    table = format_table([promise(), promise(id="b", state=PromiseState.PENDING, value=Payload())])
    header, first, second = table.splitlines()
    assert header.split() == ["ID", "STATE", "CREATED", "EXPIRES", "SETTLED", "VALUE"]
    assert first.index("RESOLVED") == second.index("PENDING") == header.index("STATE")
    assert first.endswith('{"approved":true}')
    assert second.endswith("-")


def test_value_preview_is_cut() -> None:
    long = Payload(JSON, json.dumps({"text": "x" * 100}).encode())
    assert len(payload_preview(long)) == 40
    assert payload_preview(long).endswith("…")
    assert payload_preview(Payload({}, b"abc")) == "<3 bytes, no content-type>"


def test_version_names_the_sdk_and_the_server(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib import metadata

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"troth {metadata.version('troth')}",
        f"troth-server {metadata.version('troth-server')}",
    ]


def test_version_without_the_server_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from importlib import metadata

    installed = metadata.version

    def sdk_only(dist: str) -> str:
        if dist == "troth-server":
            raise metadata.PackageNotFoundError(dist)
        return installed(dist)

    monkeypatch.setattr(metadata, "version", sdk_only)
    assert main(["--version"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"troth {installed('troth')}",
        "troth-server not installed (pip install troth-server)",
    ]
