"""Retention: deleting settled promises a batch at a time (mixed into the write transaction).

The candidates are settled top-level promises (`root_id IS NULL`: workflow
roots and standalone promises) in settle-time order, through
`ix_promises_settled_top`. A standalone promise goes alone. A workflow root goes
with its whole tree (every promise whose `root_id` is the root: its steps,
child workflows and theirs), and only when the workflow is over: no PENDING or
CLAIMED task, and every promise of the tree settled at or before the cutoff
(a cancelled workflow may still record compensation steps after its root
settled). A step is never deleted without its root. The callbacks of what is
deleted go with it (a finished workflow has none left; this is a safety net), and
so do its rows of the tag index (`_tags`). Completed tasks are not looked at: the
sweeper deletes them on their own schedule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, case, func, literal_column, or_, select, tuple_

from troth_server.domain.promise import PromiseState
from troth_server.domain.steps import INVOKE_TAG
from troth_server.domain.task import TaskState
from troth_server.store import PruneBatch
from troth_server.store._rows import load_json
from troth_server.store._states import delete_states_of
from troth_server.store._tables import callbacks, promises, state_in, tasks
from troth_server.store._tags import delete_tags

if TYPE_CHECKING:
    from sqlalchemy import Connection

__all__ = ["PruneTx"]

_p = promises.c
# The very WHERE terms of ix_promises_settled_top (the state written into the SQL),
# so that SQLite's planner can use the partial index.
_candidates = (
    select(_p.seq, _p.id, _p.settle_time, _p.tags)
    .where(_p.root_id.is_(None), _p.state != literal_column(f"'{PromiseState.PENDING.value}'"))
    .where(_p.settle_time <= bindparam("cutoff"))
    .order_by(_p.settle_time, _p.seq)
    .limit(bindparam("limit"))
)
# Per tree: how many rows, how many not settled, the newest settle time.
_trees = (
    select(
        _p.root_id,
        func.count(),
        func.sum(case((state_in(_p.state, PromiseState.PENDING.value), 1), else_=0)),
        func.max(_p.settle_time),
    )
    .where(_p.root_id.in_(bindparam("roots", expanding=True)))
    .group_by(_p.root_id)
)
_active_roots = select(tasks.c.root_promise_id).where(
    tasks.c.root_promise_id.in_(bindparam("roots", expanding=True)),
    state_in(tasks.c.state, TaskState.PENDING.value, TaskState.CLAIMED.value),
)


class PruneTx:
    """The retention half of a write transaction (mixed into `_WriteTx`)."""

    _conn: Connection

    def prune_settled(
        self, settled_before: int, after: tuple[int, int] | None, limit: int, *, delete: bool
    ) -> PruneBatch:
        rows = self._conn.execute(
            self._candidates(after, lock=delete), {"cutoff": settled_before, "limit": limit}
        ).all()
        if not rows:
            return PruneBatch(0, 0, 0, None)
        standalone = [r.id for r in rows if INVOKE_TAG not in load_json(r.tags)]
        roots = [r.id for r in rows if INVOKE_TAG in load_json(r.tags)]
        finished, tree_rows = self._finished(roots, settled_before)
        if delete:
            self._delete(standalone, finished)
        last = rows[-1]
        return PruneBatch(
            promises=len(standalone) + len(finished) + tree_rows,
            workflows=len(finished),
            standalone=len(standalone),
            after=(last.settle_time, last.seq) if len(rows) == limit else None,
        )

    def _candidates(self, after: tuple[int, int] | None, *, lock: bool) -> Any:
        stmt = _candidates
        if after is not None:
            stmt = stmt.where(tuple_(_p.settle_time, _p.seq) > tuple_(*after))
        if lock and self._conn.dialect.name == "postgresql":
            # Another replica pruning the same rows: skip them, it deletes them.
            stmt = stmt.with_for_update(skip_locked=True)
        return stmt

    def _finished(self, roots: list[str], settled_before: int) -> tuple[list[str], int]:
        """The roots whose workflow is over and settled by the cutoff, and their trees' size
        (steps only)."""
        if not roots:
            return [], 0
        active = set(self._conn.execute(_active_roots, {"roots": roots}).scalars())
        trees = {
            row[0]: (row[1], row[2] or 0, row[3])
            for row in self._conn.execute(_trees, {"roots": [r for r in roots if r not in active]})
        }
        finished, size = [], 0
        for root in roots:
            if root in active:
                continue
            count, pending, newest = trees.get(root, (0, 0, None))
            if pending or (newest is not None and newest > settled_before):
                continue
            finished.append(root)
            size += count
        return finished, size

    def _delete(self, standalone: list[str], roots: list[str]) -> None:
        ids = standalone + roots
        if roots:
            # Steps first, then the roots (one statement each, by index); each
            # promise's tag rows before it.
            # Their workflows' state slots (the roots' and their child workflows').
            delete_states_of(self._conn, roots, select(_p.id).where(_p.root_id.in_(roots)))
            self._conn.execute(delete_tags(select(_p.seq).where(_p.root_id.in_(roots))))
            self._conn.execute(promises.delete().where(_p.root_id.in_(roots)))
        if ids:
            self._conn.execute(delete_tags(select(_p.seq).where(_p.id.in_(ids))))
            self._conn.execute(promises.delete().where(_p.id.in_(ids)))
            gone: Any = callbacks.c.promise_id.in_(ids)
            if roots:
                gone = or_(gone, callbacks.c.root_promise_id.in_(roots))
            self._conn.execute(callbacks.delete().where(gone))
