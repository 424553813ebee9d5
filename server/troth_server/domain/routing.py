"""Which worker may take which task: workflow versions (pure: no I/O, no clock).

A worker's Poll stream lists the workflows it runs and their code versions:
for each name, first the version it runs new starts with (its *current*
version), then any older versions the workflow's author declared compatible.
A task carries its root's workflow name and, once a worker took the root, the
version that worker ran it with (recorded on the root and copied onto every
later task of it). The rules, in order:

1. A stream that lists nothing takes any task: a worker from before versions.
2. A task with a version goes only to a stream that lists (workflow, version):
   a parked workflow resumes only on the code that started it, or on code
   that declared itself compatible with it. While no such stream is
   connected, the task waits (PENDING), and tasks behind it go on.
3. A task without one (a start nobody took yet) goes to a stream whose
   current version of its workflow is the newest connected: once a new
   version is deployed, new starts run on it while the old workers finish
   what they started. Newest means: not declared compatible by another
   version (so older), then registered first most recently on this server.
4. A task whose workflow no stream of the group lists goes to any stream, as
   before versions: that worker rejects the root as "not registered" rather
   than leave a mistyped start waiting forever.

With several replicas, each routes among its own streams.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from troth_server.domain.task import Task

WorkflowKey = tuple[str, str]
"""(workflow name, version)."""

FUNC_TAG = "troth:func"
"""A root's workflow name, among its tags: its tasks carry it, for routing."""
MAX_WORKFLOW_NAME = 256
"""The longest workflow name a task records (a root with a longer one routes as unnamed)."""
MAX_WORKFLOW_VERSION = 128
"""The longest version a worker may register (and a root or task record)."""


def workflow_name(tags: Mapping[str, str]) -> str | None:
    """The workflow name a root's tasks carry: its `troth:func` tag, if it can be stored."""
    name = tags.get(FUNC_TAG)
    return name if name and len(name) <= MAX_WORKFLOW_NAME else None


@dataclass(frozen=True, slots=True)
class Registration:
    """What one Poll stream says it runs."""

    current: Mapping[str, str] = field(default_factory=dict)
    """Each workflow's version for new starts (the first listed for its name)."""
    accepted: frozenset[WorkflowKey] = frozenset()
    """Every (workflow, version) it runs: current ones and declared compatible ones."""

    @property
    def any_task(self) -> bool:
        return not self.accepted


def registration(pairs: Iterable[WorkflowKey]) -> Registration:
    """A stream's registration from its Poll request's list, in the order given."""
    listed = list(pairs)
    current: dict[str, str] = {}
    for name, version in listed:
        current.setdefault(name, version)
    return Registration(current, frozenset(listed))


@dataclass(frozen=True, slots=True)
class Route:
    """The tasks one stream may take, given the other streams of its group.

    Hashable: streams with equal routes take the same tasks (a claim that found
    too few for one of them finds too few for the others)."""

    any_task: bool = True
    accepted: frozenset[WorkflowKey] = frozenset()
    """Versioned tasks it takes (rule 2)."""
    unversioned: frozenset[str] = frozenset()
    """Workflows whose tasks without a version it takes: it runs their newest (rule 3)."""
    known: frozenset[str] = frozenset()
    """Every workflow some stream of the group lists (rule 4 is for the others)."""
    current: tuple[WorkflowKey, ...] = ()
    """Each workflow's version it records on a root it takes without one."""

    def accepts(self, workflow: str | None, version: str | None) -> bool:
        if self.any_task:
            return True
        if version:
            return workflow is not None and (workflow, version) in self.accepted
        return workflow is None or workflow in self.unversioned or workflow not in self.known

    def version_for(self, workflow: str | None) -> str | None:
        """The version a root of `workflow` that this stream takes runs with (None: unknown)."""
        return next((v for n, v in self.current if n == workflow), None)


ANY = Route()
"""The route of a stream that lists no workflows (rule 1)."""


class Deployments:
    """When each version was first registered on this server, and which versions
    declared which older ones compatible: what "newest" means (rule 3)."""

    def __init__(self) -> None:
        self._first_seen: dict[tuple[str, str, str], int] = {}
        self._superseded: set[tuple[str, str, str]] = set()
        self._count = 0

    def register(self, group: str, stream: Registration) -> None:
        for name, version in stream.current.items():
            key = (group, name, version)
            if key not in self._first_seen:
                self._count += 1
                self._first_seen[key] = self._count
        for name, version in stream.accepted:
            if stream.current.get(name) != version:
                self._superseded.add((group, name, version))

    def rank(self, group: str, name: str, version: str) -> tuple[bool, int, str]:
        """Higher is newer."""
        key = (group, name, version)
        return (key not in self._superseded, self._first_seen.get(key, 0), version)


def routes(group: str, streams: Sequence[Registration], deployments: Deployments) -> list[Route]:
    """The route of each of a group's streams (same order)."""
    newest: dict[str, str] = {}
    for stream in streams:
        for name, version in stream.current.items():
            best = newest.get(name)
            if best is None or deployments.rank(group, name, version) > deployments.rank(
                group, name, best
            ):
                newest[name] = version
    known = frozenset(newest)
    return [
        ANY
        if stream.any_task
        else Route(
            any_task=False,
            accepted=stream.accepted,
            unversioned=frozenset(n for n, v in stream.current.items() if newest[n] == v),
            known=known,
            current=tuple(sorted(stream.current.items())),
        )
        for stream in streams
    ]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A stream as routing sees it."""

    worker_id: str
    route: Route
    room: int


def choose_stream(task: Task, streams: Sequence[Candidate]) -> Candidate | None:
    """The stream the task should go to now, or None while none can take it.

    Among the streams with room that accept it: the worker it prefers (which
    may still hold the suspended generator), then the one with most room.
    """
    able = [
        s for s in streams if s.room > 0 and s.route.accepts(task.workflow, task.workflow_version)
    ]
    if not able:
        return None
    return max(able, key=lambda s: (s.worker_id == task.preferred_worker_id, s.room))


def version_absent(task: Task, streams: Sequence[Candidate]) -> bool:
    """Whether the task waits for a code version that no connected stream runs: it has
    a version (its root's) and no stream of its group accepts it (rule 2)."""
    if not task.workflow_version:
        return False
    return not any(s.route.accepts(task.workflow, task.workflow_version) for s in streams)


@dataclass(frozen=True, slots=True)
class Absence:
    """Since when no stream running a version has been connected here (wall ms, for
    operators): when the last one left, or when this server started (`left` False)."""

    since_ms: int
    left: bool

    def words(self) -> str:
        at = datetime.fromtimestamp(self.since_ms / 1000, UTC).isoformat(timespec="seconds")
        at = at.replace("+00:00", "Z")
        return (
            f"none connected since {at}"
            if self.left
            else (f"none connected since this server started at {at}")
        )


class Absences:
    """When the last stream running each (group, workflow, version) ended here (wall ms,
    given by the caller): since when a task of that version has had no worker."""

    def __init__(self, started_ms: int) -> None:
        self._started_ms = started_ms
        self._left: dict[tuple[str, str, str], int] = {}

    def ended(self, group: str, stream: Registration, at_ms: int) -> None:
        for name, version in stream.accepted:
            self._left[(group, name, version)] = at_ms

    def of(self, group: str, workflow: str, version: str) -> Absence:
        left = self._left.get((group, workflow, version))
        if left is None:
            return Absence(self._started_ms, left=False)
        return Absence(left, left=True)


def waiting_for(
    task: Task, group: str, streams: Sequence[Candidate], absence: Absence | None = None
) -> str:
    """Why a PENDING task is not delivered yet, in words for an operator; `absence`
    says since when its version has had no worker here (when `version_absent`)."""
    if version_absent(task, streams):
        return _waiting_for_version(task, group, streams, absence)
    if not streams:
        return f"waiting for a worker of group {group!r}: none is connected to this server"
    if choose_stream(task, streams) is not None:
        return f"being delivered to a worker of group {group!r}"
    able = [s for s in streams if s.route.accepts(task.workflow, task.workflow_version)]
    return (
        f"waiting for a free worker of group {group!r} ({len(able)} connected here "
        "can run it; all are at capacity or not heartbeating)"
    )


def _waiting_for_version(
    task: Task, group: str, streams: Sequence[Candidate], absence: Absence | None
) -> str:
    workflow = task.workflow or ""
    listed = sorted({v for s in streams for n, v in s.route.accepted if n == workflow})
    if not streams:
        here = f"no worker of group {group!r}"
    elif listed:
        here = f"{workflow!r} versions {', '.join(repr(v) for v in listed)}"
    else:
        here = f"no worker running {workflow!r}"
    since = f"{absence.words()}; " if absence is not None else ""
    return (
        f"waiting for a worker of group {group!r} running workflow {workflow!r} "
        f"version {task.workflow_version!r} ({since}connected here: {here})"
    )


__all__ = [
    "ANY",
    "FUNC_TAG",
    "MAX_WORKFLOW_NAME",
    "MAX_WORKFLOW_VERSION",
    "Absence",
    "Candidate",
    "Deployments",
    "Registration",
    "Route",
    "WorkflowKey",
    "choose_stream",
    "registration",
    "routes",
    "version_absent",
    "waiting_for",
    "workflow_name",
]
