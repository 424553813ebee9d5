"""The server's capacity limits in process: the admission gates and their counters, the
once-a-second overload report, the group committer's queued-writes limit (on a real
SQLite file), and the status a refusal is answered with."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs
from test_group_commit_service import WAIT, FakeClock, Gate, wait_until

from troth._grpc_args import (
    ARG_SERVER_MAX_PENDING_REQUESTS,
    ARG_SERVER_MAX_PENDING_REQUESTS_HARD_LIMIT,
    ARG_SERVER_MAX_UNREQUESTED_TIME_IN_SERVER_SECONDS,
)
from troth.errors import Reason
from troth_server.api._admission import Admission, OverloadReport, backlog_options
from troth_server.api._status import status_for
from troth_server.domain.errors import Overloaded
from troth_server.domain.promise import EMPTY, CreateRequest
from troth_server.service import PromiseService
from troth_server.store import Store, open_store
from troth_server.watch import WatchHub
from troth_server.writes.group_commit import GroupCommitter, drain_estimate_ms
from troth_server.writes.ops.create import CreateOp

# -- the gates -------------------------------------------------------------------------------


def test_each_gate_admits_up_to_its_limit_and_the_other_is_untouched() -> None:
    admission = Admission.with_limits(max_concurrent_rpcs=3, max_streams=2)
    assert [admission.unary.try_enter() for _ in range(4)] == [True, True, True, False]
    # Unary calls at their limit leave every stream slot free, and the other way round.
    assert [admission.streams.try_enter() for _ in range(3)] == [True, True, False]
    admission.unary.leave()
    assert admission.unary.try_enter()
    assert not admission.streams.try_enter()
    admission.streams.leave()
    assert admission.streams.try_enter()


def test_refusals_are_counted_per_rpc_and_reported_once() -> None:
    admission = Admission.with_limits(1, 1)
    for method in ["CreatePromise", "CreatePromise", "Poll"]:
        admission.refused(method)
    assert admission.take_report() == {"CreatePromise": 2, "Poll": 1}
    assert admission.take_report() is None  # nothing new since
    admission.refused("Poll")
    assert admission.take_report() == {"Poll": 1}
    assert admission.refused_total == {"CreatePromise": 2, "Poll": 2}


def test_the_report_logs_one_line_with_counts_and_nothing_when_quiet() -> None:
    admission = Admission.with_limits(8, 4)
    report = OverloadReport(admission, queued_writes=lambda: 7, queue_limit=16)
    with capture_logs() as logs:
        report.report()  # quiet: no line
        for _ in range(500):
            admission.refused("GetPromise")
        report.report()
        report.report()
    assert len(logs) == 1
    (line,) = logs
    assert line["event"] == "overload" and line["log_level"] == "warning"
    assert line["refused"] == {"GetPromise": 500}
    assert line["refused_total"] == {"GetPromise": 500}
    assert line["queued_writes"] == 7
    assert line["limits"] == {
        "max-concurrent-rpcs": 8,
        "max-streams": 4,
        "max-queue-delay": 1000,
        "max-queued-writes": 16,
    }


def test_the_report_runs_on_the_loop_and_flushes_at_stop() -> None:
    admission = Admission.with_limits(8, 4)

    async def main() -> None:
        report = OverloadReport(admission, interval=0.01)
        report.start()
        admission.refused("CreatePromise")
        while admission.refused_total["CreatePromise"] and admission._since_report:
            await asyncio.sleep(0.005)  # the report takes it within an interval
        admission.refused("Poll")
        await report.stop()

    with capture_logs() as logs:
        asyncio.run(asyncio.wait_for(main(), WAIT))
    assert logs[0]["refused"] == {"CreatePromise": 1}
    assert logs[-1]["refused"] == {"Poll": 1}


def test_core_backlog_leaves_room_beyond_what_the_gates_admit() -> None:
    options = dict(backlog_options(1000, 1000))
    assert options[ARG_SERVER_MAX_PENDING_REQUESTS] >= 20_000
    assert (
        options[ARG_SERVER_MAX_PENDING_REQUESTS_HARD_LIMIT]
        == options[ARG_SERVER_MAX_PENDING_REQUESTS]
    )
    assert dict(backlog_options(10_000, 5_000))[ARG_SERVER_MAX_PENDING_REQUESTS] == 150_000
    # Core never cancels a call for waiting (it would answer CANCELLED after 30 s, unlogged).
    assert options[ARG_SERVER_MAX_UNREQUESTED_TIME_IN_SERVER_SECONDS] >= 3600


# -- the answer --------------------------------------------------------------------------------


def test_a_refusal_is_resource_exhausted_with_error_info_and_retry_info() -> None:
    refusal = Admission.with_limits(8, 4).unary.refusal()
    status = status_for(refusal)
    assert status.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max-concurrent-rpcs=8" in status.details and "retry" in status.details
    ((_key, raw),) = status.trailing_metadata
    details = status_pb2.Status.FromString(raw).details
    info, retry = error_details_pb2.ErrorInfo(), error_details_pb2.RetryInfo()
    assert details[0].Unpack(info) and details[1].Unpack(retry)
    assert info.reason == Reason.OVERLOADED and info.metadata["limit"] == "max-concurrent-rpcs"
    assert retry.retry_delay.ToMilliseconds() == refusal.retry_after_ms > 0


@given(st.integers(0, 1_000_000), st.integers(1, 10_000), st.floats(0.0, 10_000.0))
def test_a_write_refusals_delay_is_bounded(queued: int, batch: int, commit_ms: float) -> None:
    assert 20 <= drain_estimate_ms(queued, batch, commit_ms) <= 2000


# -- the queued-writes limit ---------------------------------------------------------------------


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[tuple[GroupCommitter, PromiseService, Store]]:
    clock = FakeClock()
    store = open_store(f"sqlite:///{tmp_path}/t.db")
    committer = GroupCommitter(store, clock, on_commit=lambda changes: None, max_queued=3)
    service = PromiseService(store, committer, WatchHub(), clock)
    committer.start()
    yield committer, service, store
    committer.stop()
    store.close()


def _hold_writer(committer: GroupCommitter) -> tuple[Gate, threading.Thread]:
    gate = Gate()
    holder = threading.Thread(target=committer.submit, args=(gate,))
    holder.start()
    assert gate.entered.wait(WAIT)
    return gate, holder


def test_writes_beyond_the_queue_limit_are_refused_and_the_rest_commit(
    limited: tuple[GroupCommitter, PromiseService, Store],
) -> None:
    committer, service, store = limited
    gate, holder = _hold_writer(committer)

    async def main() -> list[Any]:
        creates = [
            service.create_async(CreateRequest(f"q-{n}", EMPTY, {}, ttl=60_000)) for n in range(10)
        ]
        pending = asyncio.gather(*creates, return_exceptions=True)
        # Every create is queued or refused (the writer is held): wait for the queue.
        deadline = time.monotonic() + WAIT
        while committer.queued < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        assert committer.queued == 3
        gate.release.set()
        return list(await pending)

    outcomes = asyncio.run(asyncio.wait_for(main(), WAIT))
    holder.join(WAIT)
    accepted = [o for o in outcomes if isinstance(o, tuple)]
    refused = [o for o in outcomes if isinstance(o, Overloaded)]
    assert len(accepted) == 3 and len(refused) == 7
    assert all(created for _, created in accepted)
    assert committer.stats.refused == 7
    for refusal in refused:
        assert refusal.limit == "max-queued-writes"
        assert refusal.metadata == {"limit": "max-queued-writes"}
        assert 20 <= refusal.retry_after_ms <= 2000
        assert "--max-queued-writes=3" in refusal.message
    # Nothing of a refused write reached the store.
    refused_ids = [f"q-{n}" for n, o in enumerate(outcomes) if isinstance(o, Overloaded)]
    assert [store.get_promise(i) for i in refused_ids] == [None] * 7
    assert committer.queued == 0


def test_the_servers_own_writes_are_never_refused(
    limited: tuple[GroupCommitter, PromiseService, Store],
) -> None:
    # Sweeps, claims and lease expiry come through `submit`: past the limit, still queued.
    committer, _service, _store = limited
    gate, holder = _hold_writer(committer)
    results: list[Any] = []
    threads = [
        threading.Thread(
            target=lambda n=n: results.append(
                committer.submit(CreateOp(CreateRequest(f"own-{n}", EMPTY, {}, ttl=60_000), None))
            )
        )
        for n in range(8)
    ]
    for thread in threads:
        thread.start()
    wait_until(lambda: committer.queued == 8, "8 writes are queued")
    gate.release.set()
    for thread in threads:
        thread.join(WAIT)
    holder.join(WAIT)
    assert len(results) == 8 and all(created for _, created in results)
    assert committer.stats.refused == 0
