"""approval metadata on promises; workflow versions on roots and tasks

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

Promises gain what a human needs to settle one (a JSON Schema for its value, a
title, a message, who asked) and, on a workflow's root, the version of the
code that runs it. Tasks carry their root's workflow and version so that the
dispatcher can route them without reading the root. All columns are nullable:
existing rows simply have none.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("promises") as batch:
        batch.add_column(sa.Column("schema", sa.Text(), nullable=True))
        batch.add_column(sa.Column("title", sa.String(1024), nullable=True))
        batch.add_column(sa.Column("message", sa.Text(), nullable=True))
        batch.add_column(sa.Column("requested_by", sa.String(1024), nullable=True))
        batch.add_column(sa.Column("workflow_version", sa.String(128), nullable=True))
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("workflow", sa.String(256), nullable=True))
        batch.add_column(sa.Column("workflow_version", sa.String(128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("workflow_version")
        batch.drop_column("workflow")
    with op.batch_alter_table("promises") as batch:
        batch.drop_column("workflow_version")
        batch.drop_column("requested_by")
        batch.drop_column("message")
        batch.drop_column("title")
        batch.drop_column("schema")
