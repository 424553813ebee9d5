"""A Client of several server addresses keeps working when the server it uses dies.

Two real servers, each on its own SQLite file (one SQLite database has one
writer process), stand in for two replicas: what these tests check is that the
same `Client`, without being told, moves its calls and watches to the server
still standing. Which server holds a promise tells which one a call reached.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from _support import ServerProcess, start_server

from troth import Client, NotFoundError, Promise, PromiseState, UnavailableError

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    first = start_server(tmp_path / "a", "--sweep-interval", "200ms")
    second = start_server(tmp_path / "b", "--sweep-interval", "200ms")
    yield first, second
    first.kill()
    second.kill()


def holds(server: ServerProcess, promise_id: str) -> bool:
    with Client(server.address) as direct:
        try:
            direct.get(promise_id)
        except NotFoundError:
            return False
        return True


def test_calls_move_to_the_next_address_when_the_server_dies(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    first, second = pair
    with Client([first.address, second.address], timeout=5) as client:
        assert client.address == f"{first.address},{second.address}"
        assert client.create("fo.one", {"n": 1}).created
        assert holds(first, "fo.one")  # the first address that answers is used
        assert not holds(second, "fo.one")

        first.kill()
        started = time.monotonic()
        # The same idempotent create, repeated as a gateway would after a
        # failover: it reaches the survivor, which has never seen it.
        assert client.create("fo.one", {"n": 1}).created
        assert time.monotonic() - started < 3, "the failover took too long"
        assert holds(second, "fo.one")
        assert client.resolve("fo.one", {"ok": True}).applied
        assert client.get("fo.one").state is PromiseState.RESOLVED
        assert [p.id for p in client.search_all("fo.*")] == ["fo.one"]


def test_the_first_address_may_be_down_from_the_start(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    first, second = pair
    first.kill()
    with Client(f"{first.address}, {second.address}", timeout=5) as client:
        assert client.create("fo.down", {"n": 1}).created
    assert holds(second, "fo.down")


def test_no_replica_answering_names_every_address(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    first, second = pair
    first.kill()
    second.kill()
    with (
        Client([first.address, second.address], timeout=2) as client,
        pytest.raises(UnavailableError) as caught,
    ):
        client.get("anything")
    assert f"at any of {first.address},{second.address}" in str(caught.value)


def test_a_watch_reconnects_to_the_next_address(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    first, second = pair
    # Both "replicas" hold the promise, as two replicas of one database would.
    for server in pair:
        with Client(server.address) as direct:
            direct.create("fo.watched", {"n": 1})
    seen: list[Promise] = []
    failed: list[BaseException] = []
    with Client([first.address, second.address], timeout=5) as client:
        watching = threading.Event()

        def watch() -> None:
            try:
                for promise in client.watch("fo.watched", timeout=20):
                    seen.append(promise)
                    watching.set()
            except BaseException as exc:  # reported by the test thread
                failed.append(exc)
                watching.set()

        thread = threading.Thread(target=watch)
        thread.start()
        assert watching.wait(10)
        assert [p.state for p in seen] == [PromiseState.PENDING]
        first.kill()
        with Client(second.address) as direct:
            direct.resolve("fo.watched", "from the survivor")
        thread.join(20)
    assert not thread.is_alive()
    assert failed == []
    # The survivor's copy may show up pending first (it is another record, with
    # its own create_time); what matters is that the settle arrives.
    assert {p.state for p in seen[:-1]} == {PromiseState.PENDING}
    assert seen[-1].state is PromiseState.RESOLVED
    assert client.decode(seen[-1].value) == "from the survivor"


def test_a_wait_calls_the_next_address_when_its_server_dies(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    first, second = pair
    for server in pair:
        with Client(server.address) as direct:
            direct.create("fo.waited", {"n": 1})
    outcome: list[Promise | BaseException] = []
    with Client([first.address, second.address], timeout=5) as client:

        def wait() -> None:
            try:
                outcome.append(client.wait("fo.waited", timeout=30))
            except BaseException as exc:  # reported by the test thread
                outcome.append(exc)

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.5)  # the wait is in place on the first server
        assert outcome == []
        first.kill()
        with Client(second.address) as direct:
            direct.resolve("fo.waited", "from the survivor")
        thread.join(30)
        assert not thread.is_alive()
        (settled,) = outcome
        assert isinstance(settled, Promise), settled
        assert settled.state is PromiseState.RESOLVED
        assert client.decode(settled.value) == "from the survivor"


def test_a_young_wait_rides_out_a_restart_of_its_server(tmp_path: Path) -> None:
    """A wait begun a moment before its server is killed (its first long poll not
    answered yet) rides out the restart, as one begun a minute before does: only a
    server never reached fails a wait as fast as any call."""
    server = start_server(tmp_path / "server", "--sweep-interval", "200ms")
    restarted: ServerProcess | None = None
    outcome: list[Promise | BaseException] = []
    try:
        with Client(server.address, timeout=5) as client:
            client.create("young.waited", {"n": 1})

            def wait() -> None:
                try:
                    outcome.append(client.wait("young.waited", timeout=60))
                except BaseException as exc:  # reported by the test thread
                    outcome.append(exc)

            thread = threading.Thread(target=wait, daemon=True)
            thread.start()
            time.sleep(1.0)  # the wait's long poll is in place, far from its end
            server.kill()
            time.sleep(6.0)  # longer than a call's retries ride out
            assert outcome == [], "the wait gave up during the outage"
            restarted = start_server(
                tmp_path / "server", "--sweep-interval", "200ms", "--listen", server.address,
                db_url=server.db_url,
            )  # fmt: skip
            with Client(restarted.address) as direct:
                direct.resolve("young.waited", "after the restart")
            thread.join(30)
            assert not thread.is_alive()
    finally:
        server.kill()
        if restarted is not None:
            restarted.kill()
    (settled,) = outcome
    assert isinstance(settled, Promise), settled
    assert settled.state is PromiseState.RESOLVED
    assert client.decode(settled.value) == "after the restart"
