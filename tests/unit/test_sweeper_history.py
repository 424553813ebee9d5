"""The sweeper keeps history from growing: completed tasks go after their keeping,
settled promises after the retention (a real SQLite store, a frozen clock)."""

from __future__ import annotations

import asyncio

from test_group_commit_service import HOUR, T0, Wired, create, resolve, wired  # noqa: F401

from troth_server.domain.promise import EMPTY, PromiseState, SettleRequest
from troth_server.domain.task import COMPLETED_KEPT_MS
from troth_server.sweeper import Sweeper
from troth_server.task_service import TaskService

DAY_MS = 24 * HOUR


def test_the_sweeper_forgets_completed_tasks_and_prunes_after_the_retention(
    wired: Wired,  # noqa: F811 (the fixture)
) -> None:
    tasks = TaskService(wired.store, wired.committer, wired.clock)
    create(wired.service, "wf", tags={"troth:invoke": "g", "troth:func": "f"}, ttl=None)
    create(wired.service, "alone", ttl=None)
    resolve(wired.service, "alone")
    (claimed,) = tasks.claim("g", "w", 1, 10_000)
    outcome = SettleRequest("wf", PromiseState.RESOLVED, EMPTY)
    asyncio.run(tasks.complete_async(claimed.task.id, claimed.task.counter, "w", outcome))
    sweeper = Sweeper(
        wired.service,
        interval=60,
        batch_size=10,
        retention_ms=DAY_MS,
        forget_completed=tasks.forget_completed,
    )
    wired.clock.advance(COMPLETED_KEPT_MS - 1)
    assert sweeper.run_once(wired.clock()).forgotten_tasks == 0
    wired.clock.advance(2)
    assert sweeper.run_once(wired.clock()).forgotten_tasks == 1
    assert wired.store.write(lambda tx: tx.get_tasks([claimed.task.id])) == {}

    assert sweeper.run_once(T0 + DAY_MS - 1).pruned == 0  # younger than the retention
    assert sweeper.run_once(T0 + DAY_MS + COMPLETED_KEPT_MS).pruned == 2
    assert wired.store.get_promises(["wf", "alone"]) == []
