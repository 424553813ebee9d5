"""workflow state slots

Revision ID: 0016
Revises: 0015
Create Date: 2027-04-02

A workflow's named state slots (`ctx.state`, `ctx.set_state`, and an operator's
`ReplaceWorkflowState` while the run is parked): one row per (workflow root,
name), its value (a payload, as promise values are stored), and its version,
which counts the writes and is what a rewrite's compare-and-swap compares.
Read and written by primary key only; deleted with their root by retention.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_json = sa.Text().with_variant(postgresql.JSONB(), "postgresql")
_promise_id = sa.String(1024).with_variant(sa.String(1024, collation="C"), "postgresql")


def upgrade() -> None:
    op.create_table(
        "workflow_states",
        sa.Column("root_id", _promise_id, primary_key=True),
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("value_headers", _json, nullable=False),
        sa.Column("value_data", sa.LargeBinary(), nullable=False),
        sa.Column("update_time", sa.BigInteger(), nullable=False),
        sa.Column("updated_by", sa.String(1024), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("workflow_states")
