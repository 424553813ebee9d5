"""the principal a task is leased to, on the task

Revision ID: 0009
Revises: 0008
Create Date: 2027-01-20

With authentication on, a claim records the authenticated principal of the
worker the task is leased to, and every call about the task (Heartbeat,
CompleteTask, ReleaseTask, RegisterCallbacks, a fenced step write) must come
from it: a fencing counter is not a secret (DESIGN §7). Nullable: with
authentication off nothing is recorded, and a task claimed before this
revision is leased to no principal (with authentication on, only an admin may
release it; its lease runs out otherwise).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("worker_principal", sa.String(1024), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("worker_principal")
