"""The documents beside the READMEs (whose links tests/e2e/test_snippets.py checks) link
to files inside the repository, and every such link resolves; the module map covers the
server too and points at the contract."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
DOCS = ["ARCHITECTURE.md", "DESIGN.md", "CHANGELOG.md"]


@pytest.mark.parametrize("name", DOCS)
def test_relative_links_resolve_inside_the_repository(name: str) -> None:
    doc = ROOT / name
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        resolved = (doc.parent / target).resolve()
        assert resolved.is_relative_to(ROOT), f"{name} links outside the repository: {target}"
        assert resolved.exists(), f"{name} links to a missing file: {target}"


def test_the_module_map_links_the_contract_and_maps_the_server() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "](DESIGN.md)" in readme and "](ARCHITECTURE.md)" in readme
    architecture = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    assert "](DESIGN.md)" in architecture
    assert "## The server (`server/troth_server`)" in architecture
