"""workflow roots listed by an index: their group and name out of the tags

Revision ID: 0012
Revises: 0011
Create Date: 2027-02-24

A workflow is the promise that starts one, tagged `troth:invoke` (its worker
group) and `troth:func` (its name). `SearchWorkflows` (`troth workflows list`,
the console's Workflows page) lists them newest first, by group, name or
version: the tags are copied into `workflow_group` and `workflow_name` when a
workflow's root is created (as `timer` is), NULL for every other promise, so
that two partial indexes hold the workflow roots only, however long the
history of steps and standalone promises:

- `ix_promises_workflows`: every workflow, in creation order;
- `ix_promises_workflows_group`: one group's, in creation order.

And `ix_tasks_paused`: the tasks whose workflow code failed and that are not
completed (a paused workflow's), few however many tasks there are.

Rows before this revision are backfilled from their tags.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_WORKFLOWS = sa.text("workflow_group IS NOT NULL")
_PAUSED = sa.text("failed_attempts > 0 AND state IN ('PENDING', 'CLAIMED')")


def upgrade() -> None:
    # Plain ADD COLUMNs (nullable, no default): on SQLite too, no copy of the table.
    op.add_column("promises", sa.Column("workflow_group", sa.String(256), nullable=True))
    op.add_column("promises", sa.Column("workflow_name", sa.String(256), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "UPDATE promises SET workflow_group = tags ->> 'troth:invoke', "
            "workflow_name = CASE WHEN length(tags ->> 'troth:func') <= 256 "
            "THEN tags ->> 'troth:func' END WHERE tags ? 'troth:invoke'"
        )
    else:
        op.execute(
            "UPDATE promises SET workflow_group = json_extract(tags, '$.\"troth:invoke\"'), "
            "workflow_name = CASE WHEN length(json_extract(tags, '$.\"troth:func\"')) <= 256 "
            "THEN json_extract(tags, '$.\"troth:func\"') END "
            "WHERE json_type(tags, '$.\"troth:invoke\"') IS NOT NULL"
        )
    op.create_index(
        "ix_promises_workflows",
        "promises",
        ["seq"],
        sqlite_where=_WORKFLOWS,
        postgresql_where=_WORKFLOWS,
    )
    op.create_index(
        "ix_promises_workflows_group",
        "promises",
        ["workflow_group", "seq"],
        sqlite_where=_WORKFLOWS,
        postgresql_where=_WORKFLOWS,
    )
    op.create_index(
        "ix_tasks_paused",
        "tasks",
        ["root_promise_id"],
        sqlite_where=_PAUSED,
        postgresql_where=_PAUSED,
    )


def downgrade() -> None:
    op.drop_index("ix_tasks_paused", "tasks")
    op.drop_index("ix_promises_workflows_group", "promises")
    op.drop_index("ix_promises_workflows", "promises")
    with op.batch_alter_table("promises") as batch:
        batch.drop_column("workflow_name")
        batch.drop_column("workflow_group")
