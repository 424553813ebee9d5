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


FRONT_DOOR_MAX_LINES = 250
"""Issue 28: the README is a front door (what troth is, the two commands, one workflow
to a human's approval, where to read on); everything else lives in docs/."""

ANCHORED_LINK = re.compile(r"\]\((?P<target>[^)\s#]*)(?:#(?P<anchor>[^)\s]*))?\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor in `page` (outside code blocks; repeats numbered as GitHub
    numbers them)."""
    found: set[str] = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"#{1,6} +(.+?) *#*$", line)):
            name, n = slug(heading.group(1)), 0
            while (numbered := name if n == 0 else f"{name}-{n}") in found:
                n += 1
            found.add(numbered)
    return found


def test_the_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= FRONT_DOOR_MAX_LINES, (
        f"README.md has {len(lines)} lines; keep it at most {FRONT_DOOR_MAX_LINES} "
        "and move the details to a page of docs/"
    )


def test_the_readme_lists_every_docs_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name != "README.md":
            assert f"](docs/{page.name})" in readme, f"README.md does not link {page.name}"
            assert f"]({page.name})" in index, f"docs/README.md does not list {page.name}"


@pytest.mark.parametrize(
    "name",
    [
        "README.md",
        "ARCHITECTURE.md",
        *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")),
        *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("examples/*/README.md")),
    ],
)
def test_every_relative_link_and_anchor_resolves(name: str) -> None:
    """Each relative link of the README and the docs names a file of the repository and,
    with `#anchor`, a heading of that file."""
    doc = ROOT / name
    for match in ANCHORED_LINK.finditer(doc.read_text(encoding="utf-8")):
        target, anchor = match["target"], match["anchor"]
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        resolved = (doc.parent / target).resolve() if target else doc
        assert resolved.is_relative_to(ROOT), f"{name} links outside the repository: {target}"
        assert resolved.exists(), f"{name} links to a missing file: {target}"
        if anchor and resolved.suffix == ".md":
            assert anchor in anchors(resolved), (
                f"{name} links to #{anchor} in {resolved.relative_to(ROOT)}, which has no "
                f"such heading"
            )
