"""`Approvers`: who may settle a promise, as `ctx.promise` and `Client.create` take it.

The server records the policy on the promise and enforces it at settle time
(`PERMISSION_DENIED`, reason `NOT_AN_APPROVER`, metadata `rule`); a settle that
carries a settle token is not checked against it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from troth.v1 import types_pb2

__all__ = ["Approvers"]


@dataclass(frozen=True, slots=True)
class Approvers:
    """Who may resolve or reject a promise (checked by the server at settle time).

    Attributes:
        principals: Principals allowed to settle it. With `roles`: either may.
            Both empty: any principal (the other rules still apply).
        roles: Roles allowed to settle it (`admin` counts only if listed).
        not_requester: Four-eyes: not the principal that started the workflow
            (the authenticated starter the server recorded, `Promise.started_by`).
        distinct: For quorums: a principal who settled another step of the same
            workflow with the same `quorum` may not settle this one.
        quorum: Names the quorum among the workflow's steps (with `distinct`).

    .. versionadded:: 0.2.0
    """

    principals: Iterable[str] = field(default=())
    roles: Iterable[str] = field(default=())
    not_requester: bool = False
    distinct: bool = False
    quorum: str = ""

    def __post_init__(self) -> None:
        # Frozen: normalise the iterables to sorted tuples (hashable, comparable).
        object.__setattr__(self, "principals", tuple(sorted(set(self.principals))))
        object.__setattr__(self, "roles", tuple(sorted(set(self.roles))))
        if self.quorum and not self.distinct:
            raise ValueError("Approvers(quorum=...) names a distinct quorum: set distinct=True")

    def to_proto(self) -> types_pb2.Approvers:
        return types_pb2.Approvers(
            principals=list(self.principals),
            roles=list(self.roles),
            not_requester=self.not_requester,
            distinct=self.distinct,
            quorum=self.quorum,
        )

    @classmethod
    def from_proto(cls, message: types_pb2.Approvers) -> Approvers:
        return cls(
            principals=list(message.principals),
            roles=list(message.roles),
            not_requester=message.not_requester,
            distinct=message.distinct,
            quorum=message.quorum,
        )
