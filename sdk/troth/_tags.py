"""The tags the SDK puts on workflow roots and steps (`troth:` keys): the shared words
of the worker, the client and the `troth` command. Apart from `troth._commands` so that
reading them imports nothing else."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "TAG_ARGS",
    "TAG_FUNC",
    "TAG_GROUP",
    "TAG_INVOKE",
    "TAG_KIND",
    "TAG_TIMER",
    "is_workflow_root",
]

TAG_KIND = "troth:kind"
"""Step tag: which command created the step (a `Kind` value)."""
TAG_FUNC = "troth:func"
"""Step tag: the function (`run`) or workflow (`start`) name; root tag: the workflow name."""
TAG_ARGS = "troth:args"
"""Step tag: the digest of what the command asked (`troth._digests`), checked on replay."""
TAG_INVOKE = "troth:invoke"
"""Root tag: the group whose workers run the workflow."""
TAG_TIMER = "troth:timer"
"""Tag `"true"` on a timer promise: it resolves (not times out) at its expire_time."""
TAG_GROUP = "troth:group"
"""Step tag on a `ctx.promise()` step: its workflow's group (what an approvals inbox filters on)."""


def is_workflow_root(tags: Mapping[str, str]) -> bool:
    """Whether a promise with these tags is a workflow's root (what `Client.start`
    creates): it names its workflow and the group that runs it."""
    return bool(tags.get(TAG_FUNC)) and TAG_INVOKE in tags
