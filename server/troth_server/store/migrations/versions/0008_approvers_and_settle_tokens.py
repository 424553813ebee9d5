"""approver policy, starter and settle token on promises

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03

A promise records who may settle it (`approvers`, JSON: JSONB on PostgreSQL),
the authenticated principal that started it (`started_by`: on a workflow's
step, its top-level root's starter, which four-eyes compares the settler with),
and the id of the settle token it was settled with (`settle_token_id`), which
makes a token single-use. All nullable: existing rows have no policy, no
recorded starter and no token.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("promises") as batch:
        batch.add_column(
            sa.Column("approvers", sa.Text().with_variant(JSONB(), "postgresql"), nullable=True)
        )
        batch.add_column(sa.Column("started_by", sa.String(1024), nullable=True))
        batch.add_column(sa.Column("settle_token_id", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("promises") as batch:
        batch.drop_column("settle_token_id")
        batch.drop_column("started_by")
        batch.drop_column("approvers")
