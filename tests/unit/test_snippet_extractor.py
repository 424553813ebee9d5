"""The snippet extractor (tests/_snippets.py) on made-up documents: markers, kinds, the
port rewrite and the shell conventions it understands."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from _snippets import SnippetError, ports, shell_script, snippets, starts_server, substitute

if TYPE_CHECKING:
    from pathlib import Path

DOC = """# Title

<!-- snippet: skip it installs things -->
```sh
pip install troth
```

## Run

<!-- tls-use: start -->
<!-- snippet: background -->
```bash
troth serve --listen 127.0.0.1:7070
uvicorn app:app --port 8000
```

```python
print("hi")  # 127.0.0.1:7070  #=> hi
```

```
output
```
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "README.md"
    path.write_text(text, encoding="utf-8")
    return path


def test_blocks_markers_headings_and_kinds(tmp_path: Path) -> None:
    found = snippets(write(tmp_path, DOC))
    assert [(b.line, b.kind) for b in found] == [
        (4, "shell"), (12, "shell"), (17, "python"), (21, "unknown"),
    ]  # fmt: skip
    assert found[0].skip == "it installs things"
    assert found[1].background and found[1].headings[-1][1] == "Run"
    assert not found[2].markers  # a marker belongs to the block right below it
    assert found[2].expected == ["hi"] and found[1].expected == []
    assert ports(found) == [7070, 8000]
    assert starts_server(found[1]) and not starts_server(found[2])


def test_the_port_rewrite_and_the_background_waits(tmp_path: Path) -> None:
    block = snippets(write(tmp_path, DOC))[1]
    code = substitute(block.code, {7070: 40001, 8000: 40002})
    assert "127.0.0.1:40001" in code and "--port 40002" in code
    script = shell_script(block, code, 40001).splitlines()
    assert script == [
        "troth serve --listen 127.0.0.1:40001 &",
        "__snippet_wait_port 40001",
        "uvicorn app:app --port 40002 &",
        "__snippet_wait_port 40002",
    ]


def test_expected_failures_and_exit_statuses(tmp_path: Path) -> None:
    doc = """```sh
python report.py run-1      # still running (exit 3)
troth approvals approve x --value '{"a": 1}'
#   troth: error: permission denied ... (rule approvers)
for name in a b; do
  echo $name
done
```
"""
    block = snippets(write(tmp_path, doc))[0]
    script = shell_script(block, block.code, 7070).splitlines()
    assert script[0] == "__snippet_exits 3 python report.py run-1      # still running (exit 3)"
    assert script[1] == (
        "__snippet_fails 'troth: error: permission denied' "
        "troth approvals approve x --value '{\"a\": 1}'"
    )
    assert script[2:] == ["for name in a b; do", "  echo $name", "done"]


@pytest.mark.parametrize(
    "text",
    ["<!-- snippet: skip -->\n```sh\nls\n```\n", "<!-- snippet: later -->\n```sh\nls\n```\n",
     "```sh\nls\n"],
)  # fmt: skip
def test_what_it_refuses(tmp_path: Path, text: str) -> None:
    with pytest.raises(SnippetError):
        snippets(write(tmp_path, text))
