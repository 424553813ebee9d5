"""Who may call what: principals, roles, and the one RPC x role table (DESIGN §7).

Pure: the authentication interceptor (`troth_server.api._auth`) finds the caller's
`Principal`; everything here decides from it and the call, without I/O.

Roles:

- `worker`: the task calls (`Poll`, `Heartbeat`, `CompleteTask`, `ReleaseTask`,
  `RegisterCallbacks`) and its workflows' step writes, for the task groups its
  grant names (`Principal.groups`); a worker and nothing more reads and settles
  only its groups' workflows' promises (`domain.steps.check_worker_reach`), and lists
  only those workflows;
- `gateway`: starts workflows, reads, searches and watches promises, settles them,
  lists workflows;
- `operator`: reads, searches and watches promises, cancels them, lists tasks and
  workflows, fails, moves and retries workflows;
- `admin`: everything, including `PrunePromises`.

Every role may open `Calls`, the stream that carries a worker's or a client's
unary calls as messages: each call on it is authorized as its own RPC.

A principal may further be scoped to id prefixes (`Principal.prefixes`): a tenant
sees and touches only promises whose ids start with one of them (`may_touch`; its
searches and watches narrowed by `narrow`). Such a principal works for no task
group: workers are scoped by their groups, whose workflows' ids their starters chose.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


class Role(enum.StrEnum):
    WORKER = "worker"
    GATEWAY = "gateway"
    OPERATOR = "operator"
    ADMIN = "admin"


ANY_GROUP = "*"
"""In `Principal.groups`: every task group."""

RESERVED_NAME_PREFIXES = ("troth:", "settle-token:")
"""Names the server records itself as `settled_by`: `troth:timeout`, `troth:workflow`,
and a settle token's `settle-token:<key id>:<token id>` (`domain.settle_tokens`). No
principal has one, from any source (a token file, a JWT's `sub`, the `troth-principal`
metadata with authentication off), so a settle recorded under one is always the
server's own."""


MAX_PERMISSION_LENGTH = 128
MAX_PERMISSIONS = 256
"""Most permission names one principal may carry (a token-file entry, a JWT's claim)."""
PERMISSION_CHARS = "A-Z a-z 0-9 and . _ : / @ + = ~ # -"
_PERMISSION = re.compile(rf"[A-Za-z0-9._:/@+=~#-]{{1,{MAX_PERMISSION_LENGTH}}}")


def permission_problem(name: object) -> str | None:
    """What is wrong with a permission name (None: nothing). A permission is 1 to 128
    of `PERMISSION_CHARS` (no spaces: an OAuth `scope` claim is names separated by
    them), compared as it is written, case and all: `payouts:approve`."""
    if not isinstance(name, str):
        return f"must be a string, not {type(name).__name__}"
    if _PERMISSION.fullmatch(name) is None:
        shown = name if len(name) <= 60 else name[:57] + "..."
        return (
            f"{shown!r} is no permission name: use 1 to {MAX_PERMISSION_LENGTH} of "
            f"{PERMISSION_CHARS} (such as 'payouts:approve')"
        )
    return None


def check_permissions(values: Iterable[object], where: str, limit: int) -> frozenset[str]:
    """Permission names, each checked (`permission_problem`), at most `limit` of them;
    `ValueError` naming `where` (with the index of a bad one) otherwise."""
    found = list(values)
    if len(found) > limit:
        raise ValueError(f"{where}: lists {len(found)} permissions; the limit is {limit}")
    for i, name in enumerate(found):
        problem = permission_problem(name)
        if problem is not None:
            raise ValueError(f"{where}[{i}]: {problem}")
    return frozenset(str(name) for name in found)


def reserved_prefix(name: str) -> str | None:
    """The reserved prefix `name` starts with (None: a name a principal may have)."""
    return next((p for p in RESERVED_NAME_PREFIXES if name.startswith(p)), None)


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller (or, with authentication off, the local developer)."""

    name: str
    roles: frozenset[Role]
    groups: frozenset[str] = field(default_factory=frozenset)
    """Task groups a worker may poll and work for (`ANY_GROUP` for all)."""
    prefixes: tuple[str, ...] = ()
    """Id prefixes this principal may see and touch; empty for every id."""
    authenticated: bool = True
    """False only for `LOCAL_DEVELOPER`, the caller when authentication is off."""
    permissions: frozenset[str] = field(default_factory=frozenset)
    """Permission names granted to it (`payouts:approve`): what an approver policy's
    `permissions` admit (`domain.approvers`). They add no RPC: roles decide those."""

    def has(self, role: Role) -> bool:
        return role in self.roles or Role.ADMIN in self.roles

    def may_work_for(self, group: str) -> bool:
        """Whether this principal may poll `group` and write its workflows' steps."""
        if Role.ADMIN in self.roles:
            return True
        return Role.WORKER in self.roles and (ANY_GROUP in self.groups or group in self.groups)

    def may_touch(self, promise_id: str) -> bool:
        """Whether `promise_id` is inside this principal's id prefixes."""
        return not self.prefixes or promise_id.startswith(self.prefixes)

    def scope(self, id_glob: str) -> tuple[str, ...] | None:
        """What a search or watch by `id_glob` is narrowed to (`narrow`)."""
        return narrow(id_glob, self.prefixes)


def narrow(id_glob: str, prefixes: tuple[str, ...]) -> tuple[str, ...] | None:
    """The id prefixes a search by `id_glob` (`*` any run of characters) must also
    match for a principal scoped to `prefixes`: () when every id the glob matches is
    inside them already (or the principal is unscoped), None when none can be (the
    search returns nothing), else those of `prefixes` the glob's matches may start with.
    """
    if not prefixes:
        return ()
    literal = id_glob.split("*", 1)[0]
    if literal.startswith(prefixes):
        return ()
    if "*" not in id_glob:
        return None  # one id, outside every prefix
    inside = tuple(p for p in prefixes if p.startswith(literal))
    return inside or None


LOCAL_DEVELOPER = Principal(
    name="local-developer",
    roles=frozenset(Role),
    groups=frozenset({ANY_GROUP}),
    authenticated=False,
)
"""The caller of every RPC when authentication is off (`troth serve --no-auth`,
loopback only): may do everything, and names itself with `troth-principal`."""


_WORKER = frozenset({Role.WORKER, Role.ADMIN})
_READERS = frozenset({Role.WORKER, Role.GATEWAY, Role.OPERATOR, Role.ADMIN})
_WATCHERS = frozenset({Role.GATEWAY, Role.OPERATOR, Role.ADMIN})

RPC_ROLES: Mapping[str, frozenset[Role]] = {
    # troth.v1.PromiseService
    "CreatePromise": frozenset({Role.WORKER, Role.GATEWAY, Role.ADMIN}),
    "GetPromise": _READERS,
    "SearchPromises": _WATCHERS,
    "ResolvePromise": frozenset({Role.WORKER, Role.GATEWAY, Role.ADMIN}),
    "RejectPromise": frozenset({Role.WORKER, Role.GATEWAY, Role.ADMIN}),
    "CancelPromise": frozenset({Role.OPERATOR, Role.ADMIN}),
    "WatchPromise": _READERS,
    "WaitPromise": _READERS,
    "WatchPromises": _WATCHERS,
    "PrunePromises": frozenset({Role.ADMIN}),
    # A worker mints only for its own workflows' steps (with its task's fence).
    "MintSettleToken": frozenset({Role.WORKER, Role.GATEWAY, Role.ADMIN}),
    # Who the caller is: every principal may read its own grant.
    "WhoAmI": frozenset(Role),
    # troth.v1.TaskService
    "Poll": _WORKER,
    "CompleteTask": _WORKER,
    "Heartbeat": _WORKER,
    "ReleaseTask": _WORKER,
    "RegisterCallbacks": _WORKER,
    "SearchTasks": frozenset({Role.OPERATOR, Role.ADMIN}),
    # A worker fails only the task it holds (fenced); an operator fails a workflow.
    "FailTask": _WORKER,
    "FailWorkflow": frozenset({Role.OPERATOR, Role.ADMIN}),
    # An operator moves a waiting workflow to another version of its code.
    "MoveWorkflow": frozenset({Role.OPERATOR, Role.ADMIN}),
    "SearchWorkers": frozenset({Role.OPERATOR, Role.ADMIN}),
    # Whoever reads workflows lists them: a worker and nothing more only its groups'.
    "SearchWorkflows": _READERS,
    # An operator hurries a paused workflow's retry (like failing or moving one).
    "RetryWorkflowNow": frozenset({Role.OPERATOR, Role.ADMIN}),
    # A workflow's state slot: read by whoever reads the workflow (its root); rewritten
    # by an operator while the run is parked, a repair like moving it (not a gateway's:
    # a gateway settles decisions, it does not edit what a run remembers).
    "GetWorkflowState": _READERS,
    "ReplaceWorkflowState": frozenset({Role.OPERATOR, Role.ADMIN}),
    # Schedules start workflows on their own: operators and admins define, pause and
    # delete them (and read them).
    "CreateSchedule": frozenset({Role.OPERATOR, Role.ADMIN}),
    "UpdateSchedule": frozenset({Role.OPERATOR, Role.ADMIN}),
    "GetSchedule": frozenset({Role.OPERATOR, Role.ADMIN}),
    "SearchSchedules": frozenset({Role.OPERATOR, Role.ADMIN}),
    "PauseSchedule": frozenset({Role.OPERATOR, Role.ADMIN}),
    "ResumeSchedule": frozenset({Role.OPERATOR, Role.ADMIN}),
    "DeleteSchedule": frozenset({Role.OPERATOR, Role.ADMIN}),
    # Unary calls on one stream (a worker's, a client's): each is authorized as its
    # own RPC, so every role may open it.
    "Calls": frozenset(Role),
}
"""Which roles may call each RPC (the one table; docs/authentication.md shows the copy
generated from it by `python -m troth_server.domain.access`). A `ResolvePromise` or `RejectPromise`
that carries a settle token needs no role: the token is its permission."""


def may_call(principal: Principal, rpc: str) -> bool:
    """Whether `principal` may call `rpc` at all (finer checks come with the request)."""
    allowed = RPC_ROLES.get(rpc)
    return allowed is not None and not allowed.isdisjoint(principal.roles)


def roles_table() -> str:
    """`RPC_ROLES` as a Markdown table, for docs/authentication.md."""
    columns = list(Role)
    lines = [
        "| RPC | " + " | ".join(f"`{role}`" for role in columns) + " |",
        "| --- | " + " | ".join(":-:" for _ in columns) + " |",
    ]
    for rpc, allowed in RPC_ROLES.items():
        marks = " | ".join("yes" if role in allowed else "" for role in columns)
        lines.append(f"| `{rpc}` | {marks} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(roles_table())
