"""`troth serve --console-listen HOST:PORT`: one process serves gRPC and the web console
(which calls the server's own gRPC port on loopback, each person signing in with their
own token), and its first lines say where each is: the gRPC address, the console's URL
and the metrics' URL, or how to turn each on. Without the console's dependencies, one
line names the install command."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING

import httpx
import pytest
from _auth import Grant, write_token_file
from _console import started_line
from _support import eventually, start_server

from troth import Client, PromiseState
from troth_server.app import own_address
from troth_server.config import settings_from

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from _support import ServerProcess


@pytest.fixture(scope="module")
def hosted(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ServerProcess, dict[str, str]]]:
    workdir = tmp_path_factory.mktemp("hosted-console")
    tokens = write_token_file(
        workdir / "tokens.toml",
        [Grant("alice", ("gateway",)), Grant("starter", ("gateway",))],
    )
    server = start_server(
        workdir,
        "--auth-tokens", str(workdir / "tokens.toml"),
        "--console-listen", "127.0.0.1:0",
        "--metrics-listen", "127.0.0.1:0",
    )  # fmt: skip
    try:
        yield server, tokens
    finally:
        assert server.stop() == 0, server.log()[-3000:]


def test_the_first_lines_name_the_grpc_address_the_console_url_and_the_metrics_url(
    hosted: tuple[ServerProcess, dict[str, str]],
) -> None:
    server, _ = hosted
    line = started_line(server)
    first = json.loads(server.log().splitlines()[0])
    assert first["event"] == "server.started", "the first line says where it serves"
    assert line["grpc"] == f"127.0.0.1:{server.port}"
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", line["console"]), line
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", line["metrics"]), line
    assert httpx.get(line["metrics"], timeout=10).status_code == 200


def test_the_console_in_the_server_process_serves_its_pages_to_a_signed_in_person(
    hosted: tuple[ServerProcess, dict[str, str]],
) -> None:
    server, tokens = hosted
    url = started_line(server)["console"].rstrip("/")
    wid = f"hosted-{uuid.uuid4().hex[:8]}"
    with Client(server.address, timeout=10, token=tokens["starter"]) as starter:
        starter.create(wid, ttl=timedelta(hours=1), title="Ship it?",
                       tags={"troth:kind": "promise"})  # fmt: skip
    with httpx.Client(base_url=url, follow_redirects=False, timeout=30) as http:
        assert http.get("/healthz").text.startswith("ok")
        # Not signed in: the server (authentication on) refuses, in words.
        assert "Sign in" in http.get("/").text
        page = http.get("/signin").text
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf, page
        signed = http.post("/signin", data={"token": tokens["alice"], "csrf": csrf.group(1)})
        assert signed.status_code == 303, signed.text
        inbox = http.get("/?all=1").text
        assert "Ship it?" in inbox, inbox[-2000:]
        assert wid in http.get(f"/promises/{wid}").text
    with Client(server.address, timeout=10, token=tokens["starter"]) as starter:
        assert starter.get(wid).state is PromiseState.PENDING


def test_off_by_default_the_first_lines_say_how_to_turn_console_and_metrics_on(
    tmp_path: Path,
) -> None:
    server = start_server(tmp_path)
    try:
        line = started_line(server)
    finally:
        assert server.stop() == 0
    assert line["grpc"] == f"127.0.0.1:{server.port}"
    assert "--console-listen 127.0.0.1:7080" in line["console"], line
    assert "--metrics-listen 127.0.0.1:9464" in line["metrics"], line


def test_without_the_consoles_dependencies_one_line_names_the_install_command(
    tmp_path: Path,
) -> None:
    # Starlette missing, as in an installation without the `console` extra.
    script = (
        "import sys; sys.modules['starlette'] = None\n"
        "from troth_server.__main__ import main\n"
        "raise SystemExit(main(sys.argv[1:]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, "serve", "--no-auth", "--listen", "127.0.0.1:0",
         "--db", f"sqlite:///{tmp_path}/x.db", "--console-listen", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "needs starlette, which is not installed" in lines[0]
    assert "pip install './server[console]'" in lines[0]
    assert "troth-server[console]" not in lines[0]
    assert not (tmp_path / "x.db").exists(), "nothing is opened before the refusal"


def test_troth_console_names_the_same_install_command(tmp_path: Path) -> None:
    script = (
        "import sys; sys.modules['starlette'] = None\n"
        "from troth_server.__main__ import main\n"
        "raise SystemExit(main(sys.argv[1:]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, "console"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1, done
    assert "pip install './server[console]'" in done.stderr
    assert "troth-server[console]" not in done.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--console-listen", "nowhere"], "--console-listen: 'nowhere' is not HOST:PORT"),
        (
            ["--console-listen", "127.0.0.1:0", "--tls-cert", "c.pem", "--tls-key", "k.pem"],
            "troth console --server",
        ),
    ],
)
def test_a_console_address_that_cannot_work_is_refused_in_words(
    args: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        settings_from(["--no-auth", *args], environ={})
    assert words in capsys.readouterr().err


def test_without_auth_a_console_on_a_public_address_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "troth_server", "serve", "--no-auth", "--listen", "127.0.0.1:0",
         "--db", f"sqlite:///{tmp_path}/x.db", "--console-listen", "0.0.0.0:0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done
    assert "--console-listen 0.0.0.0:0" in done.stderr and "not a loopback" in done.stderr


def test_a_stop_with_a_live_console_page_open_is_clean_and_prompt(tmp_path: Path) -> None:
    """SIGTERM while a live page holds its event stream (a watch of the server): the
    console cuts it, then the server stops, exit 0."""
    server = start_server(tmp_path, "--console-listen", "127.0.0.1:0")
    url = started_line(server)["console"].rstrip("/")
    opened = threading.Event()

    def listen() -> None:
        with (
            httpx.Client(timeout=60) as http,
            http.stream("GET", f"{url}/events?id=*") as events,
        ):
            opened.set()
            try:
                for _ in events.iter_lines():
                    pass
            except httpx.RemoteProtocolError:
                pass  # cut by the stop: what a live page sees

    reader = threading.Thread(target=listen, daemon=True)
    reader.start()
    assert opened.wait(20), "the event stream opened"
    eventually(lambda: "live pages: 1" in httpx.get(f"{url}/healthz").text, 20, "one live page")
    began = time.monotonic()
    assert server.stop(timeout=30) == 0, server.log()[-3000:]
    took = time.monotonic() - began
    assert took < 15, took
    print(f"stopped in {took:.1f} s with a live page open")
    reader.join(10)
    assert not reader.is_alive(), "the stream ended with the server"


@pytest.mark.parametrize(
    ("listen", "port", "address"),
    [
        ("127.0.0.1:0", 7071, "127.0.0.1:7071"),
        ("0.0.0.0:7070", 7070, "127.0.0.1:7070"),
        ("[::]:7070", 7070, "[::1]:7070"),
        ("10.1.2.3:7070", 7070, "10.1.2.3:7070"),
        ("unix:/run/troth.sock", 0, "unix:/run/troth.sock"),
    ],
)
def test_the_console_reaches_its_own_server_on_loopback_when_it_can(
    listen: str, port: int, address: str
) -> None:
    assert own_address(listen, port) == address


def test_read_on_a_terminal_the_started_line_leads_with_the_addresses(tmp_path: Path) -> None:
    server = start_server(
        tmp_path, "--log-format", "console", "--console-listen", "127.0.0.1:0",
        "--metrics-listen", "127.0.0.1:0",
    )  # fmt: skip
    try:
        eventually(lambda: "server.started" in server.log(), 30, "the started line")
    finally:
        assert server.stop() == 0
    line = next(line for line in server.log().splitlines() if "server.started" in line)
    fields = line.split("server.started", 1)[1].split()
    assert fields[0] == f"grpc=127.0.0.1:{server.port}", line
    assert re.fullmatch(r"console=http://127\.0\.0\.1:\d+/", fields[1]), line
    assert re.fullmatch(r"metrics=http://127\.0\.0\.1:\d+/metrics", fields[2]), line


def test_with_a_token_in_the_environment_the_console_is_refused_in_words(tmp_path: Path) -> None:
    """TROTH_TOKEN (or TROTH_TOKEN_FILE) would be sent for everyone not signed in."""
    done = subprocess.run(
        [sys.executable, "-m", "troth_server", "serve", "--no-auth", "--listen", "127.0.0.1:0",
         "--db", f"sqlite:///{tmp_path}/x.db", "--console-listen", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "TROTH_TOKEN": "an-operators-own-token"},
    )  # fmt: skip
    assert done.returncode == 1, done
    assert "cannot serve the console: TROTH_TOKEN is set" in done.stderr
    assert "an-operators-own-token" not in done.stderr + done.stdout


def test_a_console_off_loopback_warns_that_it_serves_plain_http(tmp_path: Path) -> None:
    write_token_file(tmp_path / "tokens.toml", [Grant("alice", ("gateway",))])
    server = start_server(
        tmp_path, "--auth-tokens", str(tmp_path / "tokens.toml"),
        "--console-listen", "0.0.0.0:0",
    )  # fmt: skip
    try:
        line = started_line(server)
    finally:
        assert server.stop() == 0
    assert re.fullmatch(r"http://0\.0\.0\.0:\d+/", line["console"]), line
    warning = next(json.loads(x) for x in server.log().splitlines() if "console.plain_http" in x)
    assert "plain HTTP on 0.0.0.0:0" in warning["message"]
    assert "HTTPS proxy" in warning["message"]
