"""`troth worker MODULE[:ATTR]` finds the worker to run (no server: nothing connects),
and `Worker.run()` shows troth's log lines only when the program configured none."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from troth import Client
from troth._cli import main
from troth._cli.worker import find_worker
from troth._foreground import show_logs
from troth._modules import UsageError

MODULE = """
from troth import Client, Worker

def build_worker(client, group="made"):
    worker = Worker(client, group)
    worker.workflow(hello)
    return worker

def hello(ctx, name):
    return (yield ctx.run(str.upper, name))

def not_a_factory(client):
    return "no worker"
"""


@pytest.fixture
def client() -> Iterator[Client]:
    with Client("127.0.0.1:1") as c:
        yield c


def _module(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    return str(path)


def test_a_factory_gets_the_clis_client_and_group(tmp_path: Path, client: Client) -> None:
    spec = _module(tmp_path, "factory_mod", MODULE)
    worker = find_worker(client, spec, group="g1")  # no ATTR: build_worker
    assert (worker.client, worker.group, sorted(worker.workflows)) == (client, "g1", ["hello"])
    assert find_worker(client, f"{spec}:build_worker").group == "made"


def test_a_worker_instance_runs_as_it_is(tmp_path: Path, client: Client) -> None:
    spec = _module(
        tmp_path,
        "instance_mod",
        "from troth import Client, Worker\nworker = Worker(Client('127.0.0.1:1'), 'mine')\n",
    )
    worker = find_worker(client, spec)
    assert worker.group == "mine" and worker.client is not client
    assert find_worker(client, f"{spec}:worker", group="mine") is worker
    with pytest.raises(UsageError, match="is a Worker of group 'mine'; --group other applies"):
        find_worker(client, spec, group="other")


@pytest.mark.parametrize(
    ("text", "attr", "message"),
    [
        (MODULE, "not_a_factory", "the factory returned str, not a troth.Worker"),
        (MODULE, "missing", "has no 'missing'"),
        ("X = 3\n", "X", r"X \(of type int\) is not a Worker nor a factory"),
        ("X = 3\n", None, "defines no Worker at top level and no build_worker"),
        (
            "from troth import Client, Worker\nc = Client('127.0.0.1:1')\n"
            "a = Worker(c, 'a')\nb = Worker(c, 'b')\n",
            None,
            r"several Workers \(a, b\); name one",
        ),
    ],
)
def test_what_cannot_be_run_is_said(
    tmp_path: Path, client: Client, text: str, attr: str | None, message: str
) -> None:
    spec = _module(tmp_path, f"bad_{abs(hash((text, attr)))}", text)
    with pytest.raises(UsageError, match=message):
        find_worker(client, spec if attr is None else f"{spec}:{attr}")


def test_the_command_exits_2_naming_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["worker", str(tmp_path / "nowhere.py")]) == 2
    assert "troth worker: error: no such file:" in capsys.readouterr().err


def test_show_logs_only_when_nothing_is_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    root, troth_logger = logging.getLogger(), logging.getLogger("troth")
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(troth_logger, "handlers", [])
    monkeypatch.setattr(troth_logger, "level", logging.NOTSET)
    show_logs()
    assert len(troth_logger.handlers) == 1 and troth_logger.level == logging.INFO
    show_logs()  # once only
    assert len(troth_logger.handlers) == 1

    monkeypatch.setattr(troth_logger, "handlers", [])
    monkeypatch.setattr(root, "handlers", [logging.NullHandler()])  # the program's own
    show_logs()
    assert troth_logger.handlers == []
