"""What `approvals.py` measured, as rows and the text report: each part's rows,
the schema variant's ratios to the plain one, and the tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from _approval_load import LOAD_IN_FLIGHT
from _servers import (
    fmt,
    table,
)
from _workflow_report import short

if TYPE_CHECKING:
    from promises import (
        PhaseResult,
    )

# --------------------------------------------------------------------------- results


@dataclass
class ResolveRow:
    """One part-1 figure: `op` create, resolve or refuse, of plain or schema promises."""

    target: str
    op: str
    variant: str
    result: PhaseResult


@dataclass
class RatioRow:
    target: str
    op: str
    in_flight: int
    per_s: float | None
    p50: float | None
    p99: float | None


@dataclass
class BuildRow:
    target: str
    promises: int
    pending_in_group: int
    elapsed_s: float
    per_s: float
    errors: int
    first_error: str | None = None


@dataclass
class InboxRow:
    target: str
    order: str
    page: str  # "first" or "next"
    samples: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    seen: int  # distinct promises a full walk listed (the pending approvals of g)
    stats: str = ""  # the planner's statistics of the table: as loaded, or after ANALYZE
    error: str | None = None


@dataclass
class WatchRow:
    target: str
    topology: str  # "one server", or "B<-A" (watchers on replica B, settles through A)
    watchers: int
    settled: int
    settle_per_s: float
    events: int
    missing: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    events_per_s: float
    resolve_p50_ms: float | None
    server_cpu: float | None
    """Every replica's; `watch_server_cpu` is the replica the watchers are on."""
    watch_server_cpu: float | None
    db_cpu: float | None
    client_cpu: float
    errors: int
    first_error: str | None = None


@dataclass
class Results:
    resolve: list[ResolveRow] = field(default_factory=list)
    ratios: list[RatioRow] = field(default_factory=list)
    refusal_example: str | None = None
    builds: list[BuildRow] = field(default_factory=list)
    inbox: list[InboxRow] = field(default_factory=list)
    watch: list[WatchRow] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)


def ratio(target: str, op: str, in_flight: int, rows: list[ResolveRow]) -> RatioRow:
    found = {
        r.variant: r.result
        for r in rows
        if r.target == target and r.op == op and r.result.in_flight == in_flight
    }
    plain, schema = found.get("plain"), found.get("schema")

    def div(a: float | None, b: float | None) -> float | None:
        return None if a is None or not b else a / b

    if plain is None or schema is None:
        return RatioRow(target, op, in_flight, None, None, None)
    return RatioRow(
        target,
        op,
        in_flight,
        div(schema.calls_per_s, plain.calls_per_s),
        div(schema.p50_ms, plain.p50_ms),
        div(schema.p99_ms, plain.p99_ms),
    )


# --------------------------------------------------------------------------- output


def render(results: Results) -> str:
    blocks = []
    if results.resolve:
        rows = [
            [
                r.target,
                r.op,
                r.variant,
                str(r.result.in_flight),
                f"{r.result.calls:,}",
                fmt(r.result.calls_per_s, ",.0f"),
                fmt(r.result.p50_ms, ".2f"),
                fmt(r.result.p99_ms, ".2f"),
                str(r.result.errors),
                fmt(r.result.commits_per_s, ",.0f"),
                fmt(r.result.server_cpu, ".0%"),
                fmt(r.result.client_cpu, ".0%"),
                fmt(r.result.db_cpu, ".0%"),
                fmt(r.result.other_cpu, ".0%"),
            ]
            for r in results.resolve
        ]
        header = ["target", "op", "promises", "in-flight", "calls", "calls/s", "p50 ms",
                  "p99 ms", "errors", "commits/s", "srv cpu", "cli cpu", "db cpu",
                  "other cpu"]  # fmt: skip
        blocks.append(
            "(1) create and resolve, plain promises vs promises with the approval schema "
            "(refuse = a resolve the schema refuses: calls are INVALID_ARGUMENT answers; its "
            "p50/p99 are not timed)\n" + table(header, rows, left=3)
        )
        ratio_rows = [
            [
                r.target,
                r.op,
                str(r.in_flight),
                fmt(r.per_s, ".2f"),
                fmt(r.p50, ".2f"),
                fmt(r.p99, ".2f"),
            ]
            for r in results.ratios
        ]
        blocks.append(
            "(1) schema / plain\n"
            + table(["target", "op", "in-flight", "calls/s", "p50", "p99"], ratio_rows, left=2)
        )
        if results.refusal_example:
            blocks.append(f"(1) a refused resolve answers: {results.refusal_example}")
    if results.builds:
        rows = [
            [
                b.target,
                f"{b.promises:,}",
                f"{b.pending_in_group:,}",
                f"{b.elapsed_s:.1f}",
                fmt(b.per_s, ",.0f"),
                str(b.errors),
            ]
            for b in results.builds
        ]
        blocks.append(
            f"(2) the inbox table (creates at {LOAD_IN_FLIGHT} in flight)\n"
            + table(["target", "promises", "pending in g", "build s", "creates/s", "errors"], rows)
        )
    if results.inbox:
        rows = [
            [
                r.target,
                r.stats,
                r.order,
                r.page,
                str(r.samples),
                fmt(r.p50_ms, ".2f"),
                fmt(r.p99_ms, ".2f"),
                fmt(r.max_ms, ".2f"),
                f"{r.seen:,}",
                short(r.error),
            ]
            for r in results.inbox
        ]
        blocks.append(
            "(2) inbox search: PENDING, tags troth:kind=promise + troth:group=g, 100 per page "
            "(seen = distinct promises one walk of all pages listed; table statistics: as the "
            "load left them, then after ANALYZE)\n"
            + table(
                [
                    "target",
                    "table statistics",
                    "order",
                    "page",
                    "samples",
                    "p50 ms",
                    "p99 ms",
                    "max ms",
                    "seen",
                    "error",
                ],
                rows,
                left=4,
            )
        )
    if results.watch:
        rows = [
            [
                r.target,
                r.topology,
                str(r.watchers),
                str(r.settled),
                fmt(r.settle_per_s, ",.0f"),
                f"{r.events:,}",
                str(r.missing),
                fmt(r.p50_ms, ".2f"),
                fmt(r.p99_ms, ".2f"),
                fmt(r.max_ms, ".2f"),
                fmt(r.events_per_s, ",.0f"),
                fmt(r.resolve_p50_ms, ".2f"),
                fmt(r.server_cpu, ".0%"),
                fmt(r.watch_server_cpu, ".0%"),
                fmt(r.db_cpu, ".0%"),
                fmt(r.client_cpu, ".0%"),
                str(r.errors),
            ]
            for r in results.watch
        ]
        header = ["target", "topology", "watchers", "settled", "settles/s", "events", "missing",
                  "p50 ms", "p99 ms", "max ms", "events/s", "resolve p50", "srv cpu",
                  "watch srv cpu", "db cpu", "cli cpu", "errors"]  # fmt: skip
        blocks.append(
            "(3) WatchPromises fan-out: resolve returning -> each watcher's SETTLED event "
            "(B<-A = watchers on replica B, settles through replica A; srv cpu = all replicas, "
            "watch srv cpu = the watchers' replica)\n" + table(header, rows, left=2)
        )
    return "\n\n".join(blocks)
