"""Every code block of README.md, of each page of docs/ and of each examples/*/README.md,
run in order as a reader following the document runs them, against real servers and
workers.

How a block runs is decided by its language and its markers (tests/_snippets.py),
never by this file, so a new block is run without changing it. Per document:

- A scratch checkout: `.venv` (a link to the test's), a copy of `examples/`, and one
  terminal (tests/_snippet_session.py) in which every block is typed, from the
  checkout's root.
- While no block's own server runs, the server the README says to have running
  (`make run`: `troth serve --no-auth`, `./troth.db`) serves there.
- The one rewrite: every local port the document names (`127.0.0.1:7070`,
  `127.0.0.1:8000`, `--port 8000`) is a free port instead, in the blocks' text and as
  `TROTH_SERVER`/`TROTH_LISTEN` (the CLI's and `troth serve`'s 7070 default).
- A block that starts a server (`troth serve ... &`) stops the default one first;
  background commands (`&`, or a `background` block) run until their section ends.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from _snippet_session import SnippetFailed, Terminal, free_port
from _snippets import (
    Snippet,
    SnippetError,
    check_data,
    ports,
    shell_script,
    snippets,
    starts_server,
    substitute,
)
from _support import spawn, stop, wait_serving

from troth import Client

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DOCUMENTS = [
    ROOT / "README.md",
    *sorted(ROOT.glob("docs/*.md")),
    *sorted(ROOT.glob("examples/*/README.md")),
]
"""Each is a reader's session of its own: a page of docs/ never relies on another's blocks."""
DEFAULT_PORT = 7070

pytestmark = pytest.mark.e2e


class DefaultServer:
    """`make run`'s server, `troth serve --no-auth --listen ADDR` in the checkout."""

    def __init__(self, workdir: Path, address: str, env: dict[str, str]) -> None:
        self.workdir, self.address, self.env = workdir, address, env
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        # `troth serve` (a Python console script), guarded: it dies with the test run.
        troth = [sys.executable, str(BIN / "troth")]
        command = [*troth, "serve", "--no-auth", "--listen", self.address]
        with (self.workdir.parent / f"default-server-{self.starts}.log").open("wb") as log:
            self.proc = spawn(command, cwd=self.workdir, env=self.env, stdout=log, stderr=log)
        wait_serving(self.address, 60)

    def stop(self) -> None:
        if self.proc is not None:
            proc, self.proc = self.proc, None
            code = stop(proc, 30)  # SIGTERM; reaped, killed if it outlives the 30 s
            assert code == 0, f"the default server exited {code}"


def checkout(tmp: Path) -> Path:
    work = tmp / "checkout"
    work.mkdir()
    (work / ".venv").symlink_to(BIN.parent)
    shutil.copytree(
        ROOT / "examples",
        work / "examples",
        ignore=shutil.ignore_patterns("__pycache__", "*.db*", "*.token", "tokens.toml", "*.jsonl"),
    )
    return work


def scope(snippet: Snippet) -> tuple[tuple[int, str, int], ...]:
    return snippet.headings


def still_inside(opened: tuple[tuple[int, str, int], ...], now: Snippet) -> bool:
    """Whether `now` is still in the section where background commands were started."""
    return now.headings[: len(opened)] == opened


def human_in_the_loop_outcomes(work: Path, address: str) -> None:
    """What the example's README says its curl session leads to (curl exits 0 on any
    HTTP status, so the answers are checked here, against its server, still running)."""
    example = work / "examples" / "human_in_the_loop"
    token = (example / "gateway.token").read_text().strip()
    with Client(address, token=token) as client:
        results = {
            post: client.decode(client.get(f"publish-{post}").value)
            for post in ("post-7", "post-8", "post-bob", "post-9")
        }
    assert results["post-7"]["status"] == "approved", results
    assert results["post-7"]["approved_by"] == "alice", results
    assert results["post-8"]["status"] == "rejected", results
    assert results["post-bob"]["approved_by"] == "alice", results
    assert results["post-9"]["status"] == "timed_out", results
    sent = (example / "outbox.jsonl").read_text(encoding="utf-8").splitlines()
    assert sorted(json.loads(line)["post"] for line in sent) == sorted(results), sent


AFTERWARDS: dict[str, Callable[[Path, str], None]] = {
    "examples/human_in_the_loop/README.md": human_in_the_loop_outcomes,
}
"""Checks of what a document's commands led to, run at its end (before its background
commands stop), where exit statuses alone do not show it."""


def run_document(document: Path, tmp: Path) -> list[str]:
    """Run every block of `document`; return the skipped ones with their reasons."""
    blocks = snippets(document)
    unknown = [b.where for b in blocks if b.kind == "unknown" and b.skip is None]
    if unknown:
        raise SnippetError(
            f"blocks with no language the snippet test runs ({', '.join(unknown)}): give "
            "them one (python, sh, bash, toml, json; text for output) or a "
            "`<!-- snippet: skip REASON -->` marker"
        )
    mapping = {port: free_port() for port in ports(blocks)}
    mapping.setdefault(DEFAULT_PORT, free_port())
    address = f"127.0.0.1:{mapping[DEFAULT_PORT]}"
    work = checkout(tmp)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TROTH_")}
    env |= {
        "PATH": f"{BIN}:{env.get('PATH', '')}",
        "TROTH_SERVER": address,
        "TROTH_LISTEN": address,
        "PYTHONUNBUFFERED": "1",
    }
    server = DefaultServer(work, address, env)
    terminal = Terminal(work, env, tmp / "terminal")
    skipped: list[str] = []
    opened: tuple[tuple[int, str, int], ...] | None = None  # section of running jobs
    own_server = False
    try:
        for block in blocks:
            if opened is not None and not still_inside(opened, block):
                terminal.stop_jobs(f"{block.where} (end of section {opened[-1][1]!r})")
                opened, own_server = None, False
            if block.skip is not None:
                skipped.append(f"{block.where}: {block.skip}")
                continue
            if block.kind == "text":
                continue
            if block.kind == "data":
                check_data(block)
                continue
            starting = starts_server(block)
            if starting or own_server:
                server.stop()
            elif server.proc is None:
                server.start()
            code = substitute(block.code, mapping)
            if "cwd" in block.markers:
                terminal.run(block.where, f"pushd {block.markers['cwd']} > /dev/null\n")
            if block.kind == "python":
                output = terminal.python(
                    block.where, f"snippet-{block.line}.py", code, background=block.background
                )
            else:
                output = terminal.run(block.where, shell_script(block, code, mapping[DEFAULT_PORT]))
            missing = [text for text in block.expected if text not in output]
            if missing and not block.background:
                raise SnippetFailed(
                    f"{block.where}: it did not print {missing}; it printed:\n{output}"
                )
            if "cwd" in block.markers:
                terminal.run(block.where, "popd > /dev/null\n")
            if block.background or starting or "&" in code:
                opened = opened or scope(block)
                own_server = own_server or starting
        if afterwards := AFTERWARDS.get(str(document.relative_to(ROOT))):
            afterwards(work, address)
        terminal.stop_jobs(f"{document.name}: the end")
    finally:
        terminal.close()
        server.stop()
    return skipped


@pytest.mark.timeout(300)  # a document is a reader's session: servers, workers, a gateway
@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_snippet_runs_as_written(document: Path, tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is required by docs/tls.md")
    try:
        skipped = run_document(document, tmp_path)
    except SnippetFailed as failed:
        raise pytest.fail.Exception(str(failed), pytrace=False) from None
    print("\n".join(["skipped, with their reasons:", *skipped]))


def test_the_extractor_sees_every_block() -> None:
    """Each document's blocks are all found, and each has a language or a skip marker."""
    for document in DOCUMENTS:
        text = document.read_text(encoding="utf-8")
        fences = sum(1 for line in text.splitlines() if line.lstrip().startswith("```"))
        found = snippets(document)
        assert len(found) * 2 == fences, document
        assert all(b.kind != "unknown" or b.skip for b in found), [
            b.where for b in found if b.kind == "unknown" and not b.skip
        ]
        # Issue 12 item 6: every grpcurl line is run, none is exempt.
        assert not [b.where for b in found if b.skip and "grpcurl " in b.code]
    assert sum("grpcurl " in b.code for d in DOCUMENTS for b in snippets(d)) >= 3


def test_every_docs_page_is_run() -> None:
    """A page added to docs/ is run without changing this file (issue 28)."""
    pages = {p.name for p in DOCUMENTS if p.parent == ROOT / "docs"}
    assert pages == {p.name for p in (ROOT / "docs").glob("*.md")}
    assert {"workflows.md", "approvals.md", "authentication.md", "tls.md"} <= pages


def test_the_readmes_links_stay_inside_the_repository() -> None:
    """Relative links of the READMEs name files of this repository (issue 12: the
    contract was linked outside it)."""
    for document in [*DOCUMENTS, ROOT / "ARCHITECTURE.md"]:
        text = document.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            path = (document.parent / target).resolve()
            assert path.is_relative_to(ROOT) and path.exists(), (document.name, target)
