"""The claim's order, on SQLite and PostgreSQL: a worker's own resumes first, then
tasks preferred for nobody, then those preferred for another worker, oldest first
within each; tasks in a retry backoff only once it is over. The claim runs one probe
per kind (each in the order of its own index, tests/store/test_scale_plans.py) and
merges them: the merge must be the one order over every claimable task. A stream that
lists its workflows reads each key of its route (revision 0014) and merges those too:
it takes exactly what `Route.accepts` allows, in the same order."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from troth_server.domain import routing
from troth_server.domain.task import Task, TaskKind, TaskState
from troth_server.store._task_sql import MAX_ROUTE_KEYS, route_keys

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


# -- by route: what `Route.accepts` allows, in the one order ----------------------------

NAMES = ["publish", "billing", "typo", None]
VERSIONS = ["v1", "v2", None]
_groups = itertools.count()

task_st = st.tuples(
    st.sampled_from(NAMES),
    st.sampled_from(VERSIONS),
    st.sampled_from([None, ME, "other"]),
    st.sampled_from([None, -1000, +60_000]),
)
stream_st = st.lists(
    st.tuples(st.sampled_from(["publish", "billing"]), st.sampled_from(["v1", "v2"])),
    min_size=0,
    max_size=3,
)


def _routes(group: str, streams: list[list[tuple[str, str]]]) -> list[routing.Route]:
    """The routes of a group's streams connected in this order."""
    deployments = routing.Deployments()
    registrations = [routing.registration(s) for s in streams]
    for registration in registrations:
        deployments.register(group, registration)
    return routing.routes(group, registrations, deployments)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    kinds=st.lists(task_st, min_size=0, max_size=14),
    streams=st.lists(stream_st, min_size=1, max_size=3),
    limit=st.integers(min_value=1, max_value=6),
    worker=st.sampled_from([ME, "other", "w-new"]),
)
def test_a_claim_by_route_takes_what_the_route_accepts_in_the_one_order(
    store: Store,
    kinds: list[tuple[str | None, str | None, str | None, int | None]],
    streams: list[list[tuple[str, str]]],
    limit: int,
    worker: str,
) -> None:
    group = f"h{next(_groups)}"  # a group of its own per example: the store is shared
    made = []
    for n, (workflow, version, preferred, next_attempt) in enumerate(kinds):
        task = Task(
            id=f"{group}-{n}",
            root_promise_id=f"{group}-root-{n}",
            group=group,
            kind=TaskKind.RESUME,
            state=TaskState.PENDING,
            counter=1,
            preferred_worker_id=preferred,
            workflow=workflow,
            workflow_version=version,
            failed_attempts=0 if next_attempt is None else 1,
            next_attempt_time=None if next_attempt is None else NOW + next_attempt,
        )
        created = NOW - 100_000 + n
        store.write(lambda tx, t=task, at=created: tx.insert_tasks([t], at))
        made.append((task, created))
    rank = {worker: 0, None: 1}
    for route in _routes(group, streams):
        assert route.any_task or len(route_keys(route)) <= MAX_ROUTE_KEYS  # by index
        got = store.write(lambda tx, r=route: tx.pending_tasks(group, worker, limit, r, now=NOW))
        claimable = [
            (t, at)
            for t, at in made
            if (t.next_attempt_time is None or t.next_attempt_time <= NOW)
            and route.accepts(t.workflow, t.workflow_version)
        ]
        claimable.sort(key=lambda pair: (rank.get(pair[0].preferred_worker_id, 2), pair[1]))
        assert [t.id for t in got] == [t.id for t, _ in claimable[:limit]], route
