"""PostgreSQL: analyze and vacuum the hot tables early

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30

The default thresholds (10 % of a table changed, for ANALYZE) leave a young,
fast-growing table planned as if it were tiny: lookups by id in a batch then
run as sequential scans until autovacuum catches up. Tasks and callbacks churn
(every workflow step inserts and completes rows). Nothing to do on SQLite.
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_SETTINGS = {
    "promises": "autovacuum_analyze_threshold = 1000, autovacuum_analyze_scale_factor = 0.02, "
    "autovacuum_vacuum_scale_factor = 0.05",
    "tasks": "autovacuum_analyze_threshold = 1000, autovacuum_analyze_scale_factor = 0.02, "
    "autovacuum_vacuum_scale_factor = 0.02",
    "callbacks": "autovacuum_analyze_threshold = 1000, autovacuum_analyze_scale_factor = 0.02, "
    "autovacuum_vacuum_scale_factor = 0.02",
}


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, settings in _SETTINGS.items():
        op.execute(f"ALTER TABLE {table} SET ({settings})")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, settings in _SETTINGS.items():
        names = ", ".join(part.split("=")[0].strip() for part in settings.split(","))
        op.execute(f"ALTER TABLE {table} RESET ({names})")
