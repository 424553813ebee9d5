"""The documents link to files inside the repository, and every such link resolves: the
design contract is `docs/DESIGN.md`, not a path outside the checkout."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
DOCS = ["README.md", "ARCHITECTURE.md", "docs/DESIGN.md", "CHANGELOG.md"]


@pytest.mark.parametrize("name", DOCS)
def test_relative_links_resolve_inside_the_repository(name: str) -> None:
    doc = ROOT / name
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        resolved = (doc.parent / target).resolve()
        assert resolved.is_relative_to(ROOT), f"{name} links outside the repository: {target}"
        assert resolved.exists(), f"{name} links to a missing file: {target}"


def test_the_readme_links_the_contract_and_the_module_map() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "](docs/DESIGN.md)" in readme and "](ARCHITECTURE.md)" in readme
    architecture = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    assert "](docs/DESIGN.md)" in architecture
    assert "## The server (`server/troth_server`)" in architecture
