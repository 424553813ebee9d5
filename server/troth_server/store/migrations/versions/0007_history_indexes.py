"""cost does not grow with history: indexes for every loop statement, retention

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

- `tasks.complete_time`: completed tasks are deleted by the sweeper a while
  after they complete (long enough for a repeated CompleteTask whose reply was
  lost to be answered as the first one was), through `ix_tasks_completed`.
  Tasks completed before this revision have none: they are deleted at the
  first sweep after the upgrade (they are past any repeat by then).
- `ix_promises_pending_seq`: PENDING searches in creation order walk only the
  live promises.
- `ix_promises_expire_seq`: searches by deadline over settled promises too.
- `ix_promises_root`: a workflow's steps (its whole tree), pruned with its root.
- `ix_promises_settled_top`: retention's candidates (settled top-level
  promises) by settle time.
- `ix_promises_tags` (PostgreSQL only): GIN over tags for containment filters.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_PENDING = sa.text("state = 'PENDING'")
_SETTLED_TOP = sa.text("root_id IS NULL AND state <> 'PENDING'")
_COMPLETED = sa.text("state = 'COMPLETED'")
_STEPS = sa.text("root_id IS NOT NULL")


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("complete_time", sa.BigInteger(), nullable=True))
    # Completed before this revision: due for deletion at the first sweep.
    op.execute("UPDATE tasks SET complete_time = 0 WHERE state = 'COMPLETED'")
    op.create_index(
        "ix_tasks_completed",
        "tasks",
        ["complete_time"],
        sqlite_where=_COMPLETED,
        postgresql_where=_COMPLETED,
    )
    op.create_index(
        "ix_promises_pending_seq",
        "promises",
        ["seq"],
        sqlite_where=_PENDING,
        postgresql_where=_PENDING,
    )
    op.create_index("ix_promises_expire_seq", "promises", ["expire_time", "seq"])
    op.create_index(
        "ix_promises_root",
        "promises",
        ["root_id"],
        sqlite_where=_STEPS,
        postgresql_where=_STEPS,
    )
    op.create_index(
        "ix_promises_settled_top",
        "promises",
        ["settle_time", "seq"],
        sqlite_where=_SETTLED_TOP,
        postgresql_where=_SETTLED_TOP,
    )
    if op.get_bind().dialect.name == "postgresql":
        op.create_index(
            "ix_promises_tags",
            "promises",
            ["tags"],
            postgresql_using="gin",
            postgresql_ops={"tags": "jsonb_path_ops"},
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_index("ix_promises_tags", "promises")
    op.drop_index("ix_promises_settled_top", "promises")
    op.drop_index("ix_promises_root", "promises")
    op.drop_index("ix_promises_expire_seq", "promises")
    op.drop_index("ix_promises_pending_seq", "promises")
    op.drop_index("ix_tasks_completed", "tasks")
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("complete_time")
