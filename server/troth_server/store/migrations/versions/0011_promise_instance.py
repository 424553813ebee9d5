"""a promise's instance: what tells it from an earlier promise of the same id

Revision ID: 0011
Revises: 0010
Create Date: 2027-02-10

A settle token names the promise it is for by id and instance (issue 26): a
promise pruned and created again under the same id is another instance, and the
links sent for the first one are void for it. `instance` is drawn at random
when a promise is created (1 to 2**63 - 1). Rows before this revision, and
promises settled before anyone created them, have 0.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("promises") as batch:
        batch.add_column(
            sa.Column("instance", sa.BigInteger(), nullable=False, server_default=sa.text("0"))
        )


def downgrade() -> None:
    with op.batch_alter_table("promises") as batch:
        batch.drop_column("instance")
