"""Packaging: PostgreSQL is the `postgres` extra of troth-server, and an install without
it serves SQLite and says what to install when given a postgresql:// URL.

The install without psycopg is played by a real `troth serve` subprocess in which the
import of psycopg fails (`sys.modules["psycopg"] = None`, what Python does for a missing
package), as `test_serve_without_the_server_package` plays an SDK-only install."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING

from _support import wait_serving

from troth import Client

if TYPE_CHECKING:
    from collections.abc import Sequence

ROOT = Path(__file__).resolve().parents[2]

# `troth serve|db ...` as troth_server's entry point runs it, with psycopg missing; on
# exit, it prints whether anything imported psycopg after all.
_WITHOUT_PSYCOPG = """
import sys
sys.modules["psycopg"] = None
from troth_server.__main__ import main
try:
    status = main(sys.argv[1:])
finally:
    print("psycopg imported:", any(n.startswith("psycopg.") for n in sys.modules), file=sys.stderr)
raise SystemExit(status)
"""


def _without_psycopg(args: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-c", _WITHOUT_PSYCOPG, *args], stdout=out, stderr=subprocess.STDOUT
        )


def test_psycopg_is_the_postgres_extra_only() -> None:
    project = tomllib.loads((ROOT / "server" / "pyproject.toml").read_text())["project"]
    assert not any(dep.startswith("psycopg") for dep in project["dependencies"])
    assert [d for d in project["optional-dependencies"]["postgres"] if d.startswith("psycopg")]
    # The development install (and so the test suite) has PostgreSQL support.
    extras = re.findall(r"-e '\./server\[([a-z,]+)\]'", (ROOT / "Makefile").read_text())
    assert any("postgres" in found.split(",") for found in extras), extras


def test_sqlite_serves_without_psycopg(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    log = tmp_path / "server.log"
    proc = _without_psycopg(
        ["serve", "--no-auth", "--listen", "127.0.0.1:0", "--port-file", str(port_file),
         "--db", f"sqlite:///{tmp_path / 'troth.db'}"],
        log,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.02)
        address = f"127.0.0.1:{int(port_file.read_text())}"
        wait_serving(address, deadline - time.monotonic())
        with Client(address) as client:
            client.create("packaging-sqlite-1")
            assert client.get("packaging-sqlite-1").id == "packaging-sqlite-1"
    finally:
        proc.terminate()
        proc.wait(30)
    assert "psycopg imported: False" in log.read_text()


def test_a_postgresql_url_without_psycopg_names_the_extra(tmp_path: Path) -> None:
    url = "postgresql://troth@127.0.0.1:5432/troth"
    for args in (
        ["serve", "--no-auth", "--listen", "127.0.0.1:0", "--db", url],
        ["db", "current", "--db", url],
        ["db", "upgrade", "--db", url],
    ):
        log = tmp_path / f"{args[0]}-{args[1]}.log"
        proc = _without_psycopg(args, log)
        assert proc.wait(60) == 1, log.read_text()
        text = log.read_text()
        assert "PostgreSQL support is not installed" in text, text
        assert "install troth-server[postgres]" in text, text
        assert "pip install './server[postgres]'" in text, text
