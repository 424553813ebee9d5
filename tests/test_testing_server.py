"""`troth.testing.running_server`: a real server for users' integration tests."""

from __future__ import annotations

from troth import Client, PromiseState
from troth.testing import running_server


def test_running_server_serves_and_stops() -> None:
    with running_server("--sweep-interval", "100ms") as address, Client(address) as client:
        client.create("t-1", {"n": 1})
        assert client.resolve("t-1", "ok").applied
        assert client.get("t-1").state is PromiseState.RESOLVED
    with running_server() as second, Client(second) as client:
        assert [p.id for p in client.search_all()] == []  # a fresh database each time
