"""Each statement the server runs in a loop costs its batch, not the size of the world.

A store seeded once per run with a year's worth of rows (`_scale`: ~320k
promises, 100k PENDING tasks in one group, 50k completed ones, 30k callbacks) and
ANALYZEd. Each test calls the store's own method, records the statements it sends
(as tests/store/test_query_plans.py does) and plans them with the parameters
they ran with:

- PostgreSQL: `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)` under the default planner
  settings, inside a transaction rolled back after: no Seq Scan of promises,
  tasks or callbacks, no Sort whose input is more than the statement's bound, and
  the rows its scans read (returned plus removed by a filter or a recheck, times
  their loops) within that bound.
- SQLite: `EXPLAIN QUERY PLAN` and a run of the statement: no `SCAN` of a large
  table without an index (but a walk in rowid order that stopped at its page), and
  the rows it read, which SQLite does not report, counted by its virtual machine's
  steps (`STEPS_PER_ROW`) within the bound; a sort (`USE TEMP B-TREE FOR ORDER BY`)
  takes no more than what was read.

A second world (`_scale.seed_backlog`: 200k PENDING roots, few steps) plans the
reads of a workflow's steps by parent, which SQLite's statistics once misjudged.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
from _pg import fresh_schema
from _scale import (
    ACME,
    BACKLOG_GROUP,
    INBOX,
    ME,
    NOW,
    OVERDUE,
    PARKED,
    RESUMES_GROUP,
    ROUTE_TAKES,
    ROUTES_GROUP,
    seed,
    seed_backlog,
)
from psycopg import sql
from sqlalchemy import Engine, event

from troth_server.app import store_clock
from troth_server.domain.promise import PromiseState
from troth_server.domain.routing import ANY, Route
from troth_server.store import PromiseOrder, PromiseQuery, Store, WorkflowQuery, open_store
from troth_server.store._pg_pipeline import positional
from troth_server.store._reads import PromiseReads
from troth_server.store._sql import _WriteTx
from troth_server.store._task_sql import route_keys

if TYPE_CHECKING:
    from troth_server.store._bind import Statement

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LARGE_TABLES = ("promises", "promise_tags", "tasks", "callbacks")


@dataclass(frozen=True)
class Executed:
    sql: str
    params: Any
    settings: tuple[tuple[str, str], ...] = ()
    """The planner settings its transaction had set (`SET LOCAL`) when it ran."""


@contextmanager
def recording() -> Iterator[list[Executed]]:
    """The statements any engine of this process sends, and those a write transaction
    runs straight on the driver (`_WriteTx._select`), with their parameters."""
    seen: list[Executed] = []
    settings: dict[str, str] = {}

    def record(
        conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
    ) -> None:
        local = re.match(r"\s*SET LOCAL (\w+) = (\w+)", statement, re.I)
        if local:
            settings[local[1]] = local[2]
        elif re.match(r"\s*(COMMIT|ROLLBACK)\b", statement, re.I):
            settings.clear()
        elif re.match(r"\s*(SELECT|WITH|UPDATE|DELETE)\b", statement, re.I):
            seen.append(Executed(statement, parameters, tuple(settings.items())))

    def end(conn: Any) -> None:
        settings.clear()

    select = _WriteTx._select
    # The point reads run compiled statements on the DB-API, past SQLAlchemy's events.
    point_read = PromiseReads._read_rows

    def record_point_read(
        store: PromiseReads, statement: Statement, values: Mapping[str, Any]
    ) -> Sequence[Sequence[Any]]:
        seen.append(Executed(statement.sql, statement.params(values)))
        return point_read(store, statement, values)

    def record_select(tx: _WriteTx, sql: str, params: Any) -> Sequence[Sequence[Any]]:
        if tx.row_locks:  # PostgreSQL: past SQLAlchemy's events (SQLite: `on_sqlite`)
            seen.append(Executed(sql, params, tuple(settings.items())))
        return select(tx, sql, params)

    # SQLite: the write transaction runs its statements on the driver, past the events.
    on_sqlite = _WriteTx._on_sqlite

    def record_on_sqlite(tx: _WriteTx, sql: str, params: Any, *, many: bool) -> list[Any]:
        if re.match(r"\s*(SELECT|WITH|UPDATE|DELETE)\b", sql, re.I):
            seen.append(Executed(sql, params[0] if many and params else params))
        return on_sqlite(tx, sql, params, many=many)

    event.listen(Engine, "before_cursor_execute", record)
    event.listen(Engine, "commit", end)
    event.listen(Engine, "rollback", end)
    _WriteTx._select = record_select  # type: ignore[method-assign]
    _WriteTx._on_sqlite = record_on_sqlite  # type: ignore[method-assign]
    PromiseReads._read_rows = record_point_read  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        PromiseReads._read_rows = point_read  # type: ignore[method-assign]
        _WriteTx._on_sqlite = on_sqlite  # type: ignore[method-assign]
        _WriteTx._select = select  # type: ignore[method-assign]
        event.remove(Engine, "rollback", end)
        event.remove(Engine, "commit", end)
        event.remove(Engine, "before_cursor_execute", record)


@pytest.fixture(scope="session")
def sqlite_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = f"sqlite:///{tmp_path_factory.mktemp('scale')}/world.db"
    open_store(url).close()
    seed(url)
    yield url


@pytest.fixture(scope="session")
def postgres_world() -> Iterator[str]:
    with fresh_schema() as url:
        seed(url)
        yield url


@pytest.fixture(scope="session")
def sqlite_backlog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = f"sqlite:///{tmp_path_factory.mktemp('scale')}/backlog.db"
    open_store(url).close()
    seed_backlog(url)
    yield url


@pytest.fixture(scope="session")
def postgres_backlog() -> Iterator[str]:
    with fresh_schema() as url:
        seed_backlog(url)
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def world(request: pytest.FixtureRequest) -> Iterator[Store]:
    yield from _open(request.getfixturevalue(f"{request.param}_world"))


@pytest.fixture(params=["sqlite", "postgres"])
def backlog(request: pytest.FixtureRequest) -> Iterator[Store]:
    """The backlog world (`_scale.seed_backlog`): nearly every promise a root."""
    yield from _open(request.getfixturevalue(f"{request.param}_backlog"))


def _open(url: str) -> Iterator[Store]:
    store = open_store(url)
    _URLS[id(store)] = url
    try:
        yield store
    finally:
        store.close()


_URLS: dict[int, str] = {}
"""Each open store's URL, by its id."""


def _url(store: Store) -> str:
    return _URLS[id(store)]


# -- plans ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    text: str
    """SQLite's query plan, or PostgreSQL's JSON plan."""
    rows_read: int
    """PostgreSQL: rows its scans read (returned, filtered out, rechecked away);
    SQLite: its virtual machine's steps over `STEPS_PER_ROW`."""
    sorted_rows: int
    """PostgreSQL: the most rows any Sort node took in."""
    scans: list[str]
    ms: float
    """PostgreSQL: its execution time; SQLite: the statement's run, timed here."""
    walk_may_stop: bool = False
    """SQLite: a walk of a table in rowid (seq) order is how it serves a page of a
    dense filter (every promise, RESOLVED ones) and stops at the page's end, so the
    rows it read decide, not the plan's words. (PostgreSQL walks the primary key
    then; a Seq Scan there is always a failure.)"""


def _pg_nodes(node: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    yield node
    for child in node.get("Plans", ()):
        yield from _pg_nodes(child)


def _executed_prepared(conn: psycopg.Connection[Any], executed: Executed) -> str:
    """`EXECUTE` of the statement prepared (its values written out), as the writer
    runs its own (`_pg_pipeline`): under `force_generic_plan`, the plan a prepared
    statement keeps after its first few runs."""
    prepared = positional(executed.sql)
    conn.execute(b"PREPARE troth_probe AS " + prepared.sql)
    values = [executed.params[name] for name in prepared.names]
    return "EXECUTE troth_probe(" + ", ".join(sql.Literal(v).as_string(conn) for v in values) + ")"


def _pg_plan(url: str, executed: Executed, settings: Mapping[str, str]) -> Plan:
    conninfo = url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(conninfo) as conn:
        try:
            for name, value in [*settings.items(), *executed.settings]:
                conn.execute("SELECT set_config(%s, %s, true)", (name, value))
            explain = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
            if settings.get("plan_cache_mode") == "force_generic_plan":
                # As the writer runs it: prepared once, then executed with its values.
                (row,) = conn.execute(explain + _executed_prepared(conn, executed)).fetchall()
            else:
                (row,) = conn.execute(explain + executed.sql, executed.params or None).fetchall()
        finally:
            conn.rollback()
    doc = row[0] if isinstance(row[0], list) else json.loads(row[0])
    top = doc[0]
    nodes = list(_pg_nodes(top["Plan"]))
    read = 0
    sorted_rows = 0
    scans = []
    for node in nodes:
        loops = node.get("Actual Loops", 1)
        if "Relation Name" in node or node["Node Type"].startswith("Index"):
            read += loops * (
                node.get("Actual Rows", 0)
                + node.get("Rows Removed by Filter", 0)
                + node.get("Rows Removed by Index Recheck", 0)
            )
        if node["Node Type"] == "Bitmap Index Scan":
            read += loops * node.get("Actual Rows", 0)
        if node["Node Type"] in ("Sort", "Incremental Sort"):
            sorted_rows = max(sorted_rows, *(c.get("Actual Rows", 0) for c in node["Plans"]))
        if node["Node Type"] == "Seq Scan" and node.get("Relation Name") in LARGE_TABLES:
            scans.append(node["Relation Name"])
    return Plan(json.dumps(top, indent=1), read, sorted_rows, scans, top["Execution Time"])


_STEPS_PER_CALL = 10
STEPS_PER_ROW = 25
"""SQLite reports no rows read: its virtual machine's steps stand for them. A row read
and returned (a seek, twenty columns, the next) is some 30-50 steps; a row a filter
skips or an aggregate takes in, a few: a walk of 300k rows is tens of thousands of
these "rows", a batch's reads a few dozen."""


def _sqlite_plan(url: str, executed: Executed, settings: Mapping[str, str]) -> Plan:
    conn = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        conn.execute("PRAGMA case_sensitive_like=ON")  # as the server's connections
        rows = conn.execute("EXPLAIN QUERY PLAN " + executed.sql, executed.params or ())
        text = "\n".join(str(row[-1]) for row in rows)
        steps = [0]

        def count() -> int:
            steps[0] += _STEPS_PER_CALL
            return 0

        conn.set_progress_handler(count, _STEPS_PER_CALL)
        start = time.perf_counter()
        conn.execute(executed.sql, executed.params or ()).fetchall()
        ms = (time.perf_counter() - start) * 1000
        conn.set_progress_handler(None, 0)
    finally:
        conn.rollback()
        conn.close()
    scans = [
        t
        for t in LARGE_TABLES
        if re.search(rf"^(?:.*\s)?SCAN {t}\b(?! USING (COVERING )?INDEX)", text, re.M)
    ]
    # A sort takes no more rows than the statement read.
    read = steps[0] // STEPS_PER_ROW
    sorted_rows = read if "USE TEMP B-TREE FOR ORDER BY" in text else 0
    return Plan(text, read, sorted_rows, scans, ms, walk_may_stop=True)


def plans_of(
    store: Store, run: Callable[[Store], object], settings: Mapping[str, str] | None = None
) -> list[tuple[Executed, Plan]]:
    """The plan of each statement `run` sent to a large table (on PostgreSQL under
    `settings`, the planner's own otherwise)."""
    with recording() as seen:
        run(store)
    url = _url(store)
    plan = _sqlite_plan if url.startswith("sqlite") else _pg_plan
    return [
        (executed, plan(url, executed, settings or {}))
        for executed in seen
        if _touches_large(executed)
    ]


def _touches_large(executed: Executed) -> bool:
    return any(re.search(rf"\b{t}\b", executed.sql) for t in LARGE_TABLES)


def assert_bounded(
    store: Store,
    run: Callable[[Store], object],
    bound: int,
    settings: Mapping[str, str] | None = None,
) -> None:
    """Every statement `run` sends scans no large table, and sorts and reads at most
    `bound` rows."""
    planned = plans_of(store, run, settings)
    assert planned, "the call ran no statement on promises, tasks or callbacks"
    for executed, plan in planned:
        where = f"{' '.join(executed.sql.split())}\n{plan.text}"
        stopped = plan.walk_may_stop and plan.rows_read <= bound
        assert not plan.scans or stopped, f"scans {plan.scans}:\n{where}"
        assert plan.sorted_rows <= bound, f"sorts {plan.sorted_rows} rows:\n{where}"
        assert plan.rows_read <= bound, f"reads {plan.rows_read} rows (bound {bound}):\n{where}"


# -- the statements ---------------------------------------------------------------------

CLAIM = 10


def claim(store: Store) -> object:
    return store.write(lambda tx: tx.pending_tasks(BACKLOG_GROUP, ME, CLAIM, ANY, NOW))


def claim_elsewhere(store: Store) -> object:
    # A worker nothing is preferred for, in a group with a backlog of others'.
    return store.write(lambda tx: tx.pending_tasks(BACKLOG_GROUP, "w-new", CLAIM, ANY, NOW))


def claim_others_resumes(store: Store) -> object:
    # A group of resumes preferred for other workers: this worker takes the oldest.
    return store.write(lambda tx: tx.pending_tasks(RESUMES_GROUP, "w-new", CLAIM, ANY, NOW))


ROUTE = Route(
    any_task=False,
    accepted=frozenset({("approve", "v2"), ("report", "r1")}),
    unversioned=frozenset({"report"}),
    known=frozenset({"approve", "report"}),
    current=(("approve", "v2"), ("report", "r1")),
)
"""A stream running `approve` v2 and `report` r1, beside one that runs `approve` v3
(the newest: unversioned starts of `approve` are its)."""
ROUTE_BOUND = 2 * len(route_keys(ROUTE)) * CLAIM + 30
"""Each key of the route (a branch of each probe) its batch; the probe of tasks
preferred for other workers passes over the worker's own of that key, which it runs
only once those are taken (at most a batch); the unversioned tasks of an unlisted
workflow (`typo`, 20 of them) all read, the route takes them all, to sort them by
age. Against 105,000 tasks the route refuses, older than any of these."""


def claim_by_route(worker: str, limit: int = CLAIM) -> Callable[[Store], object]:
    return lambda store: store.write(
        lambda tx: tx.pending_tasks(ROUTES_GROUP, worker, limit, ROUTE, NOW)
    )


def sweep(store: Store) -> object:
    return store.write(lambda tx: tx.expired_promise_ids(NOW, 1000))


def callbacks_by_promise(store: Store) -> object:
    return store.write(lambda tx: tx.get_callbacks(["inbox-17", "inbox-18"]))


def test_the_claim_reads_its_batch_not_the_backlog(world: Store) -> None:
    assert_bounded(world, claim, bound=4 * CLAIM + 10)
    assert_bounded(world, claim_elsewhere, bound=4 * CLAIM + 10)
    assert_bounded(world, claim_others_resumes, bound=4 * CLAIM + 10)


@pytest.mark.parametrize("worker", [ME, "w-new", "w-other"])
def test_a_claim_never_reads_a_task_its_route_refuses(world: Store, worker: str) -> None:
    # 105k tasks of versions and workflows the stream does not run, older than every
    # task it may take: a claim reads the keys it runs, not the backlog of others.
    assert_bounded(world, claim_by_route(worker), bound=ROUTE_BOUND)


@pytest.fixture
def postgres_store(postgres_world: str) -> Iterator[Store]:
    store = open_store(postgres_world)
    _URLS[id(store)] = postgres_world
    try:
        yield store
    finally:
        store.close()


@pytest.mark.parametrize("worker", [ME, "w-new"])
def test_a_claims_prepared_probes_keep_their_plans(postgres_store: Store, worker: str) -> None:
    # The writer prepares its statements on PostgreSQL: after a few runs it may plan
    # one for any values (a generic plan), which must not walk either. (SQLite plans
    # each statement as it runs.)
    world = postgres_store
    generic = {"plan_cache_mode": "force_generic_plan"}
    assert_bounded(world, claim_by_route(worker), bound=ROUTE_BOUND, settings=generic)
    assert_bounded(world, claim, bound=4 * CLAIM + 10, settings=generic)
    assert_bounded(world, claim_others_resumes, bound=4 * CLAIM + 10, settings=generic)


def test_a_claim_by_route_takes_what_the_route_accepts_in_the_claims_order(
    world: Store,
) -> None:
    # A claim's read (its rows locked, nothing written): the world stays as seeded.
    found = world.write(lambda tx: tx.pending_tasks(ROUTES_GROUP, ME, ROUTE_TAKES + 10, ROUTE, NOW))
    assert len(found) == ROUTE_TAKES
    assert all(ROUTE.accepts(t.workflow, t.workflow_version) for t in found)
    rank = {ME: 0, None: 1}
    assert found == sorted(found, key=lambda t: (rank.get(t.preferred_worker_id, 2), t.create_time))


@pytest.mark.parametrize("random_page_cost", ["1.1", "4", "40"])
def test_the_sweeper_reads_its_batch_not_every_pending_promise(
    world: Store, random_page_cost: str
) -> None:
    # Whatever the planner's costs (SSD-like, its default, a slow disk): by the expiry index.
    settings = {"random_page_cost": random_page_cost}
    assert_bounded(world, sweep, bound=1000 + 10, settings=settings)


def test_startup_reads_the_newest_time_from_the_ends_of_indexes(world: Store) -> None:
    """What a server reads to start its clock (`app.store_clock`): on SQLite the newest
    time stored (`newest_time`, a max from the end of an index of each time); on
    PostgreSQL nothing of the tables (its clock is the database's)."""
    planned = plans_of(world, lambda store: store_clock(store, lambda: NOW))
    for executed, plan in planned:
        where = f"{' '.join(executed.sql.split())}\n{plan.text}"
        assert not plan.scans, f"scans {plan.scans}:\n{where}"
        assert plan.sorted_rows == 0, f"sorts {plan.sorted_rows} rows:\n{where}"
        assert plan.rows_read <= 10, f"reads {plan.rows_read} rows:\n{where}"
    assert len(planned) == (5 if world.database_time() is None else 0)


def test_callbacks_are_read_by_promise_id(world: Store) -> None:
    assert_bounded(world, callbacks_by_promise, bound=10)


def _search(**kwargs: Any) -> Callable[[Store], object]:
    query = PromiseQuery(
        id_glob=kwargs.pop("id_glob", ""),
        states=frozenset(kwargs.pop("states", ())),
        tags=kwargs.pop("tags", {}),
        after_seq=0,
        limit=50,
        **kwargs,
    )
    return lambda store: store.search_promises(query, NOW)


PAGE = 50
SEARCH_BOUND = 2 * PAGE + 10
"""A page of 50: its rows, and as many again for the page's filters to skip."""
LIVE_BOUND = SEARCH_BOUND + INBOX + OVERDUE
"""A settled state's page, and the PENDING promises: one past its deadline is seen
settled (RESOLVED or REJECTED_TIMEDOUT) until the sweeper writes it so, and the
planner may look for those among the live PENDING ones (never the history)."""


@pytest.mark.parametrize(
    ("search", "bound"),
    [
        pytest.param(_search(states=[PromiseState.REJECTED_TIMEDOUT]), LIVE_BOUND, id="rare-state"),
        pytest.param(
            _search(states=[PromiseState.REJECTED_TIMEDOUT], order=PromiseOrder.CREATED_DESC),
            LIVE_BOUND,
            id="rare-state-newest",
        ),
        pytest.param(_search(states=[PromiseState.REJECTED]), SEARCH_BOUND, id="rejected"),
        pytest.param(
            _search(states=[PromiseState.RESOLVED, PromiseState.REJECTED_CANCELED]),
            LIVE_BOUND,
            id="two-states",
        ),
        pytest.param(
            _search(states=[PromiseState.PENDING], order=PromiseOrder.EXPIRE_TIME_ASC),
            SEARCH_BOUND,
            id="inbox",
        ),
    ],
)
def test_a_search_reads_its_page_not_the_history(
    world: Store, search: Callable[[Store], object], bound: int
) -> None:
    assert_bounded(world, search, bound=bound)


@pytest.mark.parametrize(
    ("search", "bound"),
    [
        pytest.param(_search(tags={"team": "t3"}), SEARCH_BOUND, id="common-tag"),
        pytest.param(
            _search(tags={"team": "t3"}, order=PromiseOrder.CREATED_DESC),
            SEARCH_BOUND,
            id="common-tag-newest",
        ),
        pytest.param(
            _search(tags={"team": "t3", "troth:func": "approve"}), SEARCH_BOUND, id="two-tags"
        ),
        # RESOLVED: the stored ones by the tag's walk; the overdue timers among the live
        # PENDING promises, as a search by that state alone (LIVE_BOUND).
        pytest.param(
            _search(tags={"team": "t3"}, states=[PromiseState.RESOLVED]),
            LIVE_BOUND,
            id="tag-state",
        ),
        pytest.param(_search(tags={"team": "t-nobody"}), SEARCH_BOUND, id="absent-tag"),
        # The workflows' steps: 100k promises, all after the 100k roots in seq order.
        pytest.param(_search(tags={"troth:kind": "run"}), SEARCH_BOUND, id="clustered-tag"),
    ],
)
def test_a_search_by_tag_reads_its_page_not_every_promise_with_the_tag(
    world: Store, search: Callable[[Store], object], bound: int
) -> None:
    """`team=t3` is on a tenth of the history (32k promises), `troth:kind=run` on the
    100k steps that follow the 100k roots: the tag's rows walked in seq order, a page's
    worth (and, with a state or another tag, the page's filters')."""
    assert_bounded(world, search, bound=bound)


# -- a backlog of roots: the steps of a workflow by its parent ---------------------------

PARKED_ROOTS = ["root-5", "root-7", f"root-{PARKED}"]
"""Workflows waiting for a human (each a PENDING approval and a settled step)."""


def pending_steps(store: Store) -> object:
    # A page of workflows, described (SearchWorkflows: the human steps each waits on).
    return store.pending_steps(PARKED_ROOTS)


def pending_step_ids(store: Store) -> object:
    # Settling roots ends their PENDING steps (every W1 cycle's settle of its root).
    return store.write(lambda tx: tx.pending_step_ids(PARKED_ROOTS))


def history(store: Store) -> object:
    # A workflow's tree: every delivery of its task carries it.
    return store.promise_tree("root-7")


def steps_search(store: Store) -> object:
    # `troth export`: a workflow's steps by record.
    return _search(parent_id="root-7")(store)


def waiting_for_human(store: Store) -> object:
    return store.search_workflows(WorkflowQuery(limit=PAGE, waiting_for_human=True), NOW)


@pytest.mark.parametrize(
    ("run", "bound"),
    [
        pytest.param(pending_steps, 10, id="pending-steps"),
        pytest.param(pending_step_ids, 10, id="pending-step-ids"),
        pytest.param(history, 10, id="history"),
        pytest.param(steps_search, 10, id="steps-search"),
        # The live PENDING steps (the parked approvals), never the roots.
        pytest.param(waiting_for_human, SEARCH_BOUND + 2 * PARKED, id="waiting-for-human"),
    ],
)
def test_a_workflows_steps_are_read_by_parent_not_past_every_root(
    backlog: Store, run: Callable[[Store], object], bound: int
) -> None:
    """With 200k PENDING roots and few steps (`bench/scale.py` (b)), after ANALYZE: each
    read of steps by their parent reads those steps, not the roots (whose NULL parent
    SQLite's statistics once averaged in: a scan of the table)."""
    assert_bounded(backlog, run, bound=bound)


@pytest.mark.parametrize(
    "search",
    [
        pytest.param(_search(id_prefixes=("acme/",)), id="tenant"),
        pytest.param(_search(id_prefixes=("acme/",), order=PromiseOrder.CREATED_DESC), id="newest"),
        pytest.param(_search(id_prefixes=("acme/p-1", "acme/p-2")), id="two-prefixes"),
        pytest.param(
            _search(id_prefixes=("acme/",), states=[PromiseState.REJECTED]), id="tenant-state"
        ),
        pytest.param(_search(id_prefixes=("acme/",), tags={"team": "t3"}), id="tenant-tag"),
        pytest.param(_search(id_prefixes=("nobody/",)), id="empty-tenant"),
    ],
)
def test_a_scoped_search_reads_its_tenants_rows_not_the_store(
    world: Store, search: Callable[[Store], object]
) -> None:
    """A principal scoped to `acme/` (10k promises among 322k, all after the 200k of
    the workflows' history in seq order): its search reads its ids' range of the id
    index, sorted, so at most its tenant's rows (an honest bound: a page of one
    tenant cannot be found in seq order without reading the others' rows or all of
    its own), never the rest of the store. Each of them twice at most: its entry in
    the id index and its row (PostgreSQL's bitmap scan counts both; SQLite's sort
    takes more steps a row than a walk)."""
    assert_bounded(world, search, bound=2 * ACME + SEARCH_BOUND)
