"""One SQLite file, several server processes (`troth serve --processes`): the stores of
two processes (here two stores of one process, each as a process opens it) share the
write lock and hear each other's commits (`store._processes`)."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from troth_server.domain.promise import Payload, Promise, PromiseState
from troth_server.store import StoreError, StoreEvent, open_store, supervise_alone
from troth_server.store._sql import SqlStore

T0 = 1_800_000_000_000


def pending(promise_id: str) -> Promise:
    return Promise(
        id=promise_id,
        state=PromiseState.PENDING,
        param=Payload(),
        value=Payload(),
        tags={},
        create_time=T0,
        expire_time=T0 + 60_000,
    )


@pytest.fixture
def two(tmp_path: Path) -> Iterator[tuple[SqlStore, SqlStore]]:
    url = f"sqlite:///{tmp_path}/troth.db"
    first = open_store(url, processes=2)
    second = open_store(url, processes=2)
    assert isinstance(first, SqlStore) and isinstance(second, SqlStore)
    yield first, second
    first.close()
    second.close()


def listening(store: SqlStore) -> queue.Queue[StoreEvent]:
    heard: queue.Queue[StoreEvent] = queue.Queue()
    store.listen(heard.put)
    return heard


def test_one_process_alone_is_not_shared(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/troth.db")
    assert not store.shared
    store.close()


def test_a_commit_is_heard_by_the_other_process_and_not_by_itself(
    two: tuple[SqlStore, SqlStore],
) -> None:
    first, second = two
    assert first.shared and second.shared
    heard_first, heard_second = listening(first), listening(second)

    def work(tx: object) -> None:
        tx.insert_promises([pending("p1")])  # type: ignore[attr-defined]
        tx.announce({"g1"}, ["s1"], created_ids=["p1"])  # type: ignore[attr-defined]

    first.write(work)
    event = heard_second.get(timeout=5)
    assert event == StoreEvent(frozenset({"g1"}), ("s1",), created_ids=("p1",))
    assert second.get_promise("p1") is not None  # sent once committed: it is there
    assert heard_first.empty()


def test_a_write_waits_for_the_other_process_and_sees_what_it_committed(
    two: tuple[SqlStore, SqlStore],
) -> None:
    first, second = two
    inside, release = threading.Event(), threading.Event()
    seen: list[Promise | None] = []

    def slow(tx: object) -> None:
        inside.set()
        release.wait(10)
        tx.insert_promises([pending("held")])  # type: ignore[attr-defined]

    def after(tx: object) -> None:
        seen.append(tx.get_promises({"held"}).get("held"))  # type: ignore[attr-defined]

    holder = threading.Thread(target=first.write, args=(slow,))
    holder.start()
    assert inside.wait(5)
    waiter = threading.Thread(target=second.write, args=(after,))
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive()  # waits for the lock, not on SQLite's busy handler
    release.set()
    holder.join(5)
    waiter.join(5)
    assert seen and seen[0] is not None and seen[0].id == "held"


def test_a_dropped_announcement_makes_the_next_one_a_resync(
    two: tuple[SqlStore, SqlStore],
) -> None:
    first, second = two
    heard = listening(second)
    announcer = first._announcer
    assert announcer is not None
    peers = announcer.peers()  # type: ignore[attr-defined]
    assert len(peers) == 1
    announcer._dropped.add(peers[0])  # type: ignore[attr-defined]  (its queue was full)
    first.write(lambda tx: tx.announce({"g2"}, []))
    assert heard.get(timeout=5) == StoreEvent(resync=True)
    assert heard.get(timeout=5).groups == {"g2"}


def test_a_process_gone_is_forgotten(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/troth.db"
    first = open_store(url, processes=2)
    gone = open_store(url, processes=2)
    assert isinstance(first, SqlStore) and isinstance(gone, SqlStore)
    marker = gone._announcer._marker  # type: ignore[union-attr]
    gone._announcer._socket.close()  # type: ignore[union-attr]  (SIGKILLed: its file stays)
    first.write(lambda tx: tx.announce({"g"}, []))
    assert not marker.exists()
    assert first._announcer.peers() == []  # type: ignore[union-attr]
    first.close()
    gone.close()


def test_a_supervisor_serves_a_sqlite_file_alone(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/troth.db"
    alone = supervise_alone(url)
    assert alone is not None
    with pytest.raises(StoreError, match="--processes supervisor"):
        open_store(url)  # a server of one process beside the supervisor's
    with pytest.raises(StoreError, match="need it alone"):
        supervise_alone(url)  # a second supervisor
    alone.close()
    lone, another = open_store(url), open_store(url)  # servers of one process each: as ever
    with pytest.raises(StoreError, match="need it alone"):
        supervise_alone(url)
    lone.close()
    another.close()
    assert supervise_alone("postgresql+psycopg://u@h/db") is None


def test_the_supervisors_children_hold_its_lock_until_the_last_ends(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/troth.db"
    alone = supervise_alone(url)
    assert alone is not None
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        pass_fds=(alone.fileno(),),
    )
    try:
        alone.close()  # the supervisor killed: its child still runs, reading the clock
        with pytest.raises(StoreError, match="need it alone"):
            supervise_alone(url)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(10)
    again = supervise_alone(url)  # the last child ended
    assert again is not None
    again.close()
