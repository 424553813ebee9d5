"""The tag index (`promise_tags`): one row per tag of each promise, for searches by tag.

A search by a tag walks `ix_promise_tags_walk` (key, value, seq): the promises with
that tag in seq order, so it stops at its page however common the tag. The rows are
the promises' own `tags`, copied by the database itself in the write transaction
that writes the promise (`json_each` on SQLite, `jsonb_each_text` on PostgreSQL), so
the writer sends one statement per batch and never the tags twice:

- created promises: their tags inserted (`TagStatements.insert`);
- updated promises whose tags differ from what the transaction read of them (only
  an early settle adopted by its create changes a promise's tags): the rows that no
  longer match their tags deleted, the missing ones inserted; an update that keeps
  the tags it read (a settle) sends nothing;
- deleted promises (retention): their rows deleted first (`delete_tags`).

A tag longer than `TAG_KEY_INDEXED` / `TAG_VALUE_INDEXED` characters is not kept
(`indexed`): a search by it filters the promises' tags instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, exists, func, literal_column, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from troth_server.store._bind import ByIds
from troth_server.store._tables import TAG_KEY_INDEXED, TAG_VALUE_INDEXED, promise_tags, promises

if TYPE_CHECKING:
    from sqlalchemy.engine import Dialect

__all__ = ["TagStatements", "delete_tags", "each_tag", "indexed", "tag_walk", "tagged"]

_t = promise_tags.c


def indexed(key: str, value: str) -> bool:
    """Whether the tag `key`=`value` has its rows in `promise_tags`."""
    return len(key) <= TAG_KEY_INDEXED and len(value) <= TAG_VALUE_INDEXED


def each_tag(dialect: Dialect, source: Any) -> Any:
    """The (key, value) rows of `source`'s tags (a JSON object of strings), as text."""
    name = "jsonb_each_text" if dialect.name == "postgresql" else "json_each"
    return getattr(func, name)(source.c.tags).table_valued("key", "value")


class TagStatements:
    """The writer's statements on `promise_tags`, compiled per id-list length."""

    def __init__(self, dialect: Dialect) -> None:
        upsert = sqlite_insert if dialect.name == "sqlite" else postgresql_insert

        def insert(ids: list[Any]) -> Any:
            each = each_tag(dialect, promises)
            rows = (
                select(promises.c.seq, each.c.key, each.c.value)
                .select_from(promises)
                .where(
                    promises.c.id.in_(ids),
                    # Written into the SQL: a `ByIds` statement binds its ids only.
                    func.length(each.c.key) <= literal_column(str(TAG_KEY_INDEXED)),
                    func.length(each.c.value) <= literal_column(str(TAG_VALUE_INDEXED)),
                )
            )
            return (
                upsert(promise_tags)
                .from_select(["seq", "key", "value"], rows)
                .on_conflict_do_nothing()
            )

        def stale(ids: list[Any]) -> Any:
            # A row whose promise's tags no longer hold that key with that value.
            each = each_tag(dialect, promises)
            held = (
                select(each.c.key)
                .select_from(promises)
                .where(
                    promises.c.seq == _t.seq,
                    each.c.key == _t.key,
                    each.c.value == _t.value,
                )
                .correlate(promise_tags)
            )
            return promise_tags.delete().where(
                _t.seq.in_(select(promises.c.seq).where(promises.c.id.in_(ids))),
                ~exists(held),
            )

        self.insert = ByIds(dialect, insert)
        self.stale = ByIds(dialect, stale)


def delete_tags(seqs: Any) -> Any:
    """Delete the tag rows of the promises whose seq `seqs` (a select of seqs) lists:
    before those promises are deleted."""
    return promise_tags.delete().where(_t.seq.in_(seqs))


def tag_walk(key: str, value: str) -> Any:
    """The condition joining a search's promises to the tag `key`=`value`'s rows: each
    promise found by its seq from a tag row (`seq + 0`: no index serves the other way,
    a walk of every promise that looks each one's tag up, which PostgreSQL's planner
    took for as cheap when the tag is common, and read 100,000 promises before the
    first with the tag)."""
    return and_(promises.c.seq == _t.seq + literal_column("0"), _t.key == key, _t.value == value)


def tagged(key: str, value: str) -> Any:
    """The seqs of the promises tagged `key`=`value` (a range of the walk's index)."""
    return select(_t.seq).where(_t.key == key, _t.value == value)
