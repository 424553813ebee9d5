"""reads bounded by their page at scale: steps-only parent indexes, the tag index

Revision ID: 0015
Revises: 0014
Create Date: 2027-03-12

The two indexes of a workflow's steps by parent (`ix_promises_parent_seq`, a
workflow's history; `ix_promises_pending_parent`, its PENDING steps) held every
promise, and a root or a standalone promise has no parent: with a backlog of
200,000 PENDING roots they were one NULL key of 200,000 rows. SQLite's
statistics (`sqlite_stat1`, written by ANALYZE or `PRAGMA optimize`) average the
rows per key over the keys, NULL among them, so they said "200,000 rows per
parent" and SQLite scanned the table to read a workflow's PENDING steps. Each now
holds steps only (`parent_id IS NOT NULL`); a comparison on `parent_id` implies
that, to both planners.

A search by a common tag (`team=t3`, in creation order) read every promise with the
tag: PostgreSQL's GIN index of `tags` serves the filter, not the order, so it fetched
300,000 rows and sorted them for a page of 50; SQLite walked the whole table and
parsed every promise's tags. `promise_tags` holds a row per tag of each promise
(seq, key, value), backfilled here from `tags`; `ix_promise_tags_walk` (key, value,
seq) serves the filter and the order, so a search walks the tag's promises in seq
order and stops at its page. The GIN index goes (nothing else reads it).

A SQLite server's clock never starts behind the newest time stored: at each start it
read max(create_time) and max(settle_time) of promises, max(create_time) of tasks and
of callbacks, each a scan of its table (100 ms at 400,000 promises). An index of each
(SQLite only: PostgreSQL's clock is the database's, and it never reads them) makes
each max the end of an index.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

_STEPS = "parent_id IS NOT NULL"
_PARENT_INDEXES = {
    # name: (columns, (where before, where now))
    "ix_promises_parent_seq": (["parent_id", "seq"], (None, _STEPS)),
    "ix_promises_pending_parent": (
        ["parent_id"],
        ("state = 'PENDING'", f"state = 'PENDING' AND {_STEPS}"),
    ),
}


def _parent_indexes(now: bool) -> None:
    for name, (columns, wheres) in _PARENT_INDEXES.items():
        op.drop_index(name, "promises")
        where = wheres[1] if now else wheres[0]
        partial = sa.text(where) if where is not None else None
        op.create_index(name, "promises", columns, sqlite_where=partial, postgresql_where=partial)


TAG_KEY_INDEXED = 256
TAG_VALUE_INDEXED = 384


def _tag_text(length: int) -> sa.types.TypeEngine[str]:
    return sa.String(length).with_variant(sa.String(length, collation="C"), "postgresql")


def _tag_index(now: bool) -> None:
    conn = op.get_bind()
    postgresql = conn.dialect.name == "postgresql"
    if not now:
        op.drop_index("ix_promise_tags_walk", "promise_tags")
        op.drop_table("promise_tags")
        if postgresql:
            op.create_index(
                "ix_promises_tags",
                "promises",
                ["tags"],
                postgresql_using="gin",
                postgresql_ops={"tags": "jsonb_path_ops"},
            )
        return
    op.create_table(
        "promise_tags",
        sa.Column("seq", sa.BigInteger(), primary_key=True),
        sa.Column("key", _tag_text(TAG_KEY_INDEXED), primary_key=True),
        sa.Column("value", _tag_text(TAG_VALUE_INDEXED), nullable=False),
    )
    each = "jsonb_each_text(p.tags)" if postgresql else "json_each(p.tags)"
    op.execute(
        "INSERT INTO promise_tags (seq, key, value) "
        f"SELECT p.seq, j.key, j.value FROM promises p, {each} j "
        f"WHERE length(j.key) <= {TAG_KEY_INDEXED} AND length(j.value) <= {TAG_VALUE_INDEXED}"
    )
    op.create_index("ix_promise_tags_walk", "promise_tags", ["key", "value", "seq"])
    if postgresql:
        op.drop_index("ix_promises_tags", "promises")


_NEWEST_TIME_INDEXES = {
    "ix_promises_create_time": ("promises", "create_time"),
    "ix_promises_settle_time": ("promises", "settle_time"),
    "ix_tasks_create_time": ("tasks", "create_time"),
    "ix_callbacks_create_time": ("callbacks", "create_time"),
}


def upgrade() -> None:
    _parent_indexes(now=True)
    _tag_index(now=True)
    if op.get_bind().dialect.name == "sqlite":
        for name, (table, column) in _NEWEST_TIME_INDEXES.items():
            op.create_index(name, table, [column])


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for name, (table, _) in reversed(_NEWEST_TIME_INDEXES.items()):
            op.drop_index(name, table)
    _tag_index(now=False)
    _parent_indexes(now=False)
