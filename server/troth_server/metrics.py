"""Prometheus metrics: `troth serve --metrics-listen HOST:PORT` serves them over HTTP.

Two kinds, chosen by what each costs:

- Events, counted as they happen (`Metrics.rpc`, `commit`, `sweep`, ...): the
  components call a plain callback, which is never set unless metrics are on,
  so a server without `--metrics-listen` pays nothing for them.
- State, computed when Prometheus scrapes (`_LiveCollector`): the connected
  workers (from the dispatcher's table, no I/O), the gates' calls in flight and
  the queued writes (counters already kept), and the live rows of the store
  (`Store.live_counts`: PENDING promises, PENDING and CLAIMED tasks, and the
  PENDING ones by workflow version, of which those whose version no worker
  connected here runs are shown as waiting for it), read by
  the partial indexes of live rows, never the settled history, on the scrape's
  own HTTP thread, and at most once per `LIVE_CACHE_S` however often it is
  scraped (several Prometheus servers, a dashboard's refresh).

Every metric is in this server's own `CollectorRegistry` (a process may run
several servers, as tests do), named `troth_*`. The "Metrics" table of docs/operations.md
lists each name and label; `tests/api/test_metrics_api.py` scrapes them.
"""

from __future__ import annotations

import threading
import time
from importlib import metadata
from typing import TYPE_CHECKING

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import Collector

from troth_server.config import split_listen
from troth_server.domain.promise import PromiseState
from troth_server.domain.steps import INVOKE_TAG
from troth_server.store import StoreError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.metrics_core import Metric

    from troth_server.domain.promise import Promise
    from troth_server.domain.routing import Absence
    from troth_server.domain.task import Task
    from troth_server.domain.workers import StreamView
    from troth_server.store import LiveCounts
    from troth_server.sweeper import SweepCounts
    from troth_server.writes.batch import StateChange

log = structlog.get_logger("troth.metrics")

LIVE_CACHE_S = 5.0
"""The store's live counts are read at most this often (a scrape in between reuses them)."""

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def kind_and_group(promise: Promise) -> tuple[str, str]:
    """A promise's `kind` and `group` labels: a workflow's root (a child workflow's too)
    and its group; a step of a workflow (group empty: it is its root's, which the step
    does not carry); a standalone promise."""
    group = promise.tags.get(INVOKE_TAG)
    if group is not None:
        return "workflow", group
    return ("step" if promise.parent_id is not None else "promise"), ""


class Metrics:
    """This server's metrics: the instruments the components report to, and the
    scrape-time collector of the live state."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None
        info = Gauge("troth_server_info", "The troth-server version serving.", ["version"],
                     registry=r)  # fmt: skip
        info.labels(version=_version()).set(1)
        self.rpcs = Counter(
            "troth_rpcs_handled_total",
            "RPCs finished, by method and gRPC status code (a stream counts when it ends).",
            ["method", "code"],
            registry=r,
        )
        self.rpc_seconds = Histogram(
            "troth_rpc_duration_seconds",
            "Time from a unary RPC's start to its answer, by method and status code.",
            ["method", "code"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.refusals = Counter(
            "troth_overload_refusals_total",
            "Calls refused RESOURCE_EXHAUSTED (OVERLOADED) before any work, by method and "
            "by the limit (flag) that refused them.",
            ["method", "limit"],
            registry=r,
        )
        self.auth_refusals = Counter(
            "troth_auth_refusals_total",
            "Calls refused by authentication or authorization, by ErrorInfo reason (every "
            "one, though the auth.refused log lines are rate-limited).",
            ["reason"],
            registry=r,
        )
        self.commits = Counter(
            "troth_store_commits_total", "Group-commit transactions committed.", registry=r
        )
        self.commit_size = Histogram(
            "troth_store_commit_batch_size",
            "Write requests per committed group-commit transaction.",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.commit_seconds = Histogram(
            "troth_store_commit_duration_seconds",
            "Time one group-commit transaction took (load, apply, write, commit).",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.created = Counter(
            "troth_promises_created_total",
            "Promises created here, by kind (workflow, step, promise) and workflow group.",
            ["kind", "group"],
            registry=r,
        )
        self.settled = Counter(
            "troth_promises_settled_total",
            "Promises settled here (by a caller, a worker, expiry or a root's end), by final "
            "state, kind and workflow group.",
            ["state", "kind", "group"],
            registry=r,
        )
        self.leases_lost = Counter(
            "troth_task_leases_lost_total",
            "Task leases that ran out (the worker stopped heartbeating): the task went back "
            "to its group.",
            ["group"],
            registry=r,
        )
        self.sweeps = Counter(
            "troth_sweeps_total", "Passes of the sweeper (expiry, cleanup, retention).", registry=r
        )
        self.sweep_seconds = Histogram(
            "troth_sweep_duration_seconds",
            "Time one sweeper pass took.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.expired = Counter(
            "troth_sweep_expired_promises_total", "Promises the sweeper settled by expiry.",
            registry=r,
        )  # fmt: skip
        self.pruned = Counter(
            "troth_sweep_pruned_promises_total",
            "Settled promises deleted by retention (--retention).",
            registry=r,
        )
        self.sweep_failures = Counter(
            "troth_sweep_failures_total", "Sweeper passes that failed (store unreachable).",
            registry=r,
        )  # fmt: skip
        self.live = _LiveCollector()
        r.register(self.live)

    # -- events -----------------------------------------------------------------------------

    def rpc(self, method: str, code: str, seconds: float | None) -> None:
        """One RPC finished; `seconds` for unary calls (a stream's lifetime is no latency)."""
        self.rpcs.labels(method, code).inc()
        if seconds is not None:
            self.rpc_seconds.labels(method, code).observe(seconds)

    def refused(self, method: str, limit: str) -> None:
        self.refusals.labels(method, limit).inc()

    def auth_refused(self, reason: str) -> None:
        self.auth_refusals.labels(reason).inc()

    def commit(self, size: int, seconds: float) -> None:
        self.commits.inc()
        self.commit_size.observe(size)
        self.commit_seconds.observe(seconds)

    def changes(self, changes: Iterable[StateChange]) -> None:
        """What a commit changed: promises created and settled."""
        for change in changes:
            promise = change.promise
            kind, group = kind_and_group(promise)
            if change.old_state is None:
                self.created.labels(kind, group).inc()
            if promise.is_settled and change.old_state in (None, PromiseState.PENDING):
                self.settled.labels(promise.state.value, kind, group).inc()

    def lost(self, tasks: Iterable[Task]) -> None:
        for task in tasks:
            self.leases_lost.labels(task.group).inc()

    def sweep(self, counts: SweepCounts | None, seconds: float) -> None:
        """One sweeper pass (None: it failed)."""
        if counts is None:
            self.sweep_failures.inc()
            return
        self.sweeps.inc()
        self.sweep_seconds.observe(seconds)
        self.expired.inc(counts.expired)
        self.pruned.inc(counts.pruned)

    # -- the HTTP endpoint ------------------------------------------------------------------

    def serve(self, listen: str) -> int:
        """Serve `/metrics` on `listen` (HOST:PORT; port 0 picks one) from a thread of its
        own; returns the port. Raises OSError when the address cannot be bound."""
        host, port = split_listen(listen)
        self._server, self._thread = start_http_server(port, host, registry=self.registry)
        self.port = int(self._server.server_port)
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None


def _version() -> str:
    try:
        return metadata.version("troth-server")
    except metadata.PackageNotFoundError:  # run from a source tree
        return "unknown"


class _LiveCollector(Collector):
    """The state Prometheus sees at each scrape; its sources are set by the server."""

    def __init__(self) -> None:
        self.streams: Callable[[], list[StreamView]] | None = None
        self.live_counts: Callable[[], LiveCounts] | None = None
        self.in_flight: Callable[[], dict[str, int]] | None = None
        """{"unary": n, "stream": n}: calls the admission gates count now."""
        self.queued_writes: Callable[[], int] | None = None
        self.absent_versions: (
            Callable[[Iterable[tuple[str, str, str]]], dict[tuple[str, str, str], Absence]] | None
        ) = None
        """Of some (group, workflow, version), those no worker connected here runs, and
        since when (the dispatcher's `absent_versions`)."""
        self._lock = threading.Lock()
        self._cached: tuple[float, LiveCounts] | None = None

    def describe(self) -> Iterator[Metric]:
        return iter(())  # generated at scrape time: nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        yield from self._workers()
        yield from self._calls()
        counts = self._counts()
        if counts is None:
            return
        pending = GaugeMetricFamily(
            "troth_promises_pending",
            "PENDING promises in the store (every replica's), read at most every "
            f"{LIVE_CACHE_S:g} s.",
        )
        pending.add_metric([], counts.pending_promises)
        yield pending
        tasks = GaugeMetricFamily(
            "troth_tasks",
            "Tasks PENDING (waiting for a worker) or CLAIMED (leased to one) in the store, "
            "by state and group.",
            labels=["state", "group"],
        )
        for (state, group), n in sorted(counts.tasks.items()):
            tasks.add_metric([state, group], n)
        yield tasks
        yield from self._version_waits(counts)

    def _version_waits(self, counts: LiveCounts) -> Iterator[Metric]:
        if self.absent_versions is None:
            return
        absent = self.absent_versions(counts.versioned)
        waiting = GaugeMetricFamily(
            "troth_tasks_waiting_for_version",
            "PENDING tasks whose workflow version no worker connected here runs (their "
            "decisions recorded, their runs waiting), by group, workflow and version.",
            labels=["group", "workflow", "version"],
        )
        since = GaugeMetricFamily(
            "troth_workflow_version_absent_since_seconds",
            "For each version tasks wait for: since when (Unix time) no worker running it "
            "has been connected here (the last one left, or this server started).",
            labels=["group", "workflow", "version"],
        )
        for key, absence in sorted(absent.items()):
            waiting.add_metric(list(key), counts.versioned[key])
            since.add_metric(list(key), absence.since_ms / 1000)
        yield waiting
        yield since

    def _workers(self) -> Iterator[Metric]:
        if self.streams is None:
            return
        streams = self.streams()
        by_version: dict[tuple[str, str, str], set[str]] = {}
        held: dict[str, int] = {}
        for view in streams:
            for name, version in view.workflows or (("", ""),):
                by_version.setdefault((view.group, name, version), set()).add(view.worker_id)
            held[view.group] = held.get(view.group, 0) + len(view.held)
        workers = GaugeMetricFamily(
            "troth_workers_connected",
            "Workers with a Poll stream open here, by group and by each workflow version "
            "they run (workflow and version empty: a worker that takes any task).",
            labels=["group", "workflow", "version"],
        )
        for (group, name, version), ids in sorted(by_version.items()):
            workers.add_metric([group, name, version], len(ids))
        yield workers
        holding = GaugeMetricFamily(
            "troth_worker_tasks_held",
            "Tasks the workers connected here hold, by group.",
            labels=["group"],
        )
        for group, n in sorted(held.items()):
            holding.add_metric([group], n)
        yield holding

    def _calls(self) -> Iterator[Metric]:
        if self.in_flight is not None:
            calls = GaugeMetricFamily(
                "troth_rpcs_in_flight",
                "Calls in progress now: unary calls and open streams (Poll, watches).",
                labels=["type"],
            )
            for kind, n in sorted(self.in_flight().items()):
                calls.add_metric([kind], n)
            yield calls
        if self.queued_writes is not None:
            queued = GaugeMetricFamily(
                "troth_store_queued_writes", "Write requests waiting for the group committer."
            )
            queued.add_metric([], self.queued_writes())
            yield queued

    def _counts(self) -> LiveCounts | None:
        if self.live_counts is None:
            return None
        with self._lock:  # two scrapes at once read the store once
            now = time.monotonic()
            if self._cached is not None and now - self._cached[0] < LIVE_CACHE_S:
                return self._cached[1]
            try:
                counts = self.live_counts()
            except StoreError as exc:
                log.warning("metrics.store_unavailable", error=str(exc))
                return None if self._cached is None else self._cached[1]
            self._cached = (now, counts)
            return counts


__all__ = ["LIVE_CACHE_S", "Metrics", "kind_and_group"]
