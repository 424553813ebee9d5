"""`troth promises get` imports only what reading one promise needs: each command group
is imported when named, and `import troth` loads its names when first used. Not timed:
it names the modules that made a call take 0.6-2.5 s on a busy machine."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
from _support import ServerProcess, start_server

from troth import Client

HEAVY = (
    # the worker, its replay engine and its loops: a client reading a promise runs none
    "troth.worker",
    "troth._engine",
    "troth._history",
    "troth._runner",
    "troth._commands",
    "troth.context",
    "troth.testing",
    # the other command groups
    "troth._cli.approvals",
    "troth._cli.replay",
    "troth._cli.workflows",
    "troth._cli.worker",
    "troth._cli.tasks",
    # optional or server-side libraries
    "opentelemetry",
    "jsonschema",
    "troth_server",
    "sqlalchemy",
)

_PROBE = """
import json, sys
from troth._cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = start_server(tmp_path_factory.mktemp("cli-imports"))
    yield proc
    assert proc.stop() == 0, proc.log()[-3000:]


def _modules_after(*argv: str) -> tuple[int, str, list[str]]:
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, timeout=60
    )
    report = json.loads(result.stderr.strip().splitlines()[-1])
    return report["code"], result.stdout, report["modules"]


def _heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)]


def test_promises_get_imports_only_what_it_needs(server: ServerProcess) -> None:
    with Client(server.address) as client:
        client.create("imports-1", {"n": 1})
    code, out, modules = _modules_after("--server", server.address, "promises", "get", "imports-1")
    assert code == 0
    assert "id:         imports-1\n" in out  # the command ran, all the way
    assert _heavy(modules) == []


def test_the_help_still_lists_every_group() -> None:
    # The whole command line is built when no command is named (the slow path, on purpose).
    code, out, modules = _modules_after("--help")
    assert code == 0
    for word in ("promises", "approvals", "workflows", "tasks", "workers", "worker", "replay"):
        assert f"    {word} " in out
    assert "troth._cli.approvals" in modules
