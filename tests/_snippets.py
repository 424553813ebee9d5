"""The code blocks of a Markdown file, as a reader following it top to bottom meets them.

Pure (no processes): `tests/e2e/test_snippets.py` runs what this finds. Every fenced
block is one `Snippet`, with the `<!-- snippet: ... -->` markers written on the lines
just above it and the headings it sits under:

- `<!-- snippet: skip REASON -->`: not run (an install command, a server that runs
  until Ctrl-C, a machine the test does not have); the reason is required.
- `<!-- snippet: background -->`: a shell block whose every command runs in a
  terminal of its own (a server, a worker, a gateway), started in order and left
  running until its section ends; a Python block run in the background likewise.
- `<!-- snippet: cwd DIR -->`: run from DIR (relative to where the reader stands).

A block's language decides how it runs: `python` (a script of its own, run with
`python` from the current directory), `sh`/`bash`/`console` (typed into one terminal
that lasts the whole document: `cd`, `export` and background jobs carry over),
`toml`/`json` (data: parsed), `text` (output shown: not run). Any other block, or one
without a language, is an error, so nothing in a README goes unchecked by accident.

In any block, a comment `#=> TEXT` says what the block prints: its output must
contain TEXT. Inside shell blocks, two conventions of the READMEs are understood: a command whose
comment says `(exit N)` must exit with N, and a command followed by shown output
lines `#   troth: error: TEXT ...` must fail with TEXT (up to the first `...`).
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

PYTHON = frozenset({"python", "py"})
SHELL = frozenset({"sh", "bash", "shell", "console"})
DATA = frozenset({"toml", "json"})
TEXT = frozenset({"text"})

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<info>.*)$")
_HEADING = re.compile(r"^(?P<hashes>#{1,6}) +(?P<title>.+?) *#*$")
_MARKER = re.compile(r"^ *<!-- *snippet: *(?P<kind>[a-z-]+)(?: +(?P<arg>.*?))? *--> *$")
_OTHER_COMMENT = re.compile(r"^ *<!--.*--> *$")
_ADDRESS = re.compile(r"\b(?:127\.0\.0\.1|localhost):(?P<port>\d{2,5})\b")
_EXIT_NOTE = re.compile(r"\(exit (?P<code>\d+)\)")
_PRINTS = re.compile(r"#=> (?P<text>.+?) *$", re.MULTILINE)
_LISTEN = re.compile(r"--listen[ =](?:\S+:)?(?P<port>\d+)\b|--port[ =](?P<port2>\d+)\b")
KINDS = ("skip", "background", "cwd")


class SnippetError(ValueError):
    """A README block the extractor cannot run and no marker explains."""


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int  # the opening fence, 1-based
    lang: str
    code: str
    markers: dict[str, str]
    headings: tuple[tuple[int, str, int], ...]  # (level, title, line), outermost first

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"

    @property
    def skip(self) -> str | None:
        return self.markers.get("skip")

    @property
    def background(self) -> bool:
        return "background" in self.markers

    @property
    def expected(self) -> list[str]:
        """What the block must print: the text after each `#=> ` comment in it."""
        return [m["text"] for m in _PRINTS.finditer(self.code)]

    @property
    def kind(self) -> str:
        for name, langs in (("python", PYTHON), ("shell", SHELL), ("data", DATA), ("text", TEXT)):
            if self.lang in langs:
                return name
        return "unknown"


def snippets(path: Path) -> list[Snippet]:
    """Every fenced block of `path`, in order; refuses a marker it does not know, a skip
    without a reason, and an unclosed fence."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Snippet] = []
    headings: list[tuple[int, str, int]] = []
    markers: dict[str, str] = {}
    i = 0
    while i < len(lines):
        text = lines[i]
        if heading := _HEADING.match(text):
            level = len(heading["hashes"])
            headings = [h for h in headings if h[0] < level] + [(level, heading["title"], i + 1)]
            markers = {}
        elif marker := _MARKER.match(text):
            kind, arg = marker["kind"], (marker["arg"] or "").strip()
            if kind not in KINDS:
                raise SnippetError(f"{path.name}:{i + 1}: unknown marker {kind!r} (know {KINDS})")
            if kind in ("skip", "cwd") and not arg:
                raise SnippetError(f"{path.name}:{i + 1}: `snippet: {kind}` needs an argument")
            markers[kind] = arg
        elif fence := _FENCE.match(text):
            end = _closing(lines, i, fence["fence"])
            indent = len(fence["indent"])
            body = [
                line[indent:] if line[:indent].isspace() else line for line in lines[i + 1 : end]
            ]
            lang = fence["info"].strip().split(" ")[0].lower() if fence["info"].strip() else ""
            code = "\n".join(body) + "\n"
            found.append(Snippet(path, i + 1, lang, code, markers, tuple(headings)))
            markers = {}
            i = end
        elif text.strip() and not _OTHER_COMMENT.match(text):
            markers = {}  # a marker belongs to the block right below it
        i += 1
    return found


def _closing(lines: list[str], start: int, fence: str) -> int:
    for j in range(start + 1, len(lines)):
        if lines[j].strip().startswith(fence[0] * len(fence)) and not lines[j].strip().strip(
            fence[0]
        ):
            return j
    raise SnippetError(f"line {start + 1}: the code block is never closed")


def check_data(snippet: Snippet) -> None:
    """A data block must parse (`toml`, `json`)."""
    if snippet.lang == "toml":
        tomllib.loads(snippet.code)
    else:
        json.loads(snippet.code)


def ports(blocks: list[Snippet]) -> list[int]:
    """The local ports the blocks name (`127.0.0.1:7070`, `localhost:8000`, `--port 8000`)."""
    seen: list[int] = []
    for block in blocks:
        if block.skip is None:
            named = [m["port"] for m in _ADDRESS.finditer(block.code)]
            named += re.findall(r"--port[ =](\d+)\b", block.code)
            for port in map(int, named):
                if port not in seen:
                    seen.append(port)
    return seen


def substitute(code: str, mapping: dict[int, int]) -> str:
    """The one rewrite a block gets: each local port it names becomes the test's free port
    (`127.0.0.1:7070` and `--port 8000` alike)."""

    def address(match: re.Match[str]) -> str:
        port = int(match["port"])
        return match[0].replace(str(port), str(mapping.get(port, port)))

    code = _ADDRESS.sub(address, code)
    for old, new in mapping.items():
        code = re.sub(rf"(--port[ =]){old}\b", rf"\g<1>{new}", code)
    return code


# --- shell blocks -------------------------------------------------------------------------


@dataclass
class Command:
    """One logical shell line (continuations joined), with the output lines shown below it."""

    text: str
    shown: list[str] = field(default_factory=list)

    @property
    def code(self) -> str:
        return strip_comment(self.text).rstrip()

    @property
    def comment(self) -> str:
        return self.text[len(strip_comment(self.text)) :]


def commands(code: str) -> list[Command | str]:
    """The block's lines: a `Command` per logical command line, comment and blank lines
    (and lines inside multi-line constructs) as plain strings."""
    out: list[Command | str] = []
    raw = code.splitlines()
    i = 0
    depth = 0
    while i < len(raw):
        line = raw[i]
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            if stripped.startswith("#   ") and out and isinstance(out[-1], Command):
                out[-1].shown.append(stripped[4:].strip())
            else:
                out.append(line)
            i += 1
            continue
        joined = line
        while strip_comment(joined).rstrip().endswith("\\") and i + 1 < len(raw):
            i += 1
            joined += "\n" + raw[i]
        words = strip_comment(joined).replace(";", " ; ").split()
        first, last = words[0], words[-1]
        if depth:
            out.append(joined)
            if first in _CLOSE:
                depth -= 1
            elif first in _OPEN and last not in _CLOSE:
                depth += 1
        elif first in _OPEN and last not in _CLOSE:
            out.append(joined)
            depth = 1
        else:
            out.append(Command(joined))
        i += 1
    return out


_OPEN = frozenset({"for", "while", "until", "if", "case", "{"})
_CLOSE = frozenset({"done", "fi", "esac", "}"})


def strip_comment(line: str) -> str:
    """`line` without its trailing `# comment` (quotes respected)."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


def listen_ports(command: str, default: int) -> list[int]:
    """The ports a command serves on: `--listen`, `--port`, or `troth serve`'s default."""
    found = [int(m["port"] or m["port2"]) for m in _LISTEN.finditer(command)]
    if not found and re.search(r"\btroth serve\b", command):
        found = [default]
    return found


def starts_server(snippet: Snippet) -> bool:
    """Whether the block starts a troth server of its own."""
    return snippet.kind == "shell" and any(
        isinstance(c, Command) and re.search(r"\btroth serve\b", c.code)
        for c in commands(snippet.code)
    )


def shell_script(snippet: Snippet, code: str, default_port: int) -> str:
    """The block as the terminal runs it: as written, plus the waits a reader does by eye
    (a background server is serving before the next line) and the checks of the
    expected failures it shows."""
    out: list[str] = []
    for item in commands(code):
        if isinstance(item, str):
            out.append(item)
            continue
        text = item.text
        if note := _EXIT_NOTE.search(item.comment):
            text = f"__snippet_exits {note['code']} {text}"
        elif item.shown and item.shown[0].startswith("troth: error:"):
            wanted = item.shown[0].split("...")[0].strip()
            text = f"__snippet_fails {shell_quote(wanted)} {text}"
        background = snippet.background or item.code.endswith("&")
        if snippet.background and not item.code.endswith("&"):
            text = f"{item.code} &{item.comment}"
        out.append(text)
        if background:
            for port in listen_ports(item.code, default_port):
                out.append(f"__snippet_wait_port {port}")
    return "\n".join(out) + "\n"


def shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
