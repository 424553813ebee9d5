"""The TLS page (docs/tls.md), run as written: its OpenSSL commands make a CA and the
certificates, a server serves mTLS with them, and the CLI, grpcurl and Python
snippets get through (on a free port instead of 7070)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _support import ServerTls, start_server

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TLS_PAGE = ROOT / "docs" / "tls.md"

pytestmark = pytest.mark.e2e


def block(name: str) -> str:
    """The fenced code block between `<!-- name: start -->` and `<!-- name: end -->`."""
    readme = TLS_PAGE.read_text(encoding="utf-8")
    found = re.search(
        rf"<!-- {name}: start -->\n```sh\n(.*?)```\n<!-- {name}: end -->", readme, re.DOTALL
    )
    assert found, f"docs/tls.md has no {name} block"
    return found.group(1)


def python_snippet() -> str:
    section = TLS_PAGE.read_text(encoding="utf-8")
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found
    return found.group(1)


def test_the_readme_tls_section(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is required by docs/tls.md")
    env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    env = {k: v for k, v in env.items() if not k.startswith("TROTH_")}
    made = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block("tls-setup")],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    tls = tmp_path / "tls"

    use = block("tls-use")
    serve, rest = use.split("\n", 1)
    assert serve.startswith("troth serve --tls-cert tls/server.crt --tls-key tls/server.key")
    assert "--tls-client-ca tls/ca.pem" in serve and "--no-auth" in serve
    server = start_server(
        tmp_path / "server",
        tls=ServerTls(
            tls / "server.crt", tls / "server.key", tls / "ca.pem",
            client_ca=tls / "ca.pem", client_cert=tls / "alice.crt", client_key=tls / "alice.key",
        ),
    )  # fmt: skip
    try:
        script = rest.replace("127.0.0.1:7070", server.address)
        ran = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=tmp_path, capture_output=True, text=True, timeout=120,
            env={**env, "TROTH_SERVER": server.address, "TROTH_TOKEN": "readme-token"},
        )  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        assert "approve-9" in ran.stdout
        assert "troth.v1.PromiseService" in ran.stdout  # grpcurl list
        assert '"id": "approve-9"' in ran.stdout  # grpcurl GetPromise

        snippet = python_snippet().replace("127.0.0.1:7070", server.address)
        snippet += "\nprint(client.create('approve-10').created)\nclient.close()\n"
        py = subprocess.run(
            [sys.executable, "-c", snippet],
            cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
        assert py.returncode == 0, py.stderr
        assert py.stdout.strip() == "True"
    finally:
        assert server.stop() == 0, server.log()[-3000:]
