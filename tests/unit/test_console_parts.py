"""The console's small parts: the tasks' rows, the client cache, its flags."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from troth.v1 import tasks_pb2
from troth_server.console._clients import ANONYMOUS, ClientCache, Identity
from troth_server.console._config import ConsoleSettings, settings_from
from troth_server.console._views import task_rows

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _task(state: int, **fields: object) -> tasks_pb2.Task:
    task = tasks_pb2.Task(root_promise_id="wf-1", kind=1, state=state, workflow="publish")
    for name, value in fields.items():
        setattr(task, name, value)
    task.create_time.FromDatetime((NOW - timedelta(minutes=5)).replace(tzinfo=None))
    return task


def test_task_rows_say_who_holds_a_claimed_task_and_why_a_pending_one_waits() -> None:
    claimed = _task(2, worker_id="w-7", waiting_for="")
    pending = _task(1, waiting_for="waiting for a worker of group g")
    rows = task_rows([claimed, pending], NOW)
    assert [(r.kind, r.state, r.worker, r.age) for r in rows] == [
        ("invoke", "claimed", "w-7", "5m"),
        ("invoke", "pending", "waiting for a worker of group g", "5m"),
    ]


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
