"""The writes wing's import contract names every other module of the server.

import-linter has no allow-list, so "writes imports only domain, store and clock" is
written as a list of every other top-level module of `troth_server`: a module added
later and not listed would be silently allowed. This test keeps the list whole.
"""

from __future__ import annotations

import pkgutil
import tomllib
from pathlib import Path

import troth_server

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = {"domain", "store", "clock", "writes"}
"""What the writer's wing may import (and itself)."""


def test_the_writes_contract_forbids_every_other_server_module() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = [
        c
        for c in config["tool"]["importlinter"]["contracts"]
        if c.get("source_modules") == ["troth_server.writes"]
    ]
    forbidden = {name.removeprefix("troth_server.") for name in contract["forbidden_modules"]}
    modules = {m.name for m in pkgutil.iter_modules(troth_server.__path__)}
    assert modules - ALLOWED == forbidden, (
        "add the new module to the contract's forbidden_modules in pyproject.toml, or "
        f"remove a module that is gone: missing {sorted(modules - ALLOWED - forbidden)}, "
        f"stale {sorted(forbidden - (modules - ALLOWED))}"
    )
