"""schedules: a workflow started on a cron schedule, one run per tick

Revision ID: 0017
Revises: 0016
Create Date: 2027-04-02

A row per schedule (`domain/schedules.py`): what it starts (workflow, group,
arguments), when (a 5-field cron expression in an IANA time zone, a jitter), what
it does after downtime (`catch_up`), and where it is (`next_tick`, and
`next_fire_time`: that tick plus its jitter; both NULL while paused). The
scheduler reads the due ones through `ix_schedules_due`, a partial index of the
active schedules by fire time, and advances each in the transaction that starts
its runs.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_ACTIVE = sa.text("next_fire_time IS NOT NULL")


def upgrade() -> None:
    json = sa.Text().with_variant(JSONB(), "postgresql")
    op.create_table(
        "schedules",
        sa.Column("name", sa.String(256), primary_key=True),
        sa.Column("cron", sa.String(256), nullable=False),
        sa.Column("timezone", sa.String(256), nullable=False),
        sa.Column("workflow", sa.String(1024), nullable=False),
        sa.Column("group", sa.String(256), nullable=False),
        sa.Column("args_headers", json, nullable=False),
        sa.Column("args_data", sa.LargeBinary(), nullable=False),
        sa.Column("catch_up", sa.String(16), nullable=False),
        sa.Column("jitter_ms", sa.BigInteger(), nullable=False),
        sa.Column("ttl_ms", sa.BigInteger(), nullable=True),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("next_tick", sa.BigInteger(), nullable=True),
        sa.Column("next_fire_time", sa.BigInteger(), nullable=True),
        sa.Column("last_tick", sa.BigInteger(), nullable=True),
        sa.Column("last_run_id", sa.String(1024), nullable=True),
        sa.Column("skipped", sa.BigInteger(), nullable=False),
        sa.Column("created_by", sa.String(1024), nullable=True),
        sa.Column("create_time", sa.BigInteger(), nullable=False),
        sa.Column("update_time", sa.BigInteger(), nullable=False),
    )
    op.create_index(
        "ix_schedules_due",
        "schedules",
        ["next_fire_time"],
        sqlite_where=_ACTIVE,
        postgresql_where=_ACTIVE,
    )


def downgrade() -> None:
    op.drop_index("ix_schedules_due", "schedules")
    op.drop_table("schedules")
