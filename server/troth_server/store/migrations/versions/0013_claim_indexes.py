"""claims in index order, and searches of a rejected state by its own index

Revision ID: 0013
Revises: 0012
Create Date: 2027-03-10

A claim took a group's PENDING tasks ordered by "preferred for this worker, then
for nobody, then for another worker", then by age: no index serves that order,
so every claim sorted the group's whole backlog. It now runs one probe per kind
of task, each `ORDER BY create_time LIMIT n` (or by `next_attempt_time`) on a
partial index that holds exactly those rows, in that order:

- `ix_tasks_ready_preferred`: ready tasks preferred for a worker, by group, that
  worker and age (a worker's own resumes);
- `ix_tasks_ready_anyone`: ready tasks preferred for nobody, by group and age;
- `ix_tasks_ready_promised`: ready tasks preferred for some worker, by group and
  age (those another worker may take when nothing else is left);
- `ix_tasks_backoff`: tasks waiting out a retry backoff, by group and the time
  they may run again.

A ready task is PENDING with no `next_attempt_time` (a claim clears it).

And a search for a rejected state walks that state's rows in seq order, not the
whole history: `ix_promises_rejected_seq`, `ix_promises_canceled_seq`,
`ix_promises_timedout_seq` (each partial on its state; RESOLVED rows are most of
a history, and a walk in seq order finds them densely).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_READY = "state = 'PENDING' AND next_attempt_time IS NULL"
_INDEXES = {
    "ix_tasks_ready_preferred": (
        ["group", "preferred_worker_id", "create_time"],
        f"{_READY} AND preferred_worker_id IS NOT NULL",
    ),
    "ix_tasks_ready_anyone": (
        ["group", "create_time"],
        f"{_READY} AND preferred_worker_id IS NULL",
    ),
    "ix_tasks_ready_promised": (
        ["group", "create_time"],
        f"{_READY} AND preferred_worker_id IS NOT NULL",
    ),
    "ix_tasks_backoff": (
        ["group", "next_attempt_time"],
        "state = 'PENDING' AND next_attempt_time IS NOT NULL",
    ),
}


_STATE_INDEXES = {
    "ix_promises_rejected_seq": "REJECTED",
    "ix_promises_canceled_seq": "REJECTED_CANCELED",
    "ix_promises_timedout_seq": "REJECTED_TIMEDOUT",
}


def upgrade() -> None:
    for name, (columns, where) in _INDEXES.items():
        op.create_index(
            name, "tasks", columns, sqlite_where=sa.text(where), postgresql_where=sa.text(where)
        )
    for name, state in _STATE_INDEXES.items():
        only = sa.text(f"state = '{state}'")
        op.create_index(name, "promises", ["seq"], sqlite_where=only, postgresql_where=only)


def downgrade() -> None:
    for name in reversed(_STATE_INDEXES):
        op.drop_index(name, "promises")
    for name in reversed(_INDEXES):
        op.drop_index(name, "tasks")
