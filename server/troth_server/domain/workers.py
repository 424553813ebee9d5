"""The connected workers as operators see them (`SearchWorkers`, `troth workers list`, the
metrics): one `WorkerSummary` per worker of a group, from the Poll streams it has open.

A worker is its (group, worker id, principal): the streams of one worker process
in one group (a second stream adds capacity) are summed, their held tasks joined.
Sorted by (group, worker id, principal); a page starts after the last worker of
the previous page (`After`), so a worker that connects or goes away between two
pages moves no other one. A principal scoped to id prefixes sees them without
principals and held tasks (`for_tenant`). Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable


@dataclass(frozen=True, slots=True)
class StreamView:
    """One open Poll stream (the dispatcher's table)."""

    worker_id: str
    group: str
    principal: str | None
    workflows: tuple[tuple[str, str], ...]
    """(workflow, version) pairs it runs, sorted; empty: any task of the group."""
    capacity: int
    held: tuple[str, ...]
    """Ids of the tasks it holds, sorted."""
    connected_ms: int
    last_seen_ms: int
    """Its worker's last task call (heartbeat, completion...) here, else its connect time."""
    stalled: bool


@dataclass(frozen=True, slots=True)
class WorkerSummary:
    worker_id: str
    group: str
    principal: str | None
    workflows: tuple[tuple[str, str], ...]
    """Every (workflow, version) one of its streams runs, sorted; empty: any task."""
    capacity: int
    """Tasks it may hold at once: the sum over its streams."""
    task_ids: tuple[str, ...]
    connect_ms: int
    """When its oldest open stream connected (this server's wall clock, ms)."""
    last_seen_ms: int
    """Its last heartbeat or other task call here (or its connect time)."""
    streams: int
    stalled: bool
    """A lease of it ran out: it gets no task until it heartbeats again."""

    @property
    def key(self) -> After:
        return After(self.group, self.worker_id, self.principal or "")


@dataclass(frozen=True, slots=True, order=True)
class After:
    """Where a page of workers starts: after this (group, worker id, principal)."""

    group: str
    worker_id: str
    principal: str = ""


def summarize(streams: Iterable[StreamView], group: str = "") -> list[WorkerSummary]:
    """The workers of `group` (every group when empty) from their open streams, sorted."""
    by_worker: dict[After, list[StreamView]] = {}
    for stream in streams:
        if group and stream.group != group:
            continue
        key = After(stream.group, stream.worker_id, stream.principal or "")
        by_worker.setdefault(key, []).append(stream)
    return [_summary(views) for _, views in sorted(by_worker.items())]


def _summary(views: list[StreamView]) -> WorkerSummary:
    first = views[0]
    return WorkerSummary(
        worker_id=first.worker_id,
        group=first.group,
        principal=first.principal,
        workflows=tuple(sorted({pair for v in views for pair in v.workflows})),
        capacity=sum(v.capacity for v in views),
        task_ids=tuple(sorted({task for v in views for task in v.held})),
        connect_ms=min(v.connected_ms for v in views),
        last_seen_ms=max(v.last_seen_ms for v in views),
        streams=len(views),
        stalled=any(v.stalled for v in views),
    )


def for_tenant(streams: Iterable[StreamView]) -> list[StreamView]:
    """The streams as a principal scoped to id prefixes sees them: which workers serve
    which groups and workflows, how much room and how alive, but neither the principal
    they authenticated as nor the tasks they hold, which may be any tenant's (its own
    workflows' tasks, with the worker holding each: `SearchTasks`). Summarized, a
    worker of two principals is one, so that no page token carries a principal."""
    return [replace(s, principal=None, held=()) for s in streams]


def page(
    workers: list[WorkerSummary], size: int, after: After | None = None
) -> tuple[list[WorkerSummary], After | None]:
    """The `size` workers after `after` (from the first when None), and where the next
    page starts (None: this is the last)."""
    rest = [w for w in workers if after is None or w.key > after]
    shown = rest[:size]
    return shown, (shown[-1].key if len(rest) > size else None)


__all__ = ["After", "StreamView", "WorkerSummary", "for_tenant", "page", "summarize"]
