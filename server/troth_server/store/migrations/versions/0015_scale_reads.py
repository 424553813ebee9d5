"""reads bounded by their page at scale: steps-only parent indexes

Revision ID: 0015
Revises: 0013
Create Date: 2027-03-12

The two indexes of a workflow's steps by parent (`ix_promises_parent_seq`, a
workflow's history; `ix_promises_pending_parent`, its PENDING steps) held every
promise, and a root or a standalone promise has no parent: with a backlog of
200,000 PENDING roots they were one NULL key of 200,000 rows. SQLite's
statistics (`sqlite_stat1`, written by ANALYZE or `PRAGMA optimize`) average the
rows per key over the keys, NULL among them, so they said "200,000 rows per
parent" and SQLite scanned the table to read a workflow's PENDING steps. Each now
holds steps only (`parent_id IS NOT NULL`); a comparison on `parent_id` implies
that, to both planners.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0013"
branch_labels = None
depends_on = None

_STEPS = "parent_id IS NOT NULL"
_PARENT_INDEXES = {
    # name: (columns, (where before, where now))
    "ix_promises_parent_seq": (["parent_id", "seq"], (None, _STEPS)),
    "ix_promises_pending_parent": (
        ["parent_id"],
        ("state = 'PENDING'", f"state = 'PENDING' AND {_STEPS}"),
    ),
}


def _parent_indexes(now: bool) -> None:
    for name, (columns, wheres) in _PARENT_INDEXES.items():
        op.drop_index(name, "promises")
        where = wheres[1] if now else wheres[0]
        partial = sa.text(where) if where is not None else None
        op.create_index(name, "promises", columns, sqlite_where=partial, postgresql_where=partial)


def upgrade() -> None:
    _parent_indexes(now=True)


def downgrade() -> None:
    _parent_indexes(now=False)
