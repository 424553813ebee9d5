"""Install the peers `bench/peers/run.py` compares troth with, each in its own folder.

Nothing goes into the project's environment or dependencies: every peer lives
under ``bench/.cache/peers/`` (git-ignored), at a pinned version, and is
installed once (a folder is reused when its marker file names the same pins).

- ``restate/``: the Restate server binary, from the npm package
  ``@restatedev/restate-server``;
- ``restate-venv/``: Restate's Python SDK served by hypercorn (h2c); the load
  client is the benchmark's own (stdlib `http.client`);
- ``dbos-venv/``: DBOS Transact, with psycopg for its PostgreSQL variant.

Usage::

    .venv/bin/python bench/peers/_install.py        # install what is missing
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import venv
from pathlib import Path

CACHE = Path(__file__).resolve().parent.parent / ".cache" / "peers"

RESTATE_SERVER_VERSION = "1.7.12"
RESTATE_PIP = ("restate-sdk==1.3.0", "hypercorn==0.18.0")
DBOS_PIP = ("dbos==3.4.0", "psycopg[binary]==3.3.9")


class InstallError(RuntimeError):
    """A peer could not be installed; the message says which and why."""


def _run(what: str, argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-12:]
        raise InstallError(
            f"{what}: `{' '.join(argv)}` exited {done.returncode}:\n" + "\n".join(tail)
        )


def _marked(folder: Path, pins: object) -> bool:
    marker = folder / ".troth-bench-pins"
    return marker.is_file() and marker.read_text() == json.dumps(pins)


def _mark(folder: Path, pins: object) -> None:
    (folder / ".troth-bench-pins").write_text(json.dumps(pins))


def restate_server() -> Path:
    folder = CACHE / "restate"
    binary = folder / "node_modules/@restatedev/restate-server-linux-x64/bin/restate-server"
    if _marked(folder, RESTATE_SERVER_VERSION) and binary.is_file():
        return binary
    if shutil.which("npm") is None:
        raise InstallError("restate: npm is not installed (Debian: apt-get install npm)")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    _run(
        "restate",
        [
            "npm",
            "install",
            "--prefix",
            str(folder),
            "--no-audit",
            "--no-fund",
            f"@restatedev/restate-server@{RESTATE_SERVER_VERSION}",
        ],
    )
    if not binary.is_file():
        raise InstallError(
            f"restate: npm installed no binary at {binary} (only linux-x64 is known)"
        )
    _mark(folder, RESTATE_SERVER_VERSION)
    return binary


def python_env(name: str, pins: tuple[str, ...]) -> Path:
    folder = CACHE / name
    python = folder / "bin" / "python"
    if _marked(folder, pins) and python.is_file():
        return python
    shutil.rmtree(folder, ignore_errors=True)
    venv.EnvBuilder(with_pip=True).create(folder)
    _run(name, [str(python), "-m", "pip", "install", "--quiet", *pins])
    _mark(folder, pins)
    return python


NEEDS = {
    "restate": ("restate_server", "restate_python"),
    "dbos": ("dbos_python",),
    "dbos-pg": ("dbos_python",),
}
"""What each peer system needs installed (troth needs nothing: it is the project)."""


def install_each(systems: tuple[str, ...] = tuple(NEEDS)) -> tuple[dict[str, Path], dict[str, str]]:
    """What `systems` need, installed: the paths by part, and what failed, with its
    error (one part failing to install does not stop the others)."""
    parts = {
        "restate_server": restate_server,
        "restate_python": lambda: python_env("restate-venv", RESTATE_PIP),
        "dbos_python": lambda: python_env("dbos-venv", DBOS_PIP),
    }
    wanted = {part for system in systems for part in NEEDS.get(system, ())}
    done: dict[str, Path] = {}
    failed: dict[str, str] = {}
    for name, part in parts.items():
        if name not in wanted:
            continue
        CACHE.mkdir(parents=True, exist_ok=True)
        try:
            done[name] = part()
        except (InstallError, OSError) as exc:
            failed[name] = str(exc)
    return done, failed


if __name__ == "__main__":
    ok, errors = install_each()
    for name, path in ok.items():
        print(f"{name}: {path}")
    for name, error in errors.items():
        print(f"{name}: FAILED: {error}", file=sys.stderr)
    sys.exit(1 if errors else 0)
