"""Test support for `troth console`: a real console process on a free port."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
from _support import START_SECONDS, reap, spawn, stop

if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

    from _support import ServerProcess


@dataclass
class ConsoleProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def http(self) -> httpx.Client:
        """A browser-like HTTP client: keeps cookies, does not follow redirects."""
        return httpx.Client(base_url=self.url, follow_redirects=False, timeout=30)

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM and wait (killed, and TimeoutError, after `timeout`); reaped."""
        return stop(self.proc, timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_console(workdir: Path, server: str, *args: str) -> ConsoleProcess:
    """`troth console --listen 127.0.0.1:0 --server SERVER`; returns once it answers."""
    workdir.mkdir(parents=True, exist_ok=True)
    port_file = workdir / f"console-port-{time.monotonic_ns()}"
    log_path = workdir / f"console-{time.monotonic_ns()}.log"
    command = [
        sys.executable, "-m", "troth_server", "console", "--listen", "127.0.0.1:0",
        "--server", server, "--port-file", str(port_file), *args,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "TROTH_TOKEN"}
    with log_path.open("wb") as log_file:  # guarded: it dies with the test run
        proc = spawn(command, stdout=log_file, stderr=log_file, env=env)
    deadline = time.monotonic() + START_SECONDS
    while not port_file.exists() or not port_file.read_text():
        if proc.poll() is not None:
            reap(proc)
            raise RuntimeError(f"console exited with {proc.returncode}:\n{log_path.read_text()}")
        if time.monotonic() > deadline:
            reap(proc, grace=5)
            raise RuntimeError(f"console did not start:\n{log_path.read_text()}")
        time.sleep(0.02)
    console = ConsoleProcess(proc, int(port_file.read_text()), log_path)
    while True:
        try:
            if httpx.get(f"{console.url}/healthz", timeout=5).status_code == 200:
                return console
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            console.stop()
            raise RuntimeError(f"console did not answer:\n{console.log()}")
        time.sleep(0.05)


def started_line(server: ServerProcess) -> dict[str, Any]:
    """The server's `server.started` log line, parsed (written before its port file)."""
    for line in server.log().splitlines():
        entry = json.loads(line)
        if entry["event"] == "server.started":
            return dict(entry)
    raise AssertionError(f"no server.started line:\n{server.log()}")


def hosted_console_url(server: ServerProcess) -> str:
    """The URL of the console a `troth serve --console-listen` process serves, no slash."""
    return str(started_line(server)["console"]).rstrip("/")
