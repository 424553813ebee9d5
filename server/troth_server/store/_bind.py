"""How many values one SQL statement may bind, the splitting of longer id lists, and
statements compiled once for a dialect.

PostgreSQL takes at most 65,535 parameters per statement (its protocol counts
them in 16 bits) and SQLite, by default since 3.32, 32,766. A list of ids from a
request or a batch can be longer (a workflow suspending on thousands of
promises; a group commit folding many requests), so every store method that
binds a collection of ids runs it as statements of at most `MAX_BOUND_IDS`,
each list in order, so that row locks are still taken in id order.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import bindparam

from troth_server.store import StoreError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence

    from sqlalchemy.engine import Dialect

T = TypeVar("T")

MAX_BOUND_IDS = 4096
"""Most ids one statement binds in an IN list (a statement may bind two such lists)."""

SQLITE_VARIABLES_NEEDED = 32_766
"""Parameters a SQLite must bind per statement: two IN lists, and SQLAlchemy's
multi-row inserts, which size their batches for this default."""


def chunks(values: Sequence[T], size: int = MAX_BOUND_IDS) -> Iterator[Sequence[T]]:
    """`values` in slices of at most `size`, in order."""
    for start in range(0, len(values), size):
        yield values[start : start + size]


def check_sqlite_variables(dbapi_conn: sqlite3.Connection) -> None:
    """Refuse a SQLite built to bind fewer parameters than troth's statements may.

    Raises:
        StoreError: Naming the build's limit and what to do.
    """
    allowed = dbapi_conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    if allowed < SQLITE_VARIABLES_NEEDED:
        raise StoreError(
            f"this SQLite ({sqlite3.sqlite_version}) binds at most {allowed} parameters per "
            f"statement; troth needs {SQLITE_VARIABLES_NEEDED} (SQLite 3.32 or later by "
            "default): run troth on a Python linked against a newer SQLite"
        )


@dataclass(frozen=True, slots=True)
class Statement:
    """A statement compiled once for a dialect, to run straight on a DB-API cursor:
    per run, only its parameters are built (no compilation, no parameter processing)."""

    sql: str
    order: tuple[str, ...] | None
    """Parameter names in placeholder order, for positional paramstyles."""

    def params(self, values: Mapping[str, Any]) -> Any:
        return values if self.order is None else tuple(values[name] for name in self.order)


def sqlite_indexed(sql: str, table: str, index: str, *, every: bool = False) -> str:
    """`sql` (compiled for SQLite) reading `table` by `index` by name (`INDEXED BY`):
    where SQLite, without statistics or weighing a partial index by its rows per key,
    would pick another index that also fits (PostgreSQL's planner needs no such hint).
    Its first read of `table`, or with `every` each (the branches of a UNION ALL)."""
    return re.sub(
        rf"\bFROM {table}\b", f"FROM {table} INDEXED BY {index}", sql, count=0 if every else 1
    )


def compile_for(stmt: Any, dialect: Dialect) -> Statement:
    """`stmt` (a Core statement with named bindparams) as `dialect` renders it."""
    compiled = stmt.compile(dialect=dialect)
    order = tuple(compiled.positiontup) if compiled.positional else None
    return Statement(str(compiled), order)


class ByIds:
    """A statement with one list of ids (an IN list), compiled once per list length
    rounded up to a power of two; a shorter list is padded with its last id, which
    an IN list does not mind. What the write path runs per batch (rows by id, tasks by
    root, callbacks by promise): the list costs no rendering per run, and few
    variants are ever compiled.

    `build` makes the statement from the list's bind parameters (`id0`, `id1`, ...).
    """

    def __init__(
        self,
        dialect: Dialect,
        build: Callable[[list[Any]], Any],
        *,
        sqlite_index: tuple[str, str] | None = None,
    ) -> None:
        """`sqlite_index`: (table, index) the statement names on SQLite (`INDEXED BY`):
        without statistics, SQLite picks between two indexes that both fit by the order
        the schema lists them, which a migration that rebuilt the table may have changed."""
        self._dialect = dialect
        self._build = build
        self._sized: dict[int, Statement] = {}
        self._sqlite_index = sqlite_index if dialect.name == "sqlite" else None

    def bound(self, ids: Sequence[Any]) -> tuple[str, Any]:
        """The SQL and parameters for `ids` (at most `MAX_BOUND_IDS`, at least one)."""
        size = 1 << max(0, len(ids) - 1).bit_length()
        statement = self._sized.get(size)
        if statement is None:
            names: list[Any] = [bindparam(f"id{i}") for i in range(size)]
            statement = compile_for(self._build(names), self._dialect)
            if self._sqlite_index is not None:
                sql = sqlite_indexed(statement.sql, *self._sqlite_index)
                statement = Statement(sql, statement.order)
            self._sized[size] = statement
        last = len(ids) - 1
        return statement.sql, statement.params({f"id{i}": ids[min(i, last)] for i in range(size)})
