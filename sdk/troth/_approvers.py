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
        principals: Principals allowed to settle it. With `roles` and
            `permissions`: any of them admits. All empty: any principal (the other
            rules still apply).
        roles: Roles allowed to settle it (`admin` counts only if listed).
        permissions: Permission names (`"payouts:approve"`): a principal whose
            credential grants one of them may settle it (the server's token file's
            `permissions`, a JWT's permissions claim). Each 1 to 128 of
            `A-Z a-z 0-9 . _ : / @ + = ~ # -`.
        not_requester: Four-eyes: not the principal that started the workflow
            (the authenticated starter the server recorded, `Promise.started_by`).
        distinct: For quorums: a principal who settled another step of the same
            workflow with the same `quorum` may not settle this one.
        quorum: Names the quorum among the workflow's steps (with `distinct`).

    .. versionadded:: 0.2.0
    .. versionchanged:: 0.2.0 `permissions`.
    """

    principals: Iterable[str] = field(default=())
    roles: Iterable[str] = field(default=())
    not_requester: bool = False
    distinct: bool = False
    quorum: str = ""
    permissions: Iterable[str] = field(default=())

    def __post_init__(self) -> None:
        # Frozen: normalise the iterables to sorted tuples (hashable, comparable).
        object.__setattr__(self, "principals", _names(self.principals, "principals"))
        object.__setattr__(self, "roles", _names(self.roles, "roles"))
        object.__setattr__(self, "permissions", _names(self.permissions, "permissions"))
        if self.quorum and not self.distinct:
            raise ValueError("Approvers(quorum=...) names a distinct quorum: set distinct=True")

    def to_proto(self) -> types_pb2.Approvers:
        return types_pb2.Approvers(
            principals=list(self.principals),
            roles=list(self.roles),
            not_requester=self.not_requester,
            distinct=self.distinct,
            quorum=self.quorum,
            permissions=list(self.permissions),
        )

    @classmethod
    def from_proto(cls, message: types_pb2.Approvers) -> Approvers:
        return cls(
            principals=list(message.principals),
            roles=list(message.roles),
            not_requester=message.not_requester,
            distinct=message.distinct,
            quorum=message.quorum,
            permissions=list(message.permissions),
        )


def _names(values: Iterable[str], name: str) -> tuple[str, ...]:
    if isinstance(values, str):  # a str is an iterable of letters: surely a mistake
        raise TypeError(f"Approvers({name}=...) takes a list of names, not the string {values!r}")
    return tuple(sorted(set(values)))
