"""promises table

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_json = sa.Text().with_variant(postgresql.JSONB(), "postgresql")
# PostgreSQL support came after this revision shipped for SQLite; the variant
# changes nothing there, and gives PostgreSQL bytewise id ranges from the start.
_promise_id = sa.String(1024).with_variant(sa.String(1024, collation="C"), "postgresql")


def upgrade() -> None:
    op.create_table(
        "promises",
        sa.Column(
            "seq",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("id", _promise_id, nullable=False),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("param_headers", _json, nullable=False),
        sa.Column("param_data", sa.LargeBinary(), nullable=False),
        sa.Column("value_headers", _json, nullable=False),
        sa.Column("value_data", sa.LargeBinary(), nullable=False),
        sa.Column("tags", _json, nullable=False),
        sa.Column("timer", sa.Boolean(), nullable=False),
        sa.Column("create_time", sa.BigInteger(), nullable=False),
        sa.Column("settle_time", sa.BigInteger(), nullable=True),
        sa.Column("expire_time", sa.BigInteger(), nullable=True),
        sa.Column("idempotency_key_for_create", sa.String(1024), nullable=True),
        sa.Column("idempotency_key_for_settle", sa.String(1024), nullable=True),
        sa.Column("settled_by", sa.String(1024), nullable=True),
        sa.UniqueConstraint("id"),
    )
    op.create_index(
        "ix_promises_pending_expire_time",
        "promises",
        ["expire_time"],
        sqlite_where=sa.text("state = 'PENDING'"),
        postgresql_where=sa.text("state = 'PENDING'"),
    )


def downgrade() -> None:
    op.drop_index("ix_promises_pending_expire_time", table_name="promises")
    op.drop_table("promises")
