"""a task's failures: attempts, the last error and traceback, the next attempt

Revision ID: 0010
Revises: 0009
Create Date: 2027-01-27

A bug pauses a workflow, it does not lose it: when workflow code raises an
exception it did not mean as the workflow's outcome, the worker fails the task
(FailTask), not the root. The task goes back to PENDING, claimable again only
at `next_attempt_time` (a jittered exponential backoff, domain/task.py:
retry_delay_ms), with `failed_attempts`, `last_error` and `last_traceback`
recorded, so that `troth tasks list` and `troth workflows show` can say why a
workflow is not moving. Tasks before this revision never failed: 0 attempts,
no error, claimable at once.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(
            sa.Column("failed_attempts", sa.Integer(), nullable=False, server_default=sa.text("0"))
        )
        batch.add_column(sa.Column("last_error", sa.Text(), nullable=True))
        batch.add_column(sa.Column("last_traceback", sa.Text(), nullable=True))
        batch.add_column(sa.Column("next_attempt_time", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("next_attempt_time")
        batch.drop_column("last_traceback")
        batch.drop_column("last_error")
        batch.drop_column("failed_attempts")
