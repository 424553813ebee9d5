"""steps belong to their workflow by record: root_id and parent_id on promises

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

A workflow's step records the top-level root it belongs to (`root_id`) and the
workflow whose task created it (`parent_id`); the server sets both from the
writer's fence. The ttl cap, the cascade when a root settles and a workflow's
history follow `parent_id`, never the id prefix.

Backfill, from the rule the server used until now (a step is `<parent>.<x>`,
its parent a workflow root, i.e. tagged `troth:invoke`): each such promise gets
that parent, and the parent's own root (or the parent) as its root. A promise a
suspended workflow waits on (a row of `callbacks`) that is not `<root>.<x>`
(an explicit id, `ctx.promise(id=...)`) becomes a step of that root too, so
that workflows in flight across the upgrade resume as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_BATCH = 1000


def _promise_id() -> sa.types.TypeEngine[str]:
    return sa.String(1024).with_variant(sa.String(1024, collation="C"), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("promises") as batch:
        batch.add_column(sa.Column("root_id", _promise_id(), nullable=True))
        batch.add_column(sa.Column("parent_id", _promise_id(), nullable=True))
    _backfill(op.get_bind())
    op.create_index("ix_promises_parent_seq", "promises", ["parent_id", "seq"])
    op.create_index(
        "ix_promises_pending_parent",
        "promises",
        ["parent_id"],
        sqlite_where=sa.text("state = 'PENDING'"),
        postgresql_where=sa.text("state = 'PENDING'"),
    )


def _backfill(conn: sa.Connection) -> None:
    if conn.dialect.name == "postgresql":
        is_root = "tags ? 'troth:invoke'"
    else:
        is_root = "json_extract(tags, '$.\"troth:invoke\"') IS NOT NULL"
    roots = set(conn.exec_driver_sql(f"SELECT id FROM promises WHERE {is_root}").scalars())
    if not roots:
        return

    def parent_of(promise_id: str) -> str | None:
        parent, dot, _ = promise_id.rpartition(".")
        return parent if dot and parent in roots else None

    def top(root_id: str) -> str:
        seen = {root_id}
        while (parent := parent_of(root_id)) is not None and parent not in seen:
            seen.add(parent)
            root_id = parent
        return root_id

    links: dict[str, tuple[str, str]] = {}
    ids = sa.text("SELECT id FROM promises WHERE id >= :lo AND id < :hi")
    for root_id in roots:
        # '/' sorts right after '.': the range is exactly the ids `<root>.*`.
        for (promise_id,) in conn.execute(ids, {"lo": root_id + ".", "hi": root_id + "/"}):
            if parent_of(promise_id) == root_id:
                links[promise_id] = (top(root_id), root_id)
    waited = sa.text("SELECT promise_id, root_promise_id FROM callbacks")
    for promise_id, root_id in conn.execute(waited):
        if promise_id not in links and promise_id != root_id and root_id in roots:
            links[promise_id] = (top(root_id), root_id)
    update = sa.text("UPDATE promises SET root_id = :root, parent_id = :parent WHERE id = :id")
    rows = [{"id": k, "root": v[0], "parent": v[1]} for k, v in sorted(links.items())]
    for start in range(0, len(rows), _BATCH):
        conn.execute(update, rows[start : start + _BATCH])


def downgrade() -> None:
    op.drop_index("ix_promises_pending_parent", "promises")
    op.drop_index("ix_promises_parent_seq", "promises")
    with op.batch_alter_table("promises") as batch:
        batch.drop_column("parent_id")
        batch.drop_column("root_id")
