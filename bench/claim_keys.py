"""What a claim costs by the size of its stream's route (issue 29, the route in the index).

A stream that lists its workflows claims by its route's keys (`store/_task_sql.py`
`route_keys`): a branch per (workflow, version) it runs, per workflow whose newest
version it runs, one for tasks without a workflow name and one per range of names
no stream lists. Past `MAX_ROUTE_KEYS` keys the route is a filter on the age-ordered
indexes instead. This measures the claim (`pending_tasks` in a write transaction,
as the writer runs it, through the store) for routes of 1 to 10 workflows, with a
backlog the route refuses, older than everything it may take:

- 100,000 PENDING tasks of workflow `gone` at version `v0`, which no stream lists;
- 50 PENDING tasks of each workflow the route runs, at its version.

Each figure is the median and p99 of `--runs` claims of 10 (nothing is written: the
claim's read, its rows locked, then the commit).

Usage::

    .venv/bin/python bench/claim_keys.py [--targets sqlite,pg] [--runs 300] [--backlog 100000]
        [--max-keys N]  # read up to N keys by index (what another bound would cost)
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from _servers import PG_ADMIN_URL, Database

from troth_server.domain import routing
from troth_server.domain.task import TaskKind
from troth_server.domain.task import create as create_task
from troth_server.store import Store, _task_sql, open_store
from troth_server.store._task_sql import MAX_ROUTE_KEYS, route_keys

GROUP = "g"
NOW = 1_800_000_000_000
WORKFLOWS = (1, 2, 4, 7, 8, 12, 16, 21, 22)


def _seed(db: Database, store: Store, backlog: int) -> None:
    # The backlog in bulk, as `bench/scale.py` seeds; then the claimable tasks.
    counter = f"WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {backlog})"
    false = "0" if db.kind == "sqlite" else "false"
    sql = f"""INSERT INTO tasks (id, root_promise_id, "group", kind, state, counter,
        resume_pending, create_time, workflow, workflow_version, failed_attempts) {counter}
        SELECT 'gone-' || n, 'gone-root-' || n, '{GROUP}', 'INVOKE', 'PENDING', 0, {false},
          {NOW} - 10000000 + n, 'gone', 'v0', 0 FROM g"""
    if db.kind == "sqlite":
        assert db.path is not None
        with sqlite3.connect(db.path) as conn:
            conn.execute(sql)
            conn.execute("ANALYZE")
    else:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{db.schema}"')
            conn.execute(sql.encode())
            conn.execute(b"VACUUM ANALYZE tasks")
    made = [
        create_task(
            f"w{w}-{n}",
            f"w{w}-root-{n}",
            GROUP,
            TaskKind.INVOKE,
            workflow=f"wf{w}",
            workflow_version="v1",
        )
        for w in range(max(WORKFLOWS))
        for n in range(50)
    ]
    store.write(lambda tx: tx.insert_tasks(made, NOW - 1000))


def _route(workflows: int) -> routing.Route:
    (route,) = routing.routes(
        GROUP,
        [routing.registration([(f"wf{w}", "v1") for w in range(workflows)])],
        routing.Deployments(),
    )
    return route


def _measure(store: Store, route: routing.Route, runs: int) -> tuple[float, float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        found = store.write(lambda tx: tx.pending_tasks(GROUP, "w", 10, route, NOW))
        times.append((time.perf_counter() - started) * 1000)
        assert len(found) == 10
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.99) - 1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default="sqlite,pg")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument(
        "--max-keys", type=int, default=None, help="read up to this many keys by index"
    )
    args = parser.parse_args()
    limit = MAX_ROUTE_KEYS
    if args.max_keys is not None:  # what the bound would cost elsewhere
        limit = _task_sql.MAX_ROUTE_KEYS = args.max_keys
    print("store   workflows  keys  how          claim p50 ms  claim p99 ms")
    for target in args.targets.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            db = Database("sqlite" if target == "sqlite" else "postgresql", Path(tmp))
            store = open_store(db.url, migrate=True)
            try:
                _seed(db, store, args.backlog)
                for workflows in WORKFLOWS:
                    route = _route(workflows)
                    keys = len(route_keys(route))
                    how = "by index" if keys <= limit else "filtered"
                    _measure(store, route, 20)  # warm: compiled, prepared
                    p50, p99 = _measure(store, route, args.runs)
                    row = f"{target:<7} {workflows:>9}  {keys:>4}  {how:<11}"
                    print(f"{row}  {p50:>12.2f}  {p99:>12.2f}")
                    sys.stdout.flush()
            finally:
                store.close()
                db.drop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
