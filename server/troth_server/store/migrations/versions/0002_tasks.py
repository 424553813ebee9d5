"""tasks and callbacks

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tasks",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("root_promise_id", sa.String(1024), nullable=False),
        sa.Column("group", sa.String(256), nullable=False),
        sa.Column("kind", sa.String(10), nullable=False),
        sa.Column("state", sa.String(12), nullable=False),
        sa.Column("counter", sa.BigInteger(), nullable=False),
        sa.Column("worker_id", sa.String(256), nullable=True),
        sa.Column("lease_expire_time", sa.BigInteger(), nullable=True),
        sa.Column("preferred_worker_id", sa.String(256), nullable=True),
        sa.Column("resume_pending", sa.Boolean(), nullable=False),
        sa.Column("create_time", sa.BigInteger(), nullable=False),
    )
    pending = sa.text("state = 'PENDING'")
    claimed = sa.text("state = 'CLAIMED'")
    active = sa.text("state IN ('PENDING', 'CLAIMED')")
    op.create_index(
        "ix_tasks_pending_group", "tasks", ["group", "create_time"],
        sqlite_where=pending, postgresql_where=pending,
    )  # fmt: skip
    op.create_index(
        "ix_tasks_claimed_lease", "tasks", ["lease_expire_time"],
        sqlite_where=claimed, postgresql_where=claimed,
    )  # fmt: skip
    op.create_index(
        "ix_tasks_claimed_worker", "tasks", ["worker_id"],
        sqlite_where=claimed, postgresql_where=claimed,
    )  # fmt: skip
    op.create_index(
        "ux_tasks_active_root", "tasks", ["root_promise_id"], unique=True,
        sqlite_where=active, postgresql_where=active,
    )  # fmt: skip
    op.create_table(
        "callbacks",
        sa.Column("promise_id", sa.String(1024), primary_key=True),
        sa.Column("root_promise_id", sa.String(1024), primary_key=True),
        sa.Column("group", sa.String(256), nullable=False),
        sa.Column("worker_id", sa.String(256), nullable=True),
        sa.Column("create_time", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_callbacks_root", "callbacks", ["root_promise_id"])


def downgrade() -> None:
    op.drop_index("ix_callbacks_root", table_name="callbacks")
    op.drop_table("callbacks")
    for name in (
        "ux_tasks_active_root",
        "ix_tasks_claimed_worker",
        "ix_tasks_claimed_lease",
        "ix_tasks_pending_group",
    ):
        op.drop_index(name, table_name="tasks")
    op.drop_table("tasks")
