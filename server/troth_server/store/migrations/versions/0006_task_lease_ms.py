"""the lease a task's holder asked for, on the task

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

An outage never takes a lease: when a server starts, or comes back after
being frozen or cut off from its store, it takes a CLAIMED task's lease only
once one lease length has passed (its workers could not heartbeat while it was
away). The lease length is the one the holder asked for in its latest claim or
heartbeat. Nullable: a task claimed before this revision has none, and is
given the longest default lease (domain/task.py, UNKNOWN_LEASE_MS).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("lease_ms", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("lease_ms")
