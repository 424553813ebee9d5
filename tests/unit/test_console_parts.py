"""The console's small parts: the tasks' rows, the client cache, its flags."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from troth import TaskInfo, TaskKind, TaskState, WorkerInfo
from troth_server.console._clients import ANONYMOUS, ClientCache, Identity
from troth_server.console._config import ConsoleSettings, settings_from
from troth_server.console._filters import filters_from
from troth_server.console._views import (
    Pause,
    VersionWait,
    Who,
    pause,
    settler,
    task_rows,
    version_wait,
    worker_rows,
)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _task(state: TaskState, worker_id: str | None, waiting_for: str | None) -> TaskInfo:
    return TaskInfo(
        id="t-1", root_id="wf-1", group="g", kind=TaskKind.INVOKE, state=state, counter=1,
        worker_id=worker_id, lease_expire_time=None, workflow="publish",
        workflow_version="v1", create_time=NOW - timedelta(minutes=5),
        waiting_for=waiting_for, worker_principal=None,
    )  # fmt: skip


def test_task_rows_say_who_holds_a_claimed_task_and_why_a_pending_one_waits() -> None:
    claimed = _task(TaskState.CLAIMED, "w-7", None)
    pending = _task(TaskState.PENDING, "w-6", "waiting for a worker of group g")
    rows = task_rows([claimed, pending], NOW)
    assert [(r.kind, r.state, r.worker, r.age) for r in rows] == [
        ("invoke", "claimed", "w-7", "5m"),
        ("invoke", "pending", "waiting for a worker of group g", "5m"),
    ]


def test_a_run_waiting_for_its_version_is_said_from_its_task_else_from_the_settle() -> None:
    words = "waiting for a worker of group 'g' running workflow 'publish' version 'v1' (...)"
    absent = replace(_task(TaskState.PENDING, None, words), version_absent_since=NOW)
    assert version_wait(absent, "") == VersionWait(words, movable=True)
    assert version_wait(None, words) == VersionWait(words, movable=False)  # a gateway's view
    busy = _task(TaskState.PENDING, None, "waiting for a free worker of group 'g' (...)")
    assert version_wait(busy, "") is None
    assert version_wait(None, "") is None


def test_a_failed_task_is_a_pause_with_its_error_attempts_traceback_and_next_retry() -> None:
    pending = replace(
        _task(TaskState.PENDING, None, "retrying after a failure"),
        failed_attempts=6, last_error="NameError: name 'x' is not defined",
        last_traceback="Traceback...", next_attempt_time=NOW + timedelta(minutes=4),
    )  # fmt: skip
    assert pause(pending, NOW) == Pause(
        6, "NameError: name 'x' is not defined", "Traceback...",
        "2026-03-01 12:04:00 UTC, in 4m", retrying=False,
    )  # fmt: skip
    due = pause(pending, NOW + timedelta(minutes=5))
    assert due is not None and due.next_retry.endswith(", now")
    retrying = pause(replace(pending, state=TaskState.CLAIMED), NOW)
    assert retrying is not None and retrying.retrying and retrying.next_retry == ""
    assert pause(_task(TaskState.PENDING, None, None), NOW) is None  # never failed
    assert pause(None, NOW) is None


def test_who_settled_is_split_from_what_it_came_through() -> None:
    assert settler("bob via settle-token k1:abc") == Who("bob", "settle-token k1:abc")
    assert settler("alice") == Who("alice", "")
    assert settler("") == Who("", "")


def test_worker_rows_show_versions_held_tasks_and_heartbeats_in_words() -> None:
    worker = WorkerInfo(
        worker_id="w-7", group="g", principal=None, workflows=(("publish", "1f2e"),),
        capacity=16, task_ids=("t-1", "t-2"), connect_time=NOW - timedelta(hours=2),
        last_heartbeat_time=NOW - timedelta(seconds=3), streams=1, stalled=False,
    )  # fmt: skip
    (row,) = worker_rows([worker], NOW)
    assert (row.workflows, row.held, row.connected, row.heartbeat, row.principal) == (
        "publish 1f2e", "2 / 16", "2h ago", "3s ago", "",
    )  # fmt: skip


def test_the_cache_keeps_one_client_per_identity_and_closes_the_evicted() -> None:
    cache = ClientCache(ConsoleSettings(server="127.0.0.1:1"), size=2)
    try:
        ada, bob, cy = (Identity(name=n) for n in ("ada", "bob", "cy"))
        first = cache.client(ada)
        assert cache.client(ada) is first
        assert cache.client(bob) is not first
        cache.client(cy)  # ada is the least recently used: closed and dropped
        assert cache.client(ada) is not first
        assert cache.client(ANONYMOUS).principal is None
    finally:
        cache.close()


def test_an_identity_never_shows_its_token() -> None:
    who = Identity(token="tr_alice_s3cret")
    assert "s3cret" not in repr(who) and "s3cret" not in who.key()
    assert who.signed_in and not ANONYMOUS.signed_in


def test_the_flags() -> None:
    settings = settings_from(["--listen", "0.0.0.0:9000", "--server", "h:7070", "--tls"])
    assert (settings.host, settings.port, settings.server) == ("0.0.0.0", 9000, "h:7070")
    assert settings.tls is not None
    assert settings_from([]).listen == "127.0.0.1:7080"
    with pytest.raises(SystemExit):
        settings_from(["--listen", "7080"])


def test_the_workflow_filters_are_read_from_the_query_and_written_back() -> None:
    filters = filters_from({"state": "pending", "group": " g ", "paused": "1",
                            "after": "2026-05-28T09:30", "page": "2"})  # fmt: skip
    assert not filters.errors
    arguments = filters.arguments()
    assert arguments["states"] == ["PENDING"] and arguments["group"] == "g"
    assert arguments["paused"] is True and arguments["waiting_for_human"] is False
    assert arguments["created_after"] == datetime(2026, 5, 28, 9, 30, tzinfo=UTC)
    assert arguments["created_before"] is None and arguments["id"] is None
    assert filters.query(3) == "state=PENDING&group=g&paused=1&after=2026-05-28T09%3A30&page=3"
    assert filters.query(0).endswith("09%3A30") and filters.any
    assert not filters_from({}).any


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ({"state": "done"}, "state 'DONE' is not one of PENDING, RESOLVED"),
        ({"before": "last week"}, "started before 'last week' is not a date and time"),
    ],
)
def test_a_filter_that_cannot_be_read_is_named(query: dict[str, str], words: str) -> None:
    errors = filters_from(query).errors
    assert len(errors) == 1 and errors[0].startswith(words), errors
