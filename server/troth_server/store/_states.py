"""Workflow state slots (`workflow_states`, revision 0016): the writer's reads and
upserts (`StateTx`, mixed into the write transaction) and the point read of a slot
with its workflow's root and active task (`StateReads`, mixed into `SqlStore`).

Every statement reads or writes by primary key (root, name). The writer reads a
slot after locking its root (the op's keys name the root), so two writes of one
slot, on any replica, queue on the root's row lock: the version a compare-and-swap
compares is the one it writes over.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import bindparam, or_, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from troth_server.domain.promise import Payload
from troth_server.domain.states import WorkflowState
from troth_server.store._bind import compile_for
from troth_server.store._rows import dump_json, load_json
from troth_server.store._tables import workflow_states

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Sequence

    from sqlalchemy import Connection
    from sqlalchemy.engine import Dialect

T = TypeVar("T")

__all__ = ["StateReads", "StateStatements", "StateTx", "to_state"]

_s = workflow_states.c
_UPDATED = ("version", "value_headers", "value_data", "update_time", "updated_by")
_BY_KEY = select(workflow_states).where(
    _s.root_id == bindparam("root_id"), _s.name == bindparam("name")
)


def to_state(row: Sequence[Any]) -> WorkflowState:
    """A row in `workflow_states.c` order."""
    return WorkflowState(
        workflow_id=row[0],
        name=row[1],
        version=row[2],
        value=Payload(load_json(row[3]), bytes(row[4])),
        update_time=row[5],
        updated_by=row[6],
    )


class StateStatements:
    """The writer's statements, compiled once for its dialect."""

    def __init__(self, dialect: Dialect) -> None:
        self.by_key = compile_for(_BY_KEY, dialect)
        upsert = sqlite_insert if dialect.name == "sqlite" else postgresql_insert
        values: dict[str, Any] = {c.name: bindparam(c.name) for c in workflow_states.c}
        stmt = upsert(workflow_states).values(values)
        self.upsert = compile_for(
            stmt.on_conflict_do_update(
                index_elements=[_s.root_id, _s.name],
                set_={
                    name: stmt.excluded[name]
                    for name in (
                        "version",
                        "value_headers",
                        "value_data",
                        "update_time",
                        "updated_by",
                    )
                },
            ),
            dialect,
        )


class StateTx:
    """The state half of a write transaction (mixed into `_WriteTx`)."""

    _state_statements: StateStatements

    def _write(self, sql: str, params: Sequence[Any]) -> None:
        raise NotImplementedError

    def _select(self, sql: str, params: Any) -> Sequence[Sequence[Any]]:
        raise NotImplementedError

    def get_states(self, keys: Collection[tuple[str, str]]) -> dict[tuple[str, str], WorkflowState]:
        """The slots that exist of these (root, name) keys (few: one per state op)."""
        stmt = self._state_statements.by_key
        found: dict[tuple[str, str], WorkflowState] = {}
        for root_id, name in sorted(keys):
            rows = self._select(stmt.sql, stmt.params({"root_id": root_id, "name": name}))
            if rows:
                found[(root_id, name)] = to_state(rows[0])
        return found

    def put_states(self, states: Sequence[WorkflowState]) -> None:
        if not states:
            return
        stmt = self._state_statements.upsert
        rows = [
            {
                "root_id": s.workflow_id,
                "name": s.name,
                "version": s.version,
                "value_headers": dump_json(s.value.headers),
                "value_data": s.value.data,
                "update_time": s.update_time,
                "updated_by": s.updated_by,
            }
            for s in states
        ]
        self._write(stmt.sql, [stmt.params(row) for row in rows])


class StateReads:
    """The point read of a slot (mixed into `SqlStore`, which supplies `_read`)."""

    def _read(self, read: Callable[[Connection], T]) -> T:
        raise NotImplementedError

    def workflow_state(self, root_id: str, name: str) -> WorkflowState | None:
        row = self._read(
            lambda conn: conn.execute(_BY_KEY, {"root_id": root_id, "name": name}).first()
        )
        return None if row is None else to_state(row)


def delete_states_of(conn: Connection, roots: Collection[str], trees: Any) -> None:
    """Retention: the slots of these workflow roots and of the workflows in their trees
    (`trees`: a select of the tree's promise ids), before those promises go."""
    conn.execute(
        workflow_states.delete().where(or_(_s.root_id.in_(list(roots)), _s.root_id.in_(trees)))
    )
