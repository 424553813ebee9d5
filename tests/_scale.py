"""A database the size of a year's use, seeded in bulk once per test run.

`seed(url)` fills a migrated, empty store (SQLite file or PostgreSQL schema) by
`INSERT ... SELECT` over a recursive counter, the same SQL on both, then runs
ANALYZE so that the planners see the real statistics:

- promises (~322k): 100k finished workflows (a root and one step each, parent
  links, `troth:invoke`/`troth:func` tags and a `team` of ten), 90k standalone
  settled promises (RESOLVED, REJECTED, a few REJECTED_TIMEDOUT; 10k of them
  under the tenant prefix `acme/`), 30k PENDING ones (an inbox, far deadlines)
  and 2k PENDING ones past their deadline (the sweeper's work);
- tasks (~152k): 100k PENDING tasks of group `backlog` that prefer no worker,
  1k that prefer another worker, 200 that prefer `w-me`, 100 paused ones (80
  waiting out a backoff, 20 past it), and 50k COMPLETED tasks of group `done`;
- callbacks: 30k, on the pending inbox promises;
- tasks of group `routes`, for a stream that lists its workflows (`ROUTE`): 100k
  it cannot take, oldest first (50k of `approve` at `v1`, a version no stream
  runs; 30k of `retired` at `v0`, a workflow no stream lists; 20k unversioned
  starts of `approve`, whose newest version another stream runs; 5k of `approve`
  at `v1` past a retry backoff), then the few it can (`ROUTE_TAKES`).
- the tag index's rows of every promise (`promise_tags`), as the store writes them.

`seed_backlog(url)` fills another store with a backlog of workflows not yet started
(as `bench/scale.py`'s case (b)): 200k PENDING roots without a step, and 20
workflows waiting for a human (a PENDING approval and a settled `run` step each),
so that nearly every promise has no parent.

Times are epoch ms around `NOW`; ids are `<kind>-<n>`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

NOW = 1_800_000_000_000
"""The seeded world's present (epoch ms): deadlines of the inbox lie after it."""

BACKLOG_GROUP = "backlog"
ME = "w-me"
ROOTS = 100_000
STANDALONE = 90_000
INBOX = 30_000
OVERDUE = 2_000
BACKLOG = 100_000
PREFERRED_ELSEWHERE = 1_000
PREFERRED_ME = 200
PAUSED = 100
COMPLETED = 50_000
RESUMES_GROUP = "resumes"
RESUMES = 5_000
ROUTES_GROUP = "routes"
ROUTE_REFUSED = 105_000
ROUTE_TAKES = 300
"""Tasks of `routes` the stream of `ROUTE` may take: `approve` at `v2` (for nobody,
for it, for another worker, past a backoff), unversioned `report`, unversioned ones
of a workflow no stream lists (`typo`) and without a workflow name."""
ACME = STANDALONE // 9
"""Standalone promises under the tenant prefix `acme/` (one in nine)."""
TIMEDOUT_EVERY = 450
"""One standalone promise in this many is REJECTED_TIMEDOUT (200 of them): a rare state."""


@dataclass(frozen=True)
class _Dialect:
    json: str  # a JSON text expression as the tags column's type
    false: str
    blob: str  # an empty payload

    def j(self, expr: str) -> str:
        return self.json % expr


_SQLITE = _Dialect(json="%s", false="0", blob="X''")
_PG = _Dialect(json="CAST(%s AS jsonb)", false="false", blob="''")


def _counter(n: int) -> str:
    return f"WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {n})"


_PROMISE_COLUMNS = (
    "id, state, param_headers, param_data, value_headers, value_data, tags, timer,"
    " create_time, settle_time, expire_time, settled_by, root_id, parent_id,"
    " workflow_group, workflow_name"
)


def _statements(d: _Dialect) -> list[str]:
    team = "'\"team\": \"t' || (n % 10) || '\"'"
    workflow_tags = d.j(
        '\'{"troth:invoke": "done", "troth:func": "approve", \' || ' + team + " || '}'"
    )
    step_tags = d.j('\'{"troth:kind": "run"}\'')
    plain_tags = d.j("'{' || " + team + " || '}'")
    empty = d.j("'{}'")
    settled_state = (
        f"CASE WHEN n % {TIMEDOUT_EVERY} = 0 THEN 'REJECTED_TIMEDOUT'"
        " WHEN n % 7 = 0 THEN 'REJECTED' ELSE 'RESOLVED' END"
    )
    return [
        # Finished workflows: the roots...
        f"""INSERT INTO promises ({_PROMISE_COLUMNS}) {_counter(ROOTS)}
            SELECT 'wf-' || n, 'RESOLVED', {empty}, {d.blob}, {empty}, {d.blob}, {workflow_tags},
              {d.false}, {NOW} - 90000000 + n * 100, {NOW} - 90000000 + n * 100 + 50,
              {NOW} + 86400000, 'w', NULL, NULL, 'done', 'approve' FROM g""",
        # ...and one step each.
        f"""INSERT INTO promises ({_PROMISE_COLUMNS}) {_counter(ROOTS)}
            SELECT 'wf-' || n || '.0', 'RESOLVED', {empty}, {d.blob}, {empty}, {d.blob},
              {step_tags},
              {d.false}, {NOW} - 90000000 + n * 100 + 10, {NOW} - 90000000 + n * 100 + 20,
              {NOW} + 86400000, 'w', 'wf-' || n, 'wf-' || n, NULL, NULL FROM g""",
        # Standalone settled promises, a tenth of them under a tenant's prefix.
        f"""INSERT INTO promises ({_PROMISE_COLUMNS}) {_counter(STANDALONE)}
            SELECT CASE WHEN n % 9 = 0 THEN 'acme/p-' ELSE 'p-' END || n, {settled_state},
              {empty}, {d.blob}, {empty}, {d.blob}, {plain_tags}, {d.false},
              {NOW} - 80000000 + n * 100,
              {NOW} - 80000000 + n * 100 + 70, {NOW} - 80000000 + n * 100 + 60000, 'u',
              NULL, NULL, NULL, NULL FROM g""",
        # The inbox: PENDING promises with far deadlines.
        f"""INSERT INTO promises ({_PROMISE_COLUMNS}) {_counter(INBOX)}
            SELECT 'inbox-' || n, 'PENDING', {empty}, {d.blob}, {empty}, {d.blob}, {plain_tags},
              {d.false}, {NOW} - 1000000 + n, NULL, {NOW} + 3600000 + n * 1000, NULL,
              NULL, NULL, NULL, NULL FROM g""",
        # PENDING promises past their deadline: the sweeper's next batches.
        f"""INSERT INTO promises ({_PROMISE_COLUMNS}) {_counter(OVERDUE)}
            SELECT 'overdue-' || n, 'PENDING', {empty}, {d.blob}, {empty}, {d.blob}, {plain_tags},
              {d.false}, {NOW} - 900000 + n, NULL, {NOW} - 600000 + n, NULL,
              NULL, NULL, NULL, NULL FROM g""",
        # The backlog of one group, oldest first by create_time.
        f"""INSERT INTO tasks (id, root_promise_id, "group", kind, state, counter,
              preferred_worker_id, resume_pending, create_time, workflow, failed_attempts,
              next_attempt_time) {_counter(BACKLOG + PREFERRED_ELSEWHERE + PREFERRED_ME + PAUSED)}
            SELECT 'task-' || n, 'root-' || n, '{BACKLOG_GROUP}', 'INVOKE', 'PENDING', 0,
              CASE WHEN n % 100 = 1 AND n <= {100 * PREFERRED_ELSEWHERE} THEN 'w-' || (n % 7)
                   WHEN n % 500 = 2 THEN '{ME}' END,
              {d.false}, {NOW} - 5000000 + n * 10, 'approve',
              CASE WHEN n % 1000 = 3 THEN 3 ELSE 0 END,
              CASE WHEN n % 1000 = 3 AND n <= 20000 THEN {NOW} - 1000 - n
                   WHEN n % 1000 = 3 THEN {NOW} + 600000 + n END FROM g""",
        # A group of resumes only, each preferred for a worker that may still hold
        # its generator: another worker takes them only when nothing else is left.
        f"""INSERT INTO tasks (id, root_promise_id, "group", kind, state, counter,
              preferred_worker_id, resume_pending, create_time, workflow)
              {_counter(RESUMES)}
            SELECT 'resume-' || n, 'resume-root-' || n, '{RESUMES_GROUP}', 'RESUME', 'PENDING',
              1, 'w-' || (n % 7), {d.false}, {NOW} - 5000000 + n * 10, 'approve' FROM g""",
        # A backlog a stream that lists its workflows cannot take, then what it can.
        f"""INSERT INTO tasks (id, root_promise_id, "group", kind, state, counter,
              preferred_worker_id, resume_pending, create_time, workflow, workflow_version,
              failed_attempts, next_attempt_time) {_counter(ROUTE_REFUSED + ROUTE_TAKES)}
            SELECT 'route-' || n, 'route-root-' || n, '{ROUTES_GROUP}', 'INVOKE', 'PENDING', 0,
              CASE WHEN n > {ROUTE_REFUSED + 100} AND n <= {ROUTE_REFUSED + 150} THEN '{ME}'
                   WHEN n > {ROUTE_REFUSED + 150} AND n <= {ROUTE_REFUSED + 200}
                   THEN 'w-other' END,
              {d.false}, {NOW} - 5000000 + n * 10,
              CASE WHEN n <= 50000 THEN 'approve' WHEN n <= 80000 THEN 'retired'
                   WHEN n <= {ROUTE_REFUSED} THEN 'approve'
                   WHEN n <= {ROUTE_REFUSED + 200} THEN 'approve'
                   WHEN n <= {ROUTE_REFUSED + 240} THEN 'report'
                   WHEN n <= {ROUTE_REFUSED + 260} THEN 'typo'
                   WHEN n <= {ROUTE_REFUSED + 280} THEN NULL
                   ELSE 'approve' END,
              CASE WHEN n <= 50000 THEN 'v1' WHEN n <= 80000 THEN 'v0'
                   WHEN n <= 100000 THEN NULL WHEN n <= {ROUTE_REFUSED} THEN 'v1'
                   WHEN n <= {ROUTE_REFUSED + 200} THEN 'v2'
                   WHEN n <= {ROUTE_REFUSED + 280} THEN NULL
                   ELSE 'v2' END,
              CASE WHEN n > 100000 AND n <= {ROUTE_REFUSED} THEN 1
                   WHEN n > {ROUTE_REFUSED + 280} THEN 1 ELSE 0 END,
              CASE WHEN n > 100000 AND n <= {ROUTE_REFUSED} THEN {NOW} - 1000 - n
                   WHEN n > {ROUTE_REFUSED + 280} THEN {NOW} - 1000 - n END FROM g""",
        # Completed tasks of another group (before they are deleted).
        f"""INSERT INTO tasks (id, root_promise_id, "group", kind, state, counter,
              resume_pending, create_time, complete_time, workflow) {_counter(COMPLETED)}
            SELECT 'done-' || n, 'wf-' || n, 'done', 'RESUME', 'COMPLETED', 1, {d.false},
              {NOW} - 90000000 + n * 100, {NOW} - 90000000 + n * 100 + 50, 'approve'
            FROM g""",
        # Callbacks on the inbox.
        f"""INSERT INTO callbacks (promise_id, root_promise_id, "group", worker_id,
              create_time) {_counter(INBOX)}
            SELECT 'inbox-' || n, 'root-' || n, '{BACKLOG_GROUP}', 'w', {NOW} - 1000000 + n
            FROM g""",
    ]


PENDING_ROOTS = 200_000
"""The backlog world's PENDING workflow roots with no step yet (as `bench/scale.py`'s
case (b)): each a promise without a parent."""
PARKED = 20
"""The backlog world's workflows waiting for a human: a PENDING root, its PENDING
approval and its settled `run` step."""


def _backlog_statements(d: _Dialect) -> list[str]:
    root_tags = d.j('\'{"troth:invoke": "scale", "troth:func": "hitl"}\'')
    approval_tags = d.j('\'{"troth:group": "scale", "troth:kind": "promise"}\'')
    step_tags = d.j('\'{"troth:kind": "run"}\'')
    empty = d.j("'{}'")
    return [
        f"""INSERT INTO promises ({_PROMISE_COLUMNS}) {_counter(PENDING_ROOTS)}
            SELECT 'root-' || n, 'PENDING', {empty}, {d.blob}, {empty}, {d.blob}, {root_tags},
              {d.false}, {NOW} - 5000000 + n * 10, NULL, {NOW} + 86400000, NULL, NULL, NULL,
              'scale', 'hitl' FROM g""",
        f"""INSERT INTO promises ({_PROMISE_COLUMNS}) {_counter(PARKED)}
            SELECT 'root-' || n || '.0', 'PENDING', {empty}, {d.blob}, {empty}, {d.blob},
              {approval_tags}, {d.false}, {NOW} - 5000000 + n * 10 + 1, NULL,
              {NOW} + 86400000, NULL, 'root-' || n, 'root-' || n, NULL, NULL FROM g""",
        f"""INSERT INTO promises ({_PROMISE_COLUMNS}) {_counter(PARKED)}
            SELECT 'root-' || n || '.1', 'RESOLVED', {empty}, {d.blob}, {empty}, {d.blob},
              {step_tags}, {d.false}, {NOW} - 5000000 + n * 10 + 2,
              {NOW} - 5000000 + n * 10 + 3, {NOW} + 86400000, 'w', 'root-' || n, 'root-' || n,
              NULL, NULL FROM g""",
    ]


def seed(url: str) -> None:
    """Fill the migrated, empty store at `url` (a `sqlite:///` or a `postgresql+psycopg://`
    URL) with the year's world and ANALYZE it."""
    _seed(url, _statements)


def seed_backlog(url: str) -> None:
    """Fill the migrated, empty store at `url` with a backlog of workflows that have not
    started (`PENDING_ROOTS` PENDING roots, no step) and `PARKED` waiting for a human,
    and ANALYZE it: most promises have no parent."""
    _seed(url, _backlog_statements)


def _tag_rows(each: str) -> str:
    """The tag index's rows of every promise (what the store writes with each)."""
    return (
        "INSERT INTO promise_tags (seq, key, value)"
        f" SELECT p.seq, j.key, j.value FROM promises p, {each}(p.tags) j"
    )


def _seed(url: str, statements: Callable[[_Dialect], list[str]]) -> None:
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            conn.execute("PRAGMA synchronous = OFF")
            for statement in [*statements(_SQLITE), _tag_rows("json_each")]:
                conn.execute(statement)
            conn.commit()
            conn.execute("ANALYZE")
            conn.commit()
        finally:
            conn.close()
        return
    conninfo = url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(conninfo, autocommit=True) as pg:
        pg.execute("SET synchronous_commit = off")
        for statement in [*statements(_PG), _tag_rows("jsonb_each_text")]:
            pg.execute(statement.encode())
        for table in ("promises", "promise_tags", "tasks", "callbacks"):
            pg.execute(f"VACUUM ANALYZE {table}".encode())
