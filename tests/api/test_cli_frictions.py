"""The `troth` command's own words for two refusals (issue 28): a server that wants a
token names the CLI's ways to give one (--token-file, TROTH_TOKEN_FILE, TROTH_TOKEN),
not gRPC metadata; settling an id nothing created yet names --create-if-missing."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from _auth import Grant, write_token_file
from _support import run_cli as troth
from _support import start_server

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from _support import ServerProcess


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    """A server with token-file authentication; the path of an operator's token."""
    workdir = tmp_path_factory.mktemp("cli-frictions")
    tokens = write_token_file(workdir / "tokens.toml", [Grant("ops", ("operator", "gateway"))])
    token_file = workdir / "ops.token"
    token_file.write_text(tokens["ops"])
    server = start_server(workdir, "--auth-tokens", str(workdir / "tokens.toml"))
    yield server, token_file
    assert server.stop() == 0, server.log()[-3000:]


@pytest.fixture(autouse=True)
def no_token_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TROTH_TOKEN", "TROTH_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)


def test_without_a_token_the_cli_says_how_to_give_one(
    secured: tuple[ServerProcess, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    server, _ = secured
    code, out, err = troth(server, capsys, "promises", "get", "p-1")
    assert code == 1 and out == ""
    assert err == (
        "troth: error: not authenticated: this server wants a bearer token and none was "
        "sent: pass --token-file FILE, or set TROTH_TOKEN_FILE to the file or TROTH_TOKEN "
        "to the token (an admin mints one with `troth tokens new`) [CREDENTIALS_MISSING]\n"
    )
    assert "metadata" not in err


def test_a_refused_token_names_where_it_came_from(
    secured: tuple[ServerProcess, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    server, _ = secured
    bad = tmp_path / "bad.token"
    bad.write_text("not-a-token")
    code, _, err = troth(server, capsys, "--token-file", str(bad), "promises", "get", "p-1")
    assert code == 1
    assert err.startswith("troth: error: not authenticated: ")
    assert err.endswith(
        f"[CREDENTIALS_MALFORMED]; the token sent was the one in {bad} (--token-file or "
        "TROTH_TOKEN_FILE): check it, or ask an admin for a new one (`troth tokens new`)\n"
    )
    monkeypatch.setenv("TROTH_TOKEN", "not-a-token-either")
    code, _, err = troth(server, capsys, "promises", "get", "p-1")
    assert code == 1
    assert "; the token sent was the one in TROTH_TOKEN: check it" in err


def test_with_its_token_the_cli_works(
    secured: tuple[ServerProcess, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    server, token_file = secured
    code, _out, err = troth(
        server, capsys, "--token-file", str(token_file), "promises", "create", "p-ok"
    )
    assert (code, err) == (0, "")


@pytest.mark.parametrize("verb", ["resolve", "reject"])
def test_settling_an_unknown_id_names_create_if_missing(
    secured: tuple[ServerProcess, Path], capsys: pytest.CaptureFixture[str], verb: str
) -> None:
    server, token_file = secured
    token = ("--token-file", str(token_file))
    code, out, err = troth(server, capsys, *token, "promises", verb, f"early-{verb}")
    assert code == 1 and out == ""
    [line] = err.splitlines()
    # One line: what is wrong, and the flag (and the SDK's argument) that settles early.
    assert line.startswith(f"troth: error: not found: promise 'early-{verb}' does not exist")
    assert line.endswith("[NOT_FOUND]")
    assert "--create-if-missing" in line and "create_if_missing=True" in line
    code, out, err = troth(
        server, capsys, *token, "promises", verb, f"early-{verb}", "--create-if-missing"
    )
    assert (code, err) == (0, "")
    # `get` of an unknown id is not a settle: no such hint.
    code, _, err = troth(server, capsys, *token, "promises", "get", "nobody")
    assert code == 1 and "--create-if-missing" not in err
