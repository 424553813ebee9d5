"""The claim's order, on SQLite and PostgreSQL: a worker's own resumes first, then
tasks preferred for nobody, then those preferred for another worker, oldest first
within each; tasks in a retry backoff only once it is over. The claim runs one probe
per kind (each in the order of its own index, tests/store/test_scale_plans.py) and
merges them: the merge must be the one order over every claimable task."""

from __future__ import annotations

from typing import TYPE_CHECKING

from troth_server.domain.task import Task, TaskKind, TaskState

if TYPE_CHECKING:
    from troth_server.store import Store

NOW = 1_800_000_000_000
ME = "me"


# Each kind of task, as (preferred worker, next attempt time relative to NOW).
KINDS = {
    "mine": (ME, None),
    "anyone": (None, None),
    "other": ("other", None),
    "due-anyone": (None, -1000),
    "due-mine": (ME, -500),
    "backoff": (None, +60_000),
    "backoff-mine": (ME, +60_000),
}


def _seed(store: Store) -> None:
    """Three tasks of each kind, their ages interleaved across kinds (created one ms
    apart, in a shuffled but fixed order)."""
    order = [kind for _ in range(3) for kind in KINDS]
    order = order[5:] + order[:5]
    for n, kind in enumerate(order):
        preferred, next_attempt = KINDS[kind]
        task = Task(
            id=f"{kind}-{n}",
            root_promise_id=f"root-{n}",
            group="g",
            kind=TaskKind.RESUME,
            state=TaskState.PENDING,
            counter=1,
            preferred_worker_id=preferred,
            failed_attempts=0 if next_attempt is None else 1,
            next_attempt_time=None if next_attempt is None else NOW + next_attempt + n,
        )
        created = NOW - 100_000 + n
        store.write(lambda tx, t=task, at=created: tx.insert_tasks([t], at))


def test_a_claim_takes_its_tasks_in_the_one_order_whatever_its_size(store: Store) -> None:
    _seed(store)
    every = store.write(lambda tx: tx.pending_tasks("g", ME, 100, now=NOW))
    claimable = [t for t in every if t.id.split("-")[0] != "backoff"]
    assert len(every) == len(claimable) == 15  # no task in its backoff
    rank = {ME: 0, None: 1}
    expected = sorted(claimable, key=lambda t: (rank.get(t.preferred_worker_id, 2), t.create_time))
    assert [t.id for t in every] == [t.id for t in expected]
    for limit in range(1, 16):
        got = store.write(lambda tx, n=limit: tx.pending_tasks("g", ME, n, now=NOW))
        assert [t.id for t in got] == [t.id for t in expected[:limit]], limit


def test_another_worker_sees_its_own_resumes_first_and_mine_last(store: Store) -> None:
    _seed(store)
    got = store.write(lambda tx: tx.pending_tasks("g", "other", 100, now=NOW))
    kinds = [t.id.rsplit("-", 1)[0] for t in got]
    firsts = list(dict.fromkeys(kinds))
    assert kinds[:3] == ["other"] * 3
    assert set(firsts[1:3]) == {"anyone", "due-anyone"}
    assert set(kinds[-6:]) == {"mine", "due-mine"}


def test_a_task_in_its_backoff_is_claimable_once_it_is_over(store: Store) -> None:
    _seed(store)
    later = NOW + 120_000
    got = store.write(lambda tx: tx.pending_tasks("g", ME, 100, now=later))
    assert len(got) == 21
    assert {t.id.rsplit("-", 1)[0] for t in got[:6]} == {"mine", "due-mine", "backoff-mine"}
