"""Promise reads: by id, a workflow's tree, the sweeper's overdue ids, and search.

`PromiseReads` is mixed into `SqlStore`, which supplies the read connection
(`_read`, retried once after a dropped connection) and its engine.

A promise by id and a workflow's tree are read for every delivery, watch and
settle: each is one statement, compiled once, run straight on a pooled DB-API
connection in autocommit (`_read_rows`; on PostgreSQL on libpq, `_pg_pipeline`),
so that it is one round trip to PostgreSQL and a snapshot by itself. Through a
SQLAlchemy `Connection`, each such read cost the server five times the database's
own work (a profile of W1 in bench/README.md): checkout, autobegin, parameter
processing, result set-up, the rollback at return; on PostgreSQL, a pre-ping, BEGIN
and ROLLBACK were three round trips more.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import (
    and_,
    bindparam,
    column,
    false,
    func,
    literal_column,
    or_,
    select,
    true,
    union_all,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.exc import DBAPIError

from troth_server.domain.promise import Promise, PromiseState
from troth_server.store import PromiseOrder, PromiseQuery, SearchRow, StoreUnavailable
from troth_server.store._bind import Statement, chunks, compile_for
from troth_server.store._rows import to_promise
from troth_server.store._tables import promise_tags, promises, state_in
from troth_server.store._tags import indexed, tag_walk, tagged

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping, Sequence

    from sqlalchemy import Connection

    from troth_server.store._engines import Engines

T = TypeVar("T")

__all__ = [
    "READ_ATTEMPTS",
    "PromiseReads",
    "glob_to_like",
    "prefix_to_like",
    "select_by_id",
    "select_expired",
    "select_tree",
    "state_condition",
    "state_parts",
]

SORT_TENANT_ROWS = 20_000
"""A scoped principal's search sorts its tenant's promises (by the id index) when they
are at most this many (a sort of 20,000 rows: ~30 ms); a bigger tenant's page is
found by a walk in seq order, which stops at the page the sooner the bigger the
tenant is next to the rest of the store."""

READ_ATTEMPTS = 2
"""A read runs again once after a connection the database dropped (a restart)."""

select_by_id = select(promises).where(promises.c.id == bindparam("id"))
select_expired = (
    select(promises.c.id)
    .where(state_in(promises.c.state, PromiseState.PENDING.value))
    .where(promises.c.expire_time <= bindparam("now"))
    .order_by(promises.c.expire_time)
    .limit(bindparam("limit"))
)
# A workflow's tree in one statement, so that it is one snapshot without a
# transaction around it: its root (by primary key), then its steps in the order
# they were created (ix_promises_parent_seq). `part` is the last column, so a
# row is still a promise row to `to_promise`.
select_tree = union_all(
    select(promises, literal_column("0").label("part")).where(promises.c.id == bindparam("id")),
    select(promises, literal_column("1").label("part")).where(
        promises.c.parent_id == bindparam("parent")
    ),
).order_by(column("part"), promises.c.seq)


class PromiseReads:
    """The promise half of `SqlStore`'s reads."""

    _engines: Engines
    """`point`: autocommit connections, no pre-ping, for `_read_rows`."""

    def _read(self, read: Callable[[Connection], T]) -> T:
        raise NotImplementedError

    @functools.cached_property
    def _point_reads(self) -> tuple[Statement, Statement]:
        dialect = self._engines.point.dialect
        return compile_for(select_by_id, dialect), compile_for(select_tree, dialect)

    def _read_rows(
        self, statement: Statement, values: Mapping[str, Any]
    ) -> Sequence[Sequence[Any]]:
        """The rows of one compiled select, run on a pooled DB-API connection in
        autocommit. A connection found dead (the database restarted) drops every
        connection of the pool, as SQLAlchemy's own reads do, and the read runs
        again once on a new one."""
        engine = self._engines.point
        dialect = engine.dialect
        errors = dialect.loaded_dbapi.Error
        attempt = 0
        while True:
            attempt += 1
            try:
                conn = engine.raw_connection()
            except (DBAPIError, errors) as exc:  # no connection to be had (database down)
                if attempt >= READ_ATTEMPTS:
                    raise StoreUnavailable(f"database read failed: {exc}") from exc
                continue
            cursor = None
            try:
                if dialect.name == "postgresql":
                    # libpq straight: one prepared statement, no cursor (`_pg_pipeline`).
                    from troth_server.store._pg_pipeline import pipeline_on

                    pipeline = pipeline_on(conn)
                    pipeline.execute(statement.sql, [statement.params(values)])
                    (rows,) = pipeline.run()
                    return rows
                cursor = conn.cursor()
                cursor.execute(statement.sql, statement.params(values))
                return list(cursor.fetchall())
            except errors as exc:
                lost = dialect.is_disconnect(exc, conn.dbapi_connection, cursor)
                if lost:
                    conn.invalidate(exc)
                    # Its neighbours in the pool went with the same restart.
                    engine.dispose()
                if not lost or attempt >= READ_ATTEMPTS:
                    raise StoreUnavailable(f"database read failed: {exc}") from exc
            finally:
                if cursor is not None:
                    with contextlib.suppress(errors):
                        cursor.close()
                conn.close()

    def get_promise(self, promise_id: str) -> Promise | None:
        by_id, _ = self._point_reads
        rows = self._read_rows(by_id, {"id": promise_id})
        return to_promise(rows[0]) if rows else None

    def search_promises(self, query: PromiseQuery, now: int) -> list[SearchRow]:
        if query.order is PromiseOrder.EXPIRE_TIME_ASC:
            return self._search_by_expire_time(query, now)
        cursor = [_after_cursor(query)] if query.after_seq else []
        return self._search(query, now, cursor, query.limit)

    def _search_by_expire_time(self, query: PromiseQuery, now: int) -> list[SearchRow]:
        # Two range scans instead of one OR: the rows that expire (from the
        # cursor's expire_time on, which the index on expire_time can start at,
        # however deep the page), then the never-expiring ones (NULLS LAST).
        c = promises.c
        found: list[SearchRow] = []
        after_null = query.after_seq and query.after_expire_time is None
        if not after_null:
            if query.after_seq:
                e = query.after_expire_time
                cursor = [c.expire_time >= e, or_(c.expire_time > e, c.seq > query.after_seq)]
            else:
                cursor = [c.expire_time.is_not(None)]
            if query.states == {PromiseState.PENDING}:
                # The inbox: what is PENDING to a reader expires after `now`, so the
                # range starts there, past the overdue ones the sweeper has yet to
                # settle (however many the deadline index holds before `now`).
                cursor.append(c.expire_time > now)
            found = self._search(query, now, cursor, query.limit)
        if len(found) < query.limit:
            cursor = [c.expire_time.is_(None)]
            if after_null:
                cursor.append(c.seq > query.after_seq)
            found += self._search(query, now, cursor, query.limit - len(found))
        return found

    def _search(
        self, query: PromiseQuery, now: int, cursor: list[Any], limit: int
    ) -> list[SearchRow]:
        conditions, order, walk = self._filters(query)
        if query.id_prefixes and order != _ORDER[query.order] and not self._few(query):
            order = _ORDER[query.order]  # a tenant this big is walked in seq order
        # One part per way a row can be in the states asked for (a settled state, or
        # PENDING but overdue), each in the order of an index of its own rows and cut
        # at the page, then merged: a rare state reads its page, not the history.
        parts = []
        for part, dense in _state_parts(query.states, now):
            by, tagged_by = order, []
            if walk is not None and dense and query.order in _WALK_ORDER:
                # Every row, or the RESOLVED ones (most of a history): the tag's rows
                # walked in seq order (ix_promise_tags_walk) drive the part.
                tagged_by = [tag_walk(*walk)]
                if query.after_seq:
                    tagged_by.append(_after_cursor(query, promise_tags.c.seq))
                by = _WALK_ORDER[query.order]
            elif walk is not None:
                # A rare state's rows (its own index), or the deadline order: the tag's
                # promises a semi-join, driven from whichever side the planner finds few.
                tagged_by = [promises.c.seq.in_(tagged(*walk))]
            parts.append(
                select(promises)
                .where(*cursor, *conditions, *part, *tagged_by)
                .order_by(*by)
                .limit(limit)
            )
        stmt: Any = parts[0]
        if len(parts) > 1:
            merged = union_all(*(select(part.subquery()) for part in parts)).subquery()
            stmt = select(merged).order_by(*_order_of(merged.c, query.order)).limit(limit)
        rows = self._read(lambda conn: conn.execute(stmt).all())
        return [SearchRow(seq=row[0], promise=to_promise(row)) for row in rows]

    def _filters(
        self, query: PromiseQuery
    ) -> tuple[list[Any], tuple[Any, ...], tuple[str, str] | None]:
        """A search's conditions but its states, cursor and the tag it walks; the order
        its parts take; the tag whose rows drive it (`_search`), if any.

        - A scoped principal's search (`id_prefixes`) whose tenant has at most
          `SORT_TENANT_ROWS` promises reads its ids' ranges of the id index and sorts
          them (by `seq + 0`, which no index serves: a walk in seq order would read every
          other tenant's rows before its page): its tenant's rows, never the rest of
          the store. A bigger tenant is walked in seq order (`_search`), as before.
        - A search by tag reads the tag's rows (`promise_tags`, its first tag the index
          keeps); the other tags filter each promise it finds.
        - Otherwise the order's own index (seq, or a state's partial index of seq).
        """
        c = promises.c
        conditions: list[Any] = []
        order = _ORDER[query.order]
        if query.id_glob not in ("", "*"):
            conditions.append(c.id.like(glob_to_like(query.id_glob), escape="\\"))
        walk = None if query.id_prefixes else _tag_to_walk(query)
        if query.id_prefixes:
            conditions.append(or_(*(_prefix_range(p) for p in query.id_prefixes)))
            if query.order in _SORTED_ORDER:
                order = _SORTED_ORDER[query.order]
        rest = {k: v for k, v in query.tags.items() if walk is None or k != walk[0]}
        if rest:
            conditions.append(self._has_tags(rest))
        if query.created_before is not None:
            conditions.append(c.create_time < query.created_before)
        if query.parent_id is not None:
            conditions.append(c.parent_id == query.parent_id)  # ix_promises_parent_seq
        return conditions, order, walk

    def _few(self, query: PromiseQuery) -> bool:
        """Whether the scope's id ranges hold at most `SORT_TENANT_ROWS` promises (a count
        of the id index that stops past it)."""
        ranges = or_(*(_prefix_range(p) for p in query.id_prefixes))
        some = select(promises.c.id).where(ranges).limit(SORT_TENANT_ROWS + 1).subquery()
        count = select(func.count()).select_from(some)
        return int(self._read(lambda conn: conn.execute(count).scalar_one())) <= SORT_TENANT_ROWS

    def expired_promise_ids(self, now: int, limit: int) -> list[str]:
        params = {"now": now, "limit": limit}
        return self._read(lambda conn: list(conn.execute(select_expired, params).scalars()))

    def promise_tree(self, root_id: str) -> tuple[Promise | None, list[Promise]]:
        # By record (parent_id), never by id prefix: `<root>.x` may be anyone's.
        _, tree = self._point_reads
        rows = self._read_rows(tree, {"id": root_id, "parent": root_id})
        if rows and rows[0][-1] == 0:
            return to_promise(rows[0]), [to_promise(r) for r in rows[1:]]
        return None, [to_promise(r) for r in rows]

    def get_promises(self, ids: Collection[str]) -> list[Promise]:
        if not ids:
            return []
        stmt = select(promises).where(promises.c.id.in_(bindparam("ids", expanding=True)))
        wanted = sorted(ids)

        def read(conn: Connection) -> list[Any]:
            return [row for part in chunks(wanted) for row in conn.execute(stmt, {"ids": part})]

        return [to_promise(row) for row in self._read(read)]

    def _has_tags(self, tags: Mapping[str, str]) -> Any:
        if self._engines.read.dialect.name == "postgresql":
            # JSONB containment: one condition for every tag, and GIN-indexable.
            return promises.c.tags.op("@>")(bindparam("tags", dict(tags), type_=JSONB))
        # json_each rather than a JSON path: a path cannot quote every possible key.
        conditions = []
        for key, value in sorted(tags.items()):
            each = func.json_each(promises.c.tags).table_valued("key", "value")
            conditions.append(
                select(each.c.key).where(each.c.key == key, each.c.value == value).exists()
            )
        return and_(*conditions)


def _state_parts(states: Collection[PromiseState], now: int) -> list[tuple[list[Any], bool]]:
    """The conditions of each part of a search for `states` (one part, of every row,
    without states), and whether the part's rows are dense in the history (every row;
    RESOLVED ones as stored), so that a walk of a tag's rows is its best driver."""
    if not states:
        return [([], True)]
    return [
        ([part], state is PromiseState.RESOLVED and n == 0)
        for state in sorted(states)
        for n, part in enumerate(state_parts(state, now))
    ]


def _order_of(columns: Any, order: PromiseOrder) -> tuple[Any, ...]:
    """`_ORDER[order]` over the columns of a merged search."""
    if order is PromiseOrder.CREATED_ASC:
        return (columns.seq,)
    if order is PromiseOrder.CREATED_DESC:
        return (columns.seq.desc(),)
    return (columns.expire_time.asc().nulls_last(), columns.seq)


# Keyset orders: each ends in `seq`, so that a cursor names one position.
# NULLS LAST (never-expiring rows) is PostgreSQL's default for ASC, so its
# partial index on pending expire_time serves the EXPIRE_TIME_ASC inbox.
_ORDER: dict[PromiseOrder, tuple[Any, ...]] = {
    PromiseOrder.CREATED_ASC: (promises.c.seq,),
    PromiseOrder.CREATED_DESC: (promises.c.seq.desc(),),
    PromiseOrder.EXPIRE_TIME_ASC: (promises.c.expire_time.asc().nulls_last(), promises.c.seq),
}


# A search by tag in creation order walks the tag's rows (`promise_tags`) in seq order:
# ordered by their seq, so that SQLite sees the walk's index serve the order.
_WALK_ORDER: dict[PromiseOrder, tuple[Any, ...]] = {
    PromiseOrder.CREATED_ASC: (promise_tags.c.seq,),
    PromiseOrder.CREATED_DESC: (promise_tags.c.seq.desc(),),
}


# A scoped principal's search in creation order: its ids' rows sorted, by an
# expression no index serves, so that no planner walks the whole store in seq order.
_SORTED_ORDER: dict[PromiseOrder, tuple[Any, ...]] = {
    PromiseOrder.CREATED_ASC: ((promises.c.seq + 0).asc(),),
    PromiseOrder.CREATED_DESC: ((promises.c.seq + 0).desc(),),
}


def _prefix_range(prefix: str) -> Any:
    """SQL for "the id starts with `prefix`": a range of the id index (ids compare by
    code point on both stores: bytewise UTF-8, collation "C" on PostgreSQL)."""
    c = promises.c
    upper = _after_prefix(prefix)
    return c.id >= prefix if upper is None else and_(c.id >= prefix, c.id < upper)


def _after_prefix(prefix: str) -> str | None:
    """The least string greater than every string that starts with `prefix` (None: no
    such string, every string from `prefix` on starts with it)."""
    chars = list(prefix)
    while chars:
        code = ord(chars[-1]) + 1
        if code == 0xD800:  # past the surrogates, which no text holds
            code = 0xE000
        if code <= 0x10FFFF:
            chars[-1] = chr(code)
            return "".join(chars)
        chars.pop()
    return None


def _tag_to_walk(query: PromiseQuery) -> tuple[str, str] | None:
    """The tag whose rows a search reads: its first one the tag index keeps (None: none
    is kept)."""
    return next(((k, v) for k, v in sorted(query.tags.items()) if indexed(k, v)), None)


def _after_cursor(query: PromiseQuery, seq: Any = promises.c.seq) -> Any:
    """SQL for "comes after the cursor row in the query's order" (on `seq`)."""
    if query.order is PromiseOrder.CREATED_ASC:
        return seq > query.after_seq
    assert query.order is PromiseOrder.CREATED_DESC, "EXPIRE_TIME_ASC pages by two scans"
    return seq < query.after_seq


def state_condition(state: PromiseState, now: int) -> Any:
    """SQL for "a reader at `now` sees this state" (an expired PENDING row is settled)."""
    return or_(*state_parts(state, now))


def state_parts(state: PromiseState, now: int) -> list[Any]:
    """The ways a row is in `state` to a reader at `now`, exclusive of each other: its
    stored state, and for RESOLVED (a timer) and REJECTED_TIMEDOUT, PENDING but due."""
    c = promises.c
    expired = and_(
        state_in(c.state, PromiseState.PENDING.value),
        c.expire_time.is_not(None),
        c.expire_time <= now,
    )
    if state is PromiseState.PENDING:
        return [
            and_(
                state_in(c.state, PromiseState.PENDING.value),
                or_(c.expire_time.is_(None), c.expire_time > now),
            )
        ]
    if state is PromiseState.RESOLVED:
        return [state_in(c.state, state.value), and_(expired, c.timer == true())]
    if state is PromiseState.REJECTED_TIMEDOUT:
        return [state_in(c.state, state.value), and_(expired, c.timer == false())]
    return [state_in(c.state, state.value)]


def prefix_to_like(prefix: str) -> str:
    """A prefix as a LIKE pattern: every character literal, then any run."""
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def glob_to_like(glob: str) -> str:
    escaped = glob.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped.replace("*", "%")
