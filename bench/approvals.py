"""Typed approvals and the inbox (issue 5): what a schema costs a resolve, how fast an
inbox page is listed, and how fast WatchPromises tells its watchers.

One run measures, per target (a fresh SQLite file, or a fresh PostgreSQL schema):

1. **resolve with a JSON Schema**: ResolvePromise throughput and p50/p99 at 1 and
   64 in flight on promises created with an approval-decision schema (an object
   of six typed fields, an enum and a nested object among them, three required)
   against the same promises without one, in the same run, phases in ABBA order
   so drift of the shared machine cancels; the schema/plain ratio; the creates
   that fed them; and the refusal path: resolves whose value breaks the schema
   (INVALID_ARGUMENT) per second;
2. **inbox search**: SearchPromises(states=[PENDING], tags={troth:kind=promise,
   troth:group=g}, page_size 100) in EXPIRE_TIME_ASC and CREATED_DESC order over
   100,000 promises of which 10,000 are pending approvals of group g (the rest:
   settled approvals of g, pending approvals of other groups, settled workflow
   steps, created in random order): latency of the first page and of the pages
   after it (walking the page tokens to the end);
3. **WatchPromises fan-out**: W watchers (1, 10, 100) with a tag filter; N
   promises settled at a steady rate; latency from each ResolvePromise returning
   to each watcher receiving the SETTLED event, and events/s delivered. On
   PostgreSQL also with two replicas: watchers on replica B, settles through A.

The server is `python -m troth_server serve` (grpc.aio, default settings) on a
fresh database per part (`_servers.Cluster`); the load comes from this process:
`bench/promises.py`'s `future` client for parts 1 and 2's data, blocking calls
for the searches, one grpc.aio event loop for the watchers and the settles.
The requests and the measuring are in `_approval_load.py`; the result rows and
tables in `_approval_report.py`.

Usage (see bench/README.md, "Issue 5: typed approvals and the inbox")::

    .venv/bin/python bench/approvals.py [--quick] [--targets sqlite,pg] [--parts 1,2,3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import random
import shutil
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from _approval_load import (
    BUILD_TIMEOUT_S,
    JSON_HEADERS,
    LOAD_IN_FLIGHT,
    TTL,
    VALID_DECISION,
    Meter,
    PromiseServiceStub,
    Sample,
    approval_create,
    approvals,
    create_all,
    from_list,
    merge,
    rate,
    refusal_example,
    refusals,
    start_cluster,
    to_result,
)
from _approval_report import (
    BuildRow,
    InboxRow,
    ResolveRow,
    Results,
    WatchRow,
    ratio,
    render,
)
from _servers import (
    BACKENDS,
    PG_ADMIN_URL,
    Cluster,
    Database,
    ServerError,
    fmt,
    log,
    machine_info,
    percentile_ms,
    postgres_cpu_delta,
    postgres_cpu_seconds,
)
from promises import (
    CALL_TIMEOUT_S,
    FutureClient,
    NextRequest,
    Request,
    resolve_requests,
    sync_channel,
)

from troth._commands import TAG_FUNC, TAG_GROUP, TAG_KIND, Kind
from troth.v1 import promises_pb2, types_pb2

DEFAULT_TARGETS = "sqlite,pg"
TARGETS = ("sqlite", "pg")
DRAIN_TIMEOUT_S = 15.0  # after the last settle, how long watchers may take to hear of it

VARIANTS = ("plain", "schema")

SETTLED = promises_pb2.PROMISE_EVENT_TYPE_SETTLED
PENDING = types_pb2.PROMISE_STATE_PENDING
ORDERS = {
    "EXPIRE_TIME_ASC": promises_pb2.PROMISE_ORDER_EXPIRE_TIME_ASC,
    "CREATED_DESC": promises_pb2.PROMISE_ORDER_CREATED_DESC,
}


# --------------------------------------------------------------------------- settings


@dataclass
class Settings:
    targets: list[str]
    parts: list[int]
    quick: bool
    duration_s: float
    warmup_s: float
    rounds: int
    in_flight: list[int]
    inbox_total: int
    inbox_pending: int
    page_size: int
    first_page_samples: int
    walks: int
    watchers: list[int]
    watch_count: int
    watch_rate: float
    keep: bool
    json: bool


def parse_args(argv: list[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(
        description="troth issue-5 benchmark: resolve with a JSON Schema, inbox search, "
        "WatchPromises fan-out."
    )
    parser.add_argument("--quick", action="store_true", help="small counts, for a smoke run")
    parser.add_argument("--parts", default="1,2,3", help="which parts to run (default 1,2,3)")
    parser.add_argument(
        "--targets",
        default=DEFAULT_TARGETS,
        help="comma-separated, from sqlite, pg (a fresh SQLite file, or a fresh PostgreSQL "
        "schema; part 3 on pg also runs on two replicas) (default sqlite,pg)",
    )
    parser.add_argument(
        "--duration", type=float, default=None, help="seconds per measured phase (default 2.5)"
    )
    parser.add_argument(
        "--warmup", type=float, default=None, help="seconds of warm-up per phase (default 0.5)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="part 1: rounds of a plain and a schema phase per in-flight level, in ABBA order "
        "(default 2)",
    )
    parser.add_argument(
        "--inbox-total", type=int, default=None, help="part 2: promises (default 100000)"
    )
    parser.add_argument(
        "--inbox-pending",
        type=int,
        default=None,
        help="part 2: pending approvals of group g (default 10000; at most total/6)",
    )
    parser.add_argument(
        "--watchers", default=None, help="part 3: watcher counts (default 1,10,100)"
    )
    parser.add_argument(
        "--watch-count", type=int, default=None, help="part 3: settles per watcher count (500)"
    )
    parser.add_argument(
        "--watch-rate", type=float, default=None, help="part 3: settles per second (default 100)"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--keep", action="store_true", help="keep the work directory (databases, server logs)"
    )
    args = parser.parse_args(argv)
    quick = bool(args.quick)
    try:
        parts = sorted({int(p) for p in args.parts.split(",") if p.strip()})
        watchers = [
            int(w) for w in (args.watchers or ("1,10" if quick else "1,10,100")).split(",") if w
        ]
    except ValueError:
        parser.error("--parts and --watchers take comma-separated integers, e.g. 1,2")
    if not parts or not set(parts) <= {1, 2, 3}:
        parser.error("--parts must name parts among 1,2,3")
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if not targets or not set(targets) <= set(TARGETS):
        parser.error(f"--targets must name targets among {', '.join(TARGETS)}")

    def pick(value: Any, quick_value: Any, full_value: Any) -> Any:
        return value if value is not None else (quick_value if quick else full_value)

    settings = Settings(
        targets=targets,
        parts=parts,
        quick=quick,
        duration_s=pick(args.duration, 0.5, 2.5),
        warmup_s=pick(args.warmup, 0.2, 0.5),
        rounds=pick(args.rounds, 1, 2),
        in_flight=[1, 64],
        inbox_total=pick(args.inbox_total, 2_000, 100_000),
        inbox_pending=pick(args.inbox_pending, 200, 10_000),
        page_size=100,
        first_page_samples=20 if quick else 100,
        walks=1 if quick else 3,
        watchers=watchers,
        watch_count=pick(args.watch_count, 40, 500),
        watch_rate=pick(args.watch_rate, 200.0, 100.0),
        keep=args.keep,
        json=args.json,
    )
    if settings.duration_s <= 0 or settings.warmup_s < 0 or settings.rounds < 1:
        parser.error("--duration must be > 0, --warmup >= 0 and --rounds >= 1")
    if not 0 < settings.inbox_pending * 6 <= settings.inbox_total:
        parser.error("--inbox-pending must be > 0 and at most --inbox-total / 6")
    if not watchers or min(watchers) < 1 or settings.watch_count < 1 or settings.watch_rate <= 0:
        parser.error("--watchers, --watch-count and --watch-rate must be positive")
    return settings


# --------------------------------------------------------------------------- part 1


def part_resolve(target: str, settings: Settings, root: Path, run_id: str, out: Results) -> None:
    cluster = start_cluster(f"resolve-{target}", BACKENDS[target], root)
    client: FutureClient | None = None
    try:
        client = FutureClient(cluster.addresses)
        meter = Meter(cluster, client)
        counter = itertools.count()
        # ABBA (plain, schema, schema, plain, ...): a drift of the shared machine's
        # load then weighs on both variants alike.
        order = [v for r in range(settings.rounds) for v in VARIANTS[:: 1 if r % 2 == 0 else -1]]
        for in_flight in settings.in_flight:
            taken: dict[tuple[str, str], list[Sample]] = {}
            for variant in order:
                schema = variant == "schema"
                warm = client.run(
                    "create",
                    approvals(run_id, counter, schema=schema),
                    in_flight,
                    settings.warmup_s,
                )
                created = meter.run(
                    "create",
                    approvals(run_id, counter, schema=schema),
                    in_flight,
                    settings.duration_s,
                )
                if settings.warmup_s > 0:
                    client.run(
                        "resolve", resolve_requests(warm.ok_ids, VALID_DECISION), in_flight, 60
                    )
                resolved = meter.run(
                    "resolve",
                    resolve_requests(created.raw.ok_ids, VALID_DECISION),
                    in_flight,
                    settings.duration_s,
                )
                taken.setdefault(("create", variant), []).append(created)
                taken.setdefault(("resolve", variant), []).append(resolved)
                log(
                    f"  [{target}] x{in_flight} {variant}: create "
                    f"{rate(created)}, resolve {rate(resolved)}"
                )
            # The refusal path: resolves the schema refuses, on promises that stay pending.
            pool = create_all(
                client,
                from_list(
                    approval_create(f"refuse-{run_id}-{in_flight}-{i}", i, "bench", schema=True)
                    for i in range(max(256, 4 * in_flight))
                ),
                "the refusal pool",
            ).ok_ids
            if out.refusal_example is None:
                out.refusal_example = refusal_example(cluster.addresses[0], pool[0])
            if settings.warmup_s > 0:
                client.run("resolve", refusals(pool), in_flight, settings.warmup_s)
            refused = meter.run("resolve", refusals(pool), in_flight, settings.duration_s)
            taken[("refuse", "schema")] = [refused]
            log(
                f"  [{target}] x{in_flight} schema: refuse "
                f"{refused.raw.errors / refused.raw.elapsed_s:,.0f}/s"
            )
            for (op, variant), samples in taken.items():
                result = to_result(target, op, in_flight, merge(samples))
                if op == "refuse":
                    # Every call is meant to fail: the refusals are the calls.
                    elapsed = result.elapsed_s or float("nan")
                    result.calls, result.errors = result.errors, result.calls
                    result.calls_per_s = result.calls / elapsed
                    result.first_error = (
                        f"{result.errors} resolves were accepted" if result.errors else None
                    )
                out.resolve.append(ResolveRow(target, op, variant, result))
            for op in ("create", "resolve"):
                out.ratios.append(ratio(target, op, in_flight, out.resolve))
    finally:
        if client is not None:
            client.close()
        cluster.stop()


# --------------------------------------------------------------------------- part 2


def inbox_data(run_id: str, settings: Settings) -> tuple[NextRequest, int]:
    """The inbox table's creates, in random order, and how many there are.

    Per pending approval of group g: two settled approvals of g (past
    decisions), three pending approvals of other groups, and enough settled
    workflow steps to make up the total. Approvals carry the schema; pending
    ones expire between 1 h and 3 days from now, so EXPIRE_TIME_ASC has an order
    to find. (The "steps" are settled filler rows with a step's function tag: a
    `run` step's own tags are reserved to the worker holding its workflow.)
    """
    pending = settings.inbox_pending
    kinds = [0] * pending + [1] * (2 * pending) + [2] * (3 * pending)
    kinds += [3] * (settings.inbox_total - len(kinds))
    rng = random.Random(5)
    rng.shuffle(kinds)
    value = types_pb2.Payload(headers=JSON_HEADERS, data=VALID_DECISION)

    def requests() -> Iterator[Request]:
        for n, kind in enumerate(kinds):
            promise_id = f"inbox-{run_id}-{n}"
            ttl_s = rng.randrange(3600, 3 * 86400)
            if kind == 0:
                yield approval_create(promise_id, n, "g", schema=True, ttl_s=ttl_s)
            elif kind == 1:
                request = approval_create(promise_id, n, "g", schema=True)
                request.resolved_with.CopyFrom(value)
                yield request
            elif kind == 2:
                yield approval_create(promise_id, n, f"g{n % 9 + 1}", schema=True, ttl_s=ttl_s)
            else:
                yield promises_pb2.CreatePromiseRequest(
                    id=promise_id,
                    param=types_pb2.Payload(headers=JSON_HEADERS, data=b'{"n": %d}' % n),
                    # Filler, shaped like a settled `run` step but not tagged as
                    # one: only a workflow's worker may write those (issue 9).
                    tags={TAG_FUNC: "fetch_draft", "bench": "filler"},
                    ttl=TTL,
                    resolved_with=types_pb2.Payload(headers=JSON_HEADERS, data=b'{"ok": true}'),
                )

    return from_list(requests()), len(kinds)


def part_inbox(target: str, settings: Settings, root: Path, run_id: str, out: Results) -> None:
    cluster = start_cluster(f"inbox-{target}", BACKENDS[target], root)
    client: FutureClient | None = None
    try:
        client = FutureClient(cluster.addresses)
        make, total = inbox_data(run_id, settings)
        log(f"  [{target}] creating {total:,} promises ({settings.inbox_pending:,} pending in g)")
        raw = client.run("create", make, LOAD_IN_FLIGHT, BUILD_TIMEOUT_S)
        build = BuildRow(
            target,
            len(raw.ok_ids),
            settings.inbox_pending,
            round(raw.elapsed_s, 1),
            len(raw.ok_ids) / (raw.elapsed_s or float("nan")),
            raw.errors,
            raw.first_error,
        )
        out.builds.append(build)
        log(
            f"  [{target}] created {build.promises:,} in {build.elapsed_s:.1f} s "
            f"= {build.per_s:,.0f}/s"
        )
        if raw.errors:
            raise ServerError(
                f"building the inbox table: {raw.errors} creates failed, e.g. {raw.first_error}"
            )
        client.close()
        client = None
        channel = sync_channel(cluster.addresses[0])
        try:
            stub = PromiseServiceStub(channel)
            # Once as the load left the table, once after ANALYZE: the plan of a
            # tag-filtered page depends on the planner's statistics, which a fresh
            # table lacks until autovacuum (if it runs) or ANALYZE gathers them.
            for stats in (f"as loaded ({planner_stats(cluster.database)})", "after ANALYZE"):
                if stats == "after ANALYZE":
                    analyze(cluster.database)
                log(f"  [{target}] searches, table statistics {stats}")
                for order_name in ORDERS:
                    out.inbox.extend(measure_inbox(stub, target, order_name, stats, settings))
                    cluster.check_alive()
        finally:
            channel.close()
    finally:
        if client is not None:
            client.close()
        cluster.stop()


def planner_stats(database: Database) -> str:
    """Whether the promises table has planner statistics yet ("stats" or "no stats")."""
    if database.kind == "postgresql":
        sql = (
            "SELECT 1 FROM pg_stat_user_tables WHERE schemaname = current_schema() "
            "AND relname = 'promises' "
            "AND (last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL)"
        )
    else:
        sql = "SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'"
    return "stats" if database.query(sql) else "no stats"


def analyze(database: Database) -> None:
    """Gather the promises table's planner statistics, as autovacuum or an operator would."""
    if database.kind == "postgresql":
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'ANALYZE "{database.schema}".promises')
    else:
        with contextlib.closing(sqlite3.connect(str(database.path), timeout=30)) as conn:
            conn.execute("ANALYZE promises")


def measure_inbox(
    stub: Any, target: str, order_name: str, stats: str, settings: Settings
) -> list[InboxRow]:
    order = ORDERS[order_name]
    clock = time.perf_counter_ns
    tags = {TAG_KIND: Kind.PROMISE.value, TAG_GROUP: "g"}

    def page(token: str) -> tuple[int, promises_pb2.SearchPromisesResponse]:
        request = promises_pb2.SearchPromisesRequest(
            states=[PENDING],
            tags=tags,
            order=order,
            page_size=settings.page_size,
            page_token=token,
        )
        start = clock()
        reply = stub.SearchPromises(request, timeout=CALL_TIMEOUT_S)
        return clock() - start, reply

    for _ in range(5):  # warm-up: plans, caches
        page("")
    first: list[int] = []
    following: list[int] = []
    seen = 0
    error: str | None = None
    for walk in range(settings.walks):
        ids: set[str] = set()
        token = ""
        last_key: tuple[int, int] | None = None
        while True:
            took, reply = page(token)
            (following if token else first).append(took)
            for p in reply.promises:
                # A page walk must list each pending approval of g once, in order.
                key = (
                    (p.expire_time.seconds, p.expire_time.nanos)
                    if order_name == "EXPIRE_TIME_ASC"
                    else (-p.create_time.seconds, -p.create_time.nanos)
                )
                if last_key is not None and key < last_key and error is None:
                    error = f"walk {walk}: {p.id} out of {order_name} order"
                last_key = key
                if p.state != PENDING or p.tags.get(TAG_GROUP) != "g":
                    error = error or f"walk {walk}: {p.id} is not a pending approval of g"
                ids.add(p.id)
            token = reply.next_page_token
            if not token:
                break
        seen = len(ids)
        if seen != settings.inbox_pending and error is None:
            error = f"walk {walk} listed {seen} promises, not {settings.inbox_pending}"
    while len(first) < settings.first_page_samples:
        first.append(page("")[0])
    rows = []
    for name, samples in (("first", first), ("next", following)):
        ordered = sorted(samples)
        rows.append(
            InboxRow(
                target,
                order_name,
                name,
                len(ordered),
                percentile_ms(ordered, 50),
                percentile_ms(ordered, 99),
                percentile_ms(ordered, 100),
                seen,
                stats,
                error,
            )
        )
        log(
            f"  [{target}] {order_name} {name} page: {len(ordered)} x, p50 "
            f"{fmt(rows[-1].p50_ms, '.2f')} ms, p99 {fmt(rows[-1].p99_ms, '.2f')} ms"
            + (f"; {error}" if error else "")
        )
    return rows


# --------------------------------------------------------------------------- part 3


def part_watch(target: str, settings: Settings, root: Path, run_id: str, out: Results) -> None:
    topologies = [(target, "one server")]
    if BACKENDS[target].kind == "postgresql":
        topologies.append(("pg2", "B<-A"))
    with asyncio.Runner() as runner:
        for backend, topology in topologies:
            cluster = start_cluster(f"watch-{backend}", BACKENDS[backend], root)
            try:
                # Watchers on the last replica, settles through the first.
                watch_at, settle_at = cluster.addresses[-1], cluster.addresses[0]
                loader = FutureClient([settle_at])
                try:
                    for watchers in settings.watchers:
                        group = f"w{watchers}-{run_id}"
                        ids = create_all(
                            loader,
                            from_list(
                                approval_create(f"watch-{group}-{i}", i, group, schema=True)
                                for i in range(settings.watch_count)
                            ),
                            "the watched promises",
                        ).ok_ids
                        row = runner.run(
                            watch_round(
                                cluster, watch_at, settle_at, group, ids, watchers, settings
                            )
                        )
                        row.target, row.topology = (
                            target if backend == target else backend,
                            topology,
                        )
                        out.watch.append(row)
                        cluster.check_alive()
                        log(
                            f"  [{backend} {topology}] {watchers} watchers: {row.events:,} events "
                            f"({row.missing} missing), p50 {fmt(row.p50_ms, '.2f')} ms, p99 "
                            f"{fmt(row.p99_ms, '.2f')} ms, {row.events_per_s:,.0f} events/s"
                        )
                finally:
                    loader.close()
            finally:
                cluster.stop()


def cpu_sample(
    cluster: Cluster,
) -> tuple[float | None, float | None, dict[int, float] | None, float]:
    """CPU so far of every replica, of the watchers' replica (the last), of
    PostgreSQL's processes (None on SQLite), and of this process."""
    on_pg = cluster.backend.kind == "postgresql"
    return (
        cluster.cpu_seconds(),
        cluster.servers[-1].cpu_seconds(),
        postgres_cpu_seconds() if on_pg else None,
        time.process_time(),
    )


async def watch_round(
    cluster: Cluster,
    watch_at: str,
    settle_at: str,
    group: str,
    ids: list[str],
    watchers: int,
    settings: Settings,
) -> WatchRow:
    clock = time.perf_counter_ns
    n = len(ids)
    tags = {TAG_KIND: Kind.PROMISE.value, TAG_GROUP: group}
    arrivals: list[list[tuple[str, int]]] = [[] for _ in range(watchers)]
    returned: dict[str, int] = {}
    resolve_ns: list[int] = []
    errors = 0
    first_error: str | None = None
    async with (
        grpc.aio.insecure_channel(watch_at) as watch_channel,
        grpc.aio.insecure_channel(settle_at) as settle_channel,
    ):
        watch_stub, settle_stub = (
            PromiseServiceStub(watch_channel),
            PromiseServiceStub(settle_channel),
        )
        calls = [
            watch_stub.WatchPromises(promises_pb2.WatchPromisesRequest(tags=tags))
            for _ in range(watchers)
        ]
        readers: list[asyncio.Task[None]] = []
        try:
            # The headers say the watch is in place: settles after them reach it.
            await asyncio.wait_for(
                asyncio.gather(*(c.initial_metadata() for c in calls)), CALL_TIMEOUT_S
            )

            async def read(call: Any, got: list[tuple[str, int]]) -> None:
                async for event in call:
                    if event.type == SETTLED:
                        got.append((event.promise.id, clock()))
                        if len(got) >= n:
                            return

            readers = [
                asyncio.create_task(read(c, a)) for c, a in zip(calls, arrivals, strict=True)
            ]

            async def settle(promise_id: str) -> None:
                nonlocal errors, first_error
                request = promises_pb2.ResolvePromiseRequest(
                    id=promise_id,
                    value=types_pb2.Payload(headers=JSON_HEADERS, data=VALID_DECISION),
                )
                start = clock()
                try:
                    await settle_stub.ResolvePromise(request, timeout=CALL_TIMEOUT_S)
                except grpc.aio.AioRpcError as exc:
                    errors += 1
                    first_error = first_error or f"{exc.code().name}: {exc.details()}"
                    return
                end = clock()
                returned[promise_id] = end
                resolve_ns.append(end - start)

            cpu0, watch_cpu0, db0, cli0 = cpu_sample(cluster)
            interval_ns = int(1e9 / settings.watch_rate)
            t0 = clock()
            settles = []
            for i, promise_id in enumerate(ids):
                delay = (t0 + i * interval_ns - clock()) / 1e9
                if delay > 0:
                    await asyncio.sleep(delay)
                settles.append(asyncio.create_task(settle(promise_id)))
            await asyncio.gather(*settles)
            settled_s = (clock() - t0) / 1e9
            await asyncio.wait(readers, timeout=DRAIN_TIMEOUT_S)
            t1 = clock()
            cpu1, watch_cpu1, db1, cli1 = cpu_sample(cluster)
        finally:
            for call in calls:
                call.cancel()
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    latencies = sorted(t - returned[i] for got in arrivals for i, t in got if i in returned)
    events = sum(len(got) for got in arrivals)
    last = max((t for got in arrivals for _, t in got), default=t1)
    window = (last - t0) / 1e9 or float("nan")
    measured = (t1 - t0) / 1e9 or float("nan")
    return WatchRow(
        target="",
        topology="",
        watchers=watchers,
        settled=len(returned),
        settle_per_s=len(returned) / (settled_s or float("nan")),
        events=events,
        missing=watchers * len(returned) - events,
        p50_ms=percentile_ms(latencies, 50),
        p99_ms=percentile_ms(latencies, 99),
        max_ms=percentile_ms(latencies, 100),
        events_per_s=events / window,
        resolve_p50_ms=percentile_ms(sorted(resolve_ns), 50),
        server_cpu=None if cpu0 is None or cpu1 is None else (cpu1 - cpu0) / measured,
        watch_server_cpu=None
        if watch_cpu0 is None or watch_cpu1 is None
        else (watch_cpu1 - watch_cpu0) / measured,
        db_cpu=None if db0 is None else (postgres_cpu_delta(db0, db1) or 0.0) / measured,
        client_cpu=(cli1 - cli0) / measured,
        errors=errors,
        first_error=first_error,
    )


def main(argv: list[str] | None = None) -> int:
    settings = parse_args(argv)
    run_id = uuid.uuid4().hex[:6]
    root = Path(tempfile.mkdtemp(prefix="troth-apbench-"))
    machine = machine_info()
    log(
        f"troth approvals bench {run_id}: parts {settings.parts}, targets {settings.targets}"
        f"{' (quick)' if settings.quick else ''}, {machine['cpus']} cpus, python "
        f"{machine['python']}, grpcio {machine['grpcio']}, load {machine['loadavg']}"
    )
    results = Results()
    parts = {1: part_resolve, 2: part_inbox, 3: part_watch}
    titles = {1: "resolve with a schema", 2: "inbox search", 3: "WatchPromises fan-out"}
    started = time.monotonic()
    for target in settings.targets:
        for part in settings.parts:
            log(f"part {part} [{target}]: {titles[part]}")
            try:
                parts[part](target, settings, root, run_id, results)
            except (ServerError, OSError, TimeoutError, grpc.RpcError) as exc:
                results.failures[f"part {part} [{target}]"] = str(exc)
                log(f"part {part} [{target}]: FAILED: {exc}")
    wall = time.monotonic() - started

    if settings.json:
        document = {
            "run_id": run_id,
            "machine": machine,
            "settings": asdict(settings),
            "wall_s": round(wall, 1),
            "results": asdict(results),
        }
        print(json.dumps(document, indent=2))
    else:
        print(
            f"\ntroth approvals, {settings.duration_s:g} s per part-1 phase, "
            f"{machine['cpus']} cpus, python {machine['python']}, grpcio {machine['grpcio']}, "
            f"{wall:.0f} s in all\n"
        )
        print(render(results) or "(no results)")
        for name, message in results.failures.items():
            print(f"FAILED {name}: {message.splitlines()[0] if message else ''}")

    if results.failures or settings.keep:
        log(f"work directory kept: {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if results.failures else 0


if __name__ == "__main__":
    sys.exit(main())
