"""Workflow starts: when a start of an id that exists is a repeat, and what a refusal says.

A start is a create tagged `troth:invoke=<group>` and `troth:func=<name>`, its
param the encoded arguments (`Client.start`, `ctx.start`, or grpcurl). A
workflow's id is its identity, so a second start of an existing workflow is
answered with the existing run (`created=False`) when it

1. carries the idempotency key the original start carried (whatever else it
   says: the caller vouches that it is the same start), or
2. names the same workflow, group and arguments (param), whatever keys either
   carried and whatever other tags or expiry it asks for;

and is refused otherwise (`WorkflowAlreadyExists`, ALREADY_EXISTS, reason
`WORKFLOW_ALREADY_EXISTS`), saying what differs and what to do. A start of an
id held by a promise that is not a workflow is refused too. Every other
create keeps the rules of `domain.promise.create` (same key, or no keys and
identical param and tags). Pure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from troth.errors import Reason
from troth_server.domain.errors import DomainError, PromiseAlreadyExists
from troth_server.domain.routing import FUNC_TAG

if TYPE_CHECKING:
    from collections.abc import Mapping

    from troth_server.domain.promise import CreateRequest, Promise

INVOKE_TAG = "troth:invoke"
"""A root promise tagged `troth:invoke=<group>` starts a workflow in that group."""


def is_start(tags: Mapping[str, str]) -> bool:
    """Whether a create with these tags starts a workflow (a root, or a child workflow)."""
    return INVOKE_TAG in tags


class WorkflowAlreadyExists(PromiseAlreadyExists):
    """A start of a workflow id that exists as another workflow, group or arguments."""

    reason = Reason.WORKFLOW_ALREADY_EXISTS

    def __init__(self, existing: Promise, differences: list[tuple[str, str]]) -> None:
        """`differences`: (field, phrase) for each of workflow, group, arguments that differ."""
        name = existing.tags.get(FUNC_TAG, "")
        phrases = ", ".join(phrase for _, phrase in differences)
        DomainError.__init__(
            self,
            f"workflow {existing.id!r} already exists as {name!r} {phrases}; use another "
            "id for a new run, start it with the original workflow, group and arguments "
            "to get the existing run, or pass the original start's idempotency key to "
            "get it whatever the rest of the start says",
            promise_id=existing.id,
            workflow=name,
            differences=",".join(field for field, _ in differences),
        )
        self.promise_id = existing.id
        self.differences = tuple(field for field, _ in differences)


def check_repeat(existing: Promise, request: CreateRequest) -> None:
    """Raise unless `request`, a start (`is_start`), repeats the start that made
    `existing` (rules 1 and 2 of the module docstring)."""
    if not is_start(existing.tags):
        raise PromiseAlreadyExists(
            request.id,
            "it is a promise, not a workflow (it has no troth:invoke tag); start the "
            "workflow under another id",
        )
    key = request.idempotency_key
    if key and key == existing.idempotency_key_for_create:
        return
    asked, have = request.tags, existing.tags
    differences: list[tuple[str, str]] = []
    if asked.get(FUNC_TAG, "") != have.get(FUNC_TAG, ""):
        differences.append(("workflow", f"(this start names {asked.get(FUNC_TAG, '')!r})"))
    if asked[INVOKE_TAG] != have[INVOKE_TAG]:
        group = f"in group {have[INVOKE_TAG]!r} (this start names {asked[INVOKE_TAG]!r})"
        differences.append(("group", group))
    if request.param != existing.param:
        differences.append(("arguments", "with other arguments"))
    if differences:
        raise WorkflowAlreadyExists(existing, differences)
