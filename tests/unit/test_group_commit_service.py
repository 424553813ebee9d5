"""PromiseService + GroupCommitter + WatchHub + Sweeper, in process, on a real SQLite file.

Wired as `troth_server.app.Core.__init__` wires them, with a `FakeClock`
instead of the wall clock. Nothing here sleeps: ordering comes from events, a
gate operation that holds the writer thread, and polling with a deadline.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from troth_server.domain.access import Principal, Role
from troth_server.domain.approvers import Approvers, NotAnApprover
from troth_server.domain.errors import (
    DomainError,
    InvalidArgument,
    PromiseAlreadyExists,
    PromiseAlreadySettled,
    PromiseNotFound,
    PromiseTimedOut,
)
from troth_server.domain.promise import (
    EMPTY,
    TIMEOUT_PRINCIPAL,
    CreateRequest,
    Payload,
    Promise,
    PromiseState,
    SettleRequest,
)
from troth_server.service import PromiseService, PromiseWatch
from troth_server.store import Store, StoreError, StoreUnavailable, WriteTx, open_store
from troth_server.sweeper import SweepCounts, Sweeper
from troth_server.watch import WatchHub
from troth_server.writes.batch import Batch, Keys
from troth_server.writes.group_commit import GroupCommitter, ShuttingDown

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z in ms
HOUR = 3_600_000
TIMER = {"troth:timer": "true"}
WAIT = 10.0  # seconds; only ever reached when a test is about to fail


class FakeClock:
    """Milliseconds since the epoch, moved only by the test."""

    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


@dataclass
class Wired:
    clock: FakeClock
    store: Store
    hub: WatchHub
    committer: GroupCommitter
    service: PromiseService


@pytest.fixture
def wired(tmp_path: Path) -> Iterator[Wired]:
    clock = FakeClock()
    store = open_store(f"sqlite:///{tmp_path}/t.db")
    hub = WatchHub()
    service: PromiseService | None = None
    committer = GroupCommitter(
        store, clock, on_commit=lambda changes: service.on_commit(changes) if service else None
    )
    service = PromiseService(store, committer, hub, clock)
    committer.start()
    yield Wired(clock, store, hub, committer, service)
    service.stop_watches()
    committer.stop()
    store.close()


def create(
    service: PromiseService,
    promise_id: str,
    *,
    ttl: int | None = HOUR,
    tags: dict[str, str] | None = None,
    key: str | None = None,
    param: Payload = EMPTY,
) -> tuple[Promise, bool]:
    return asyncio.run(
        service.create_async(
            CreateRequest(promise_id, param, tags or {}, ttl=ttl, idempotency_key=key)
        )
    )


def resolve(
    service: PromiseService,
    promise_id: str,
    *,
    key: str | None = None,
    value: Payload = EMPTY,
    state: PromiseState = PromiseState.RESOLVED,
    principal: str | None = None,
) -> tuple[Promise, bool]:
    settled = asyncio.run(
        service.settle_async(SettleRequest(promise_id, state, value, key, principal=principal))
    )
    return settled.promise, settled.applied


def outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn's result, or the exception it raised (so threads can report either)."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        return exc


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.001)


class Gate:
    """A write op that holds the writer thread until released, so requests queue up."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def keys(self, tx: WriteTx, now: int) -> Keys:
        self.entered.set()
        assert self.release.wait(WAIT), "gate never released"
        return Keys()

    def apply(self, batch: Batch) -> str:
        return "gate"


def queued(committer: GroupCommitter) -> int:
    return committer._queue.qsize()


def one_batch(wired: Wired, calls: list[Callable[[], Any]]) -> list[Any]:
    """Run `calls` (each a blocking submit) so that all of them land in one batch, in order."""
    gate = Gate()
    with ThreadPoolExecutor(len(calls) + 1) as pool:
        gated = pool.submit(wired.committer.submit, gate)
        assert gate.entered.wait(WAIT)
        futures = []
        for n, call in enumerate(calls, 1):
            futures.append(pool.submit(outcome, call))
            wait_until(lambda n=n: queued(wired.committer) == n, f"{n} requests are queued")
        gate.release.set()
        assert gated.result(WAIT) == "gate"
        return [f.result(WAIT) for f in futures]


# -- create and settle through the service --------------------------------------------


def test_create_settle_get(wired: Wired) -> None:
    service, clock = wired.service, wired.clock
    param = Payload({"content-type": "application/json"}, b"[1]")
    created, was_created = create(service, "p", ttl=5_000, param=param, key="ck")
    assert was_created
    assert created.state is PromiseState.PENDING
    assert created.create_time == T0 and created.expire_time == T0 + 5_000
    assert create(service, "p", key="ck", ttl=1) == (created, False)
    with pytest.raises(PromiseAlreadyExists):
        create(service, "p", key="other")
    assert asyncio.run(service.get_async("p")) == created

    clock.advance(10)
    value = Payload({"h": "v"}, b"ok")
    settled, applied = resolve(service, "p", key="sk", value=value, principal="alice")
    assert applied
    assert settled.state is PromiseState.RESOLVED
    assert (settled.value, settled.settle_time, settled.settled_by) == (value, T0 + 10, "alice")
    assert resolve(service, "p", key="sk") == (settled, False)
    with pytest.raises(PromiseAlreadySettled, match="already resolved by 'alice'"):
        resolve(service, "p", key="other", state=PromiseState.REJECTED)
    assert asyncio.run(service.get_async("p")) == settled == wired.store.get_promise("p")
    with pytest.raises(PromiseNotFound):
        asyncio.run(service.get_async("missing"))
    with pytest.raises(PromiseNotFound):
        resolve(service, "missing")


def test_reads_after_expiry_never_show_pending(wired: Wired) -> None:
    service, clock = wired.service, wired.clock
    create(service, "plain", ttl=1_000)
    create(service, "timer", ttl=1_000, tags=TIMER)
    clock.advance(1_000)
    assert asyncio.run(service.get_async("plain")).state is PromiseState.REJECTED_TIMEDOUT
    timer = asyncio.run(service.get_async("timer"))
    assert (timer.state, timer.settled_by, timer.settle_time) == (
        PromiseState.RESOLVED,
        TIMEOUT_PRINCIPAL,
        T0 + 1_000,
    )
    page = service.search("*", frozenset({PromiseState.PENDING}), {}, 10, "")
    assert page.promises == []
    page = service.search("*", frozenset(), {}, 10, "")
    assert [p.state for p in page.promises] == [
        PromiseState.REJECTED_TIMEDOUT,
        PromiseState.RESOLVED,
    ]
    # The sweeper has not run, but a timeout a reader was told of is in the store
    # already (the writer decided it): no later settle can change what was read.
    stored = wired.store.get_promise("plain")
    assert stored is not None and stored.state is PromiseState.REJECTED_TIMEDOUT


def test_settling_an_expired_promise_times_out_and_persists_the_timeout(wired: Wired) -> None:
    service, clock = wired.service, wired.clock
    create(service, "p", ttl=1_000)
    clock.advance(1_000)
    with pytest.raises(PromiseTimedOut) as caught:
        resolve(service, "p", key="late")
    assert caught.value.promise.state is PromiseState.REJECTED_TIMEDOUT
    assert wired.store.get_promise("p") == caught.value.promise
    with pytest.raises(PromiseTimedOut):
        resolve(service, "p", key="late")


def test_search_pages_through_the_service(wired: Wired) -> None:
    service = wired.service
    for n in range(5):
        create(service, f"job-{n}", tags={"group": "g"})
    create(service, "other", tags={"group": "h"})
    seen: list[str] = []
    token = ""
    while True:
        page = service.search("job-*", frozenset(), {"group": "g"}, 2, token)
        seen += [p.id for p in page.promises]
        if not page.next_page_token:
            break
        token = page.next_page_token
    assert seen == [f"job-{n}" for n in range(5)]


def test_racing_settles_exactly_one_applies(wired: Wired) -> None:
    service = wired.service
    create(service, "p")
    racers = 16
    barrier = threading.Barrier(racers)

    def settle(n: int) -> Any:
        barrier.wait(WAIT)
        state = PromiseState.RESOLVED if n % 2 else PromiseState.REJECTED
        return outcome(
            resolve, service, "p", key=f"k{n}", state=state, value=Payload({}, b"%d" % n)
        )

    with ThreadPoolExecutor(racers) as pool:
        results = list(pool.map(settle, range(racers)))

    winners = [r for r in results if isinstance(r, tuple)]
    assert len(winners) == 1, results
    winner, applied = winners[0]
    assert applied
    losers = [r for r in results if not isinstance(r, tuple)]
    assert all(isinstance(r, PromiseAlreadySettled) for r in losers), losers
    assert all(r.promise == winner for r in losers)
    assert asyncio.run(service.get_async("p")) == winner
    assert winner.idempotency_key_for_settle is not None
    assert resolve(service, "p", key=winner.idempotency_key_for_settle) == (winner, False)


def test_racing_creates_exactly_one_creates(wired: Wired) -> None:
    racers = 8
    barrier = threading.Barrier(racers)

    def race(_: int) -> Any:
        barrier.wait(WAIT)
        return create(wired.service, "p", key="same")

    with ThreadPoolExecutor(racers) as pool:
        results = list(pool.map(race, range(racers)))
    assert sorted(created for _, created in results) == [False] * (racers - 1) + [True]
    assert all(promise == results[0][0] for promise, _ in results)


# -- batching -------------------------------------------------------------------------


def test_a_refused_request_does_not_fail_its_batch(wired: Wired) -> None:
    service, clock = wired.service, wired.clock
    results = one_batch(
        wired,
        [
            lambda: create(service, "x"),
            lambda: resolve(service, "missing"),
            lambda: asyncio.run(
                service.create_async(CreateRequest("y", Payload(), {}, expire_time=T0 - 1))
            ),
            lambda: resolve(service, "x", key="k1", principal="alice"),
            lambda: create(service, "x", tags={"different": "tags"}),
            lambda: resolve(service, "x", key="k2"),
            lambda: resolve(service, "x", key="k1"),
            lambda: create(service, "z", ttl=None),
        ],
    )
    (x, created), not_found, invalid, (settled, applied), exists, lost, repeat, (z, _) = results
    assert created and x.state is PromiseState.PENDING
    assert isinstance(not_found, PromiseNotFound)
    assert isinstance(invalid, InvalidArgument) and invalid.field == "expire_time"
    # The settle saw the create staged earlier in the same batch.
    assert applied and settled.state is PromiseState.RESOLVED and settled.settle_time == clock()
    assert isinstance(exists, PromiseAlreadyExists)
    assert isinstance(lost, PromiseAlreadySettled) and lost.promise == settled
    assert repeat == (settled, False)
    assert z.expire_time is None
    assert wired.committer.stats.largest_batch == len(results)
    assert asyncio.run(service.get_async("x")) == settled
    assert wired.store.get_promise("y") is None
    assert wired.store.get_promise("z") == z


@dataclass(frozen=True)
class _BrokenOp:
    """An op whose transaction the store cannot commit."""

    def keys(self, tx: WriteTx, now: int) -> Keys:
        return Keys(promises=("a",))

    def apply(self, batch: Batch) -> None:
        raise StoreUnavailable("disk on fire")


def test_a_store_failure_is_retried_alone_and_spares_its_neighbours(wired: Wired) -> None:
    service = wired.service
    results = one_batch(
        wired,
        [
            lambda: create(service, "a"),
            lambda: wired.committer.submit(_BrokenOp()),
            lambda: create(service, "b"),
        ],
    )
    assert results[0][1] is True and results[2][1] is True
    assert isinstance(results[1], StoreUnavailable)
    assert isinstance(results[1], StoreError)
    assert wired.store.get_promise("a") == results[0][0]
    assert wired.store.get_promise("b") == results[2][0]


def test_stats_count_commits_and_requests(wired: Wired) -> None:
    stats = wired.committer.stats
    before = (stats.commits, stats.requests)
    create(wired.service, "a")
    resolve(wired.service, "a")
    assert (stats.commits, stats.requests) == (before[0] + 2, before[1] + 2)
    assert stats.largest_batch >= 1

    one_batch(wired, [lambda n=n: create(wired.service, f"b{n}") for n in range(5)])
    # The gate's batch, then one batch of five.
    assert (stats.commits, stats.requests) == (before[0] + 4, before[1] + 8)
    assert stats.largest_batch == 5


def test_state_changes_are_logged_after_commit(wired: Wired) -> None:
    def changes() -> list[Any]:
        return [e for e in logs if e["event"] == "promise.state_changed"]

    with capture_logs() as logs:
        create(wired.service, "p")
        resolve(wired.service, "p", principal="bob")
        # The writer answers a batch's requests, then logs its changes.
        wait_until(lambda: len(changes()) == 2, "both changes are logged")
    logged = changes()
    assert [(e["promise_id"], e["old_state"], e["new_state"], e["principal"]) for e in logged] == [
        ("p", None, "PENDING", None),
        ("p", "PENDING", "RESOLVED", "bob"),
    ]


# -- shutdown -------------------------------------------------------------------------


def test_stop_commits_what_was_queued_then_refuses(wired: Wired) -> None:
    committer = wired.committer
    gate = Gate()
    with ThreadPoolExecutor(3) as pool:
        gated = pool.submit(committer.submit, gate)
        assert gate.entered.wait(WAIT)
        queued_create = pool.submit(create, wired.service, "queued")
        wait_until(lambda: queued(committer) == 1, "the create is queued")
        stopping = pool.submit(committer.stop)
        wait_until(lambda: queued(committer) == 2, "stop is queued")
        with pytest.raises(ShuttingDown, match="shutting down"):
            create(wired.service, "too-late")
        gate.release.set()
        assert gated.result(WAIT) == "gate"
        assert queued_create.result(WAIT)[1] is True
        stopping.result(WAIT)

    with pytest.raises(ShuttingDown):
        committer.submit(_BrokenOp())
    with pytest.raises(ShuttingDown) as caught:
        resolve(wired.service, "queued")
    assert isinstance(caught.value, DomainError)
    assert wired.store.get_promise("queued") is not None
    assert wired.store.get_promise("too-late") is None


class _PutAfterStop:
    """The committer's queue, with a request's `put` held until `stop()` has returned."""

    def __init__(self, real: queue.SimpleQueue[Any]) -> None:
        self._real = real
        self.putting = threading.Event()
        self.stopped = threading.Event()

    def put(self, item: Any) -> None:
        if item is not None:  # None is the stop marker
            self.putting.set()
            # Bounded, so that a committer that serialises submit and stop (and so
            # blocks stop behind this put) still finishes the test.
            self.stopped.wait(0.2)
        self._real.put(item)

    def get(self) -> Any:
        return self._real.get()

    def get_nowait(self) -> Any:
        return self._real.get_nowait()


def test_a_submit_racing_stop_is_answered(wired: Wired) -> None:
    committer = wired.committer
    held = _PutAfterStop(committer._queue)
    committer._queue = held  # type: ignore[assignment]
    answers: queue.Queue[Any] = queue.Queue()
    threading.Thread(
        target=lambda: answers.put(outcome(create, wired.service, "racer")), daemon=True
    ).start()
    assert held.putting.wait(WAIT)
    stopping = threading.Thread(target=committer.stop, daemon=True)
    stopping.start()
    stopping.join(WAIT)
    held.stopped.set()
    answer = answers.get(timeout=1.0)  # raises queue.Empty while the request hangs
    assert isinstance(answer, ShuttingDown) or answer[1] is True


# -- sweeper --------------------------------------------------------------------------


def test_sweeper_expires_overdue_promises_in_batches(wired: Wired) -> None:
    service, store = wired.service, wired.store
    for n in range(10):
        create(service, f"due-{n}", ttl=1_000 + n, tags=TIMER if n % 3 == 0 else {"n": str(n)})
    create(service, "later", ttl=10_000)
    create(service, "forever", ttl=None)
    create(service, "settled", ttl=500)
    resolve(service, "settled")
    sweeper = Sweeper(service, interval=60, batch_size=3)
    commits = wired.committer.stats.commits

    # Nothing overdue: no transaction at all. Then 10 overdue in batches of 3.
    assert sweeper.run_once(T0 + 999) == SweepCounts(expired=0, batches=0)
    assert wired.committer.stats.commits == commits
    assert sweeper.run_once(T0 + 2_000) == SweepCounts(expired=10, batches=4)
    assert wired.committer.stats.commits == commits + 4

    for n in range(10):
        row = store.get_promise(f"due-{n}")
        assert row is not None
        expected = PromiseState.RESOLVED if n % 3 == 0 else PromiseState.REJECTED_TIMEDOUT
        assert (row.state, row.settled_by, row.settle_time) == (
            expected,
            TIMEOUT_PRINCIPAL,
            T0 + 1_000 + n,
        )
    for still in ("later", "forever"):
        row = store.get_promise(still)
        assert row is not None and row.state is PromiseState.PENDING
    row = store.get_promise("settled")
    assert row is not None and row.state is PromiseState.RESOLVED and row.settled_by is None

    assert sweeper.run_once(T0 + 2_000) == SweepCounts(expired=0, batches=0)
    wired.clock.advance(10_000)
    assert sweeper.run_once() == SweepCounts(expired=1, batches=1)  # defaults to the clock
    assert store.expired_promise_ids(10**15, 100) == []


def test_a_long_sweep_takes_turns_with_waiting_requests(wired: Wired) -> None:
    for n in range(7):
        create(wired.service, f"due-{n}", ttl=1_000)
    asked: list[int] = []

    def others_waiting() -> bool:
        asked.append(wired.committer.stats.commits)
        return True

    sweeper = Sweeper(wired.service, interval=60, batch_size=3, others_waiting=others_waiting)
    commits = wired.committer.stats.commits
    assert sweeper.run_once(T0 + 2_000) == SweepCounts(expired=7, batches=3)
    # Asked after each full batch (then it paused as long as the batch took), not
    # after the last one: the sweep was over.
    assert asked == [commits + 1, commits + 2]
    assert not wired.committer.busy()


def test_sweeper_config_is_validated(wired: Wired) -> None:
    with pytest.raises(ValueError, match="positive"):
        Sweeper(wired.service, interval=0, batch_size=3)
    with pytest.raises(ValueError, match="positive"):
        Sweeper(wired.service, interval=1, batch_size=0)


# -- watch ----------------------------------------------------------------------------


def watch_in_thread(service: PromiseService, promise_id: str) -> tuple[Any, queue.Queue[Any]]:
    """Iterate service.watch_async(id) on an event loop of its own thread; items (then a
    None) arrive on the queue. Returns once the watch has subscribed."""
    items: queue.Queue[Any] = queue.Queue()
    subscribed: queue.Queue[PromiseWatch] = queue.Queue()

    async def run() -> None:
        watch = service.watch_async(promise_id)
        subscribed.put(watch)
        try:
            async for promise in watch:
                items.put(promise)
        except Exception as exc:
            items.put(exc)
        items.put(None)

    threading.Thread(
        target=asyncio.run, args=(run(),), name=f"watch-{promise_id}", daemon=True
    ).start()
    return subscribed.get(timeout=WAIT), items


def watched(service: PromiseService, promise_id: str) -> list[Promise]:
    """Everything service.watch_async(id) yields, on an event loop of this thread."""

    async def run() -> list[Promise]:
        return [promise async for promise in service.watch_async(promise_id)]

    return asyncio.run(run())


def test_watch_yields_current_then_settled(wired: Wired) -> None:
    service = wired.service
    pending, _ = create(service, "p")
    _, items = watch_in_thread(service, "p")
    assert items.get(timeout=WAIT) == pending
    settled, _ = resolve(service, "p", value=Payload({}, b"done"))
    assert items.get(timeout=WAIT) == settled
    assert items.get(timeout=WAIT) is None
    assert wired.hub._subscriptions == {}


def test_watch_of_a_settled_promise_yields_once(wired: Wired) -> None:
    create(wired.service, "p")
    settled, _ = resolve(wired.service, "p")
    assert watched(wired.service, "p") == [settled]


def test_watch_of_a_missing_promise_raises_not_found(wired: Wired) -> None:
    with pytest.raises(PromiseNotFound):
        watched(wired.service, "missing")
    assert wired.hub._subscriptions == {}


def test_watch_hears_a_timeout_from_the_sweeper(wired: Wired) -> None:
    service = wired.service
    pending, _ = create(service, "t", ttl=HOUR, tags=TIMER)
    _, items = watch_in_thread(service, "t")
    assert items.get(timeout=WAIT) == pending
    Sweeper(service, interval=60, batch_size=10).run_once(T0 + HOUR)
    fired = items.get(timeout=WAIT)
    assert (fired.state, fired.settled_by) == (PromiseState.RESOLVED, TIMEOUT_PRINCIPAL)
    assert items.get(timeout=WAIT) is None


def test_cancel_ends_a_waiting_watch(wired: Wired) -> None:
    pending, _ = create(wired.service, "p")
    watch, items = watch_in_thread(wired.service, "p")
    assert items.get(timeout=WAIT) == pending
    watch.cancel()
    assert items.get(timeout=WAIT) is None
    wait_until(lambda: wired.hub._subscriptions == {}, "the watch unsubscribed")
    # The promise is untouched and can still be settled.
    assert resolve(wired.service, "p")[1] is True


def test_stop_watches_ends_every_waiting_watch(wired: Wired) -> None:
    create(wired.service, "a")
    create(wired.service, "b")
    streams = [watch_in_thread(wired.service, i)[1] for i in ("a", "b", "a")]
    for items in streams:
        assert items.get(timeout=WAIT).state is PromiseState.PENDING
    wired.service.stop_watches()
    for items in streams:
        assert items.get(timeout=WAIT) is None


# -- the event-loop path (grpc.aio) ---------------------------------------------------


def test_async_submits_of_one_loop_iteration_share_a_commit(wired: Wired) -> None:
    service = wired.service
    commits_before = wired.committer.stats.commits

    async def main() -> list[Any]:
        requests = [
            CreateRequest(id=f"async-{n}", param=EMPTY, tags={}, ttl=HOUR) for n in range(20)
        ]
        return await asyncio.gather(*(service.create_async(r) for r in requests))

    results = asyncio.run(main())
    assert [created for _, created in results] == [True] * 20
    assert wired.committer.stats.commits == commits_before + 1
    assert wired.committer.stats.largest_batch >= 20


def test_async_settles_race_and_errors_arrive_as_exceptions(wired: Wired) -> None:
    service = wired.service
    create(service, "contested")

    async def main() -> list[Any]:
        settles = [
            service.settle_async(
                SettleRequest(id="contested", state=PromiseState.RESOLVED, value=EMPTY)
            )
            for _ in range(5)
        ]
        return await asyncio.gather(*settles, return_exceptions=True)

    outcomes = asyncio.run(main())
    applied = [o for o in outcomes if isinstance(o, tuple) and o[1]]
    refused = [o for o in outcomes if isinstance(o, PromiseAlreadySettled)]
    assert len(applied) == 1 and len(refused) == 4


def test_async_watch_sees_a_settle_from_another_thread(wired: Wired) -> None:
    service = wired.service
    create(service, "watched-async")

    async def main() -> list[PromiseState]:
        seen = []
        async for promise in service.watch_async("watched-async"):
            seen.append(promise.state)
            if len(seen) == 1:
                threading.Thread(target=resolve, args=(service, "watched-async")).start()
        return seen

    assert asyncio.run(asyncio.wait_for(main(), WAIT)) == [
        PromiseState.PENDING,
        PromiseState.RESOLVED,
    ]


def test_async_submit_after_stop_is_refused(wired: Wired) -> None:
    wired.committer.stop()

    async def main() -> None:
        await wired.service.create_async(CreateRequest(id="late", param=EMPTY, tags={}, ttl=HOUR))

    with pytest.raises(ShuttingDown):
        asyncio.run(main())


# -- what a settle reads before its write -------------------------------------------


def test_a_settle_reads_its_promise_only_after_the_writer_finds_a_policy_unchecked(
    wired: Wired, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A settle's first write reads and checks nothing first: a promise without an
    approver policy (most) is settled at once; one with a policy is refused by the
    writer (`PolicyNotChecked`), then read and checked, and only an approver's settle
    applies."""
    service, store = wired.service, wired.store
    reads: list[str] = []
    real_get = store.get_promise

    def counted(promise_id: str) -> Promise | None:
        reads.append(promise_id)
        return real_get(promise_id)

    monkeypatch.setattr(store, "get_promise", counted)
    create(service, "plain")
    assert resolve(service, "plain")[1]
    with pytest.raises(PromiseNotFound):
        resolve(service, "missing")
    assert reads == []

    policy = Approvers(principals=frozenset({"ana"}))
    asyncio.run(
        service.create_async(CreateRequest("guarded", EMPTY, {}, ttl=HOUR, approvers=policy))
    )

    def by(name: str) -> tuple[Promise, bool]:
        request = SettleRequest("guarded", PromiseState.RESOLVED, EMPTY, principal=name)
        settled = asyncio.run(
            service.settle_async(request, caller=Principal(name, frozenset({Role.GATEWAY})))
        )
        return settled.promise, settled.applied

    with pytest.raises(NotAnApprover):
        by("bob")
    assert reads == ["guarded"]  # after the writer's refusal, not before
    settled, applied = by("ana")
    assert applied and settled.settled_by == "ana"
    assert reads == ["guarded", "guarded"]
