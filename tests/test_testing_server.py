"""`troth.testing.running_server`: a real server for users' integration tests."""

from __future__ import annotations

from pathlib import Path

from _tls import TestCA

from troth import Client, PromiseState, TlsConfig
from troth.testing import running_server


def test_running_server_serves_and_stops() -> None:
    with running_server("--sweep-interval", "100ms") as address, Client(address) as client:
        client.create("t-1", {"n": 1})
        assert client.resolve("t-1", "ok").applied
        assert client.get("t-1").state is PromiseState.RESOLVED
    with running_server() as second, Client(second) as client:
        assert [p.id for p in client.search_all()] == []  # a fresh database each time


def test_running_server_serves_tls_when_told_how_to_connect(tmp_path: Path) -> None:
    ca = TestCA.create(tmp_path)
    server = ca.issue(tmp_path, "server", server=True)
    tls = TlsConfig(ca_file=ca.cert)
    args = ("--tls-cert", str(server.cert), "--tls-key", str(server.key))
    with running_server(*args, tls=tls) as address, Client(address, tls=tls) as client:
        assert client.create("t-tls").created
