"""`troth` builds only the command group it is asked for: the command word is found as
argparse finds it (global flags and their values skipped, abbreviations too), and a
flag's value that happens to be a command word is no command."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from troth import Client, Payload, Promise, PromiseState
from troth._cli import build_parser, main
from troth._cli._main import command_word


@pytest.mark.parametrize(
    ("argv", "word"),
    [
        (["promises", "get", "x"], "promises"),
        (["--json", "--tls", "approvals", "list"], "approvals"),
        (["--server", "workers", "workflows", "list"], "workflows"),  # a value, not a command
        (["--server=a:1", "tasks", "list"], "tasks"),
        (["--prin", "worker", "promises", "get", "x"], "promises"),  # an abbreviation
        (["--timeout", "2s", "--token-file", "f", "worker", "m"], "worker"),
        (["-h"], None),
        (["--version"], None),
        ([], None),
        (["--", "promises"], None),
    ],
)
def test_the_command_word(argv: list[str], word: str | None) -> None:
    assert command_word(argv) == word


def test_only_the_named_group_is_built() -> None:
    parser = build_parser(["promises", "get", "x"])
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert list(commands) == ["promises"]
    every = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert {"promises", "workflows", "approvals", "export", "replay", "serve"} <= set(every)


def test_a_flag_value_that_is_a_command_word_stays_a_value(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[str | None] = []

    def get(self: Client, id: str) -> Promise:
        seen.append(self.principal)
        return Promise(
            id=id,
            state=PromiseState.PENDING,
            param=Payload(),
            value=Payload(),
            tags={},
            create_time=datetime(2030, 1, 1, tzinfo=UTC),
        )

    monkeypatch.setattr(Client, "get", get)
    assert main(["--principal", "worker", "promises", "get", "p"]) == 0
    assert main(["--prin", "workflows", "promises", "get", "p"]) == 0
    assert seen == ["worker", "workflows"]
    assert "id:         p\n" in capsys.readouterr().out
