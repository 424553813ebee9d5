"""PostgreSQL's hot statements on libpq directly: a write transaction's BEGIN with its
clock read (one round trip), its final writes with its COMMIT (one round trip), and
single reads (the writer's, the point reads) without a cursor.

psycopg's own pipeline sends every statement as it is queued and then waits on the
socket for it: a flush, a poll and Python bookkeeping per row (measured: 25 us of the
server's CPU per statement, and the database reading each message on its own). Here
the rows are queued on libpq (its C code encodes them), flushed once, and their
results read once, at the pipeline's sync. A single statement runs outside pipeline
mode, whose entry, sync and exit would cost as much again.

Statements are prepared once per connection: `Prepared` (kept in the pooled
connection's `info`, `pipeline_on`) names them by their SQL and parameter types, as
psycopg does its own; the names are this module's (`troth_N`), never psycopg's, and
psycopg prepares nothing of its own on these connections (`_engines`): at a rollback
it would DEALLOCATE ALL, this module's statements with them.
"""

from __future__ import annotations

import functools
import itertools
import re
import select
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import pq
from psycopg.adapt import PyFormat, Transformer

from troth_server.store._sqlstate import STATEMENTS_LOST

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

    from sqlalchemy import PoolProxiedConnection

__all__ = ["Pipeline", "Prepared", "pipeline_on", "positional"]

_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")
_ExecStatus = pq.ExecStatus
_ANSWERED = frozenset({_ExecStatus.COMMAND_OK, _ExecStatus.TUPLES_OK})


@dataclass(frozen=True, slots=True)
class Positional:
    """A statement rendered with `$n` placeholders, and its parameters' names in order."""

    sql: bytes
    names: tuple[str, ...]


@functools.lru_cache(maxsize=512)
def positional(sql: str) -> Positional:
    """`sql` in psycopg's named style (`%(name)s`, `%%`) as libpq takes it (`$1`, `%`)."""
    names: list[str] = []

    def placeholder(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    return Positional(_PLACEHOLDER.sub(placeholder, sql).encode(), tuple(names))


@dataclass
class Prepared:
    """The statements prepared on one connection, by SQL and parameter types."""

    names: dict[tuple[bytes, tuple[int, ...]], bytes] = field(default_factory=dict)
    named: bool = True
    """False: prepare nothing, send each statement unnamed (parsed every time), as a
    transaction-mode pooler needs: a statement prepared on one of its server
    connections is missing on the next, or is another client's of the same name."""
    after_begin: tuple[bytes, ...] = ()
    """Statements each transaction runs after its BEGIN, in the same round trip
    (transaction-mode pooling: a session's settings would not stay with it)."""
    _numbers: Iterator[int] = field(default_factory=itertools.count)

    def new_name(self) -> bytes:
        return f"troth_{next(self._numbers)}".encode()


def pipeline_on(connection: PoolProxiedConnection) -> Pipeline:
    """A new pipeline on a pooled connection, with the statements prepared on it
    (kept in its `info`, which lives as long as the DB-API connection does)."""
    prepared = connection.info.get("troth_prepared")
    if prepared is None:
        prepared = connection.info["troth_prepared"] = Prepared()
    return Pipeline(connection.driver_connection, prepared)  # type: ignore[arg-type]


class Pipeline:
    """Statements queued on one connection's libpq, sent together and answered together.

    `run` sends them (several: in pipeline mode, with a sync; one: alone), waits for
    every result, and returns the rows of
    those that returned rows (as psycopg's cursors load them), in order. The first
    statement that failed is raised as the psycopg error it would have raised, once
    the connection is in a state to roll back. Nothing is sent before `run`.
    """

    def __init__(self, driver: psycopg.Connection[Any], prepared: Prepared) -> None:
        self._driver = driver
        self._pg = driver.pgconn
        self._transformer = Transformer(driver)
        self._prepared = prepared
        self._new: list[tuple[bytes, tuple[int, ...]]] = []
        self._commands: list[Any] = []

    def begin(self) -> None:
        """BEGIN, unless the connection is in a transaction already."""
        if self._pg.transaction_status == pq.TransactionStatus.IDLE:
            self.query(b"BEGIN")
            for statement in self._prepared.after_begin:
                self.query(statement)

    def query(self, sql: bytes) -> None:
        """A statement without parameters (BEGIN, COMMIT, a clock read)."""
        self._commands.append((sql, None, None, None))

    def execute(self, sql: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """`sql` (psycopg's named style) once for each row of parameters."""
        statement = positional(sql)
        transformer = self._transformer
        formats = [PyFormat.AUTO] * len(statement.names)
        for row in rows:
            params = transformer.dump_sequence([row[name] for name in statement.names], formats)
            types, pq_formats = transformer.types or (), transformer.formats or []
            self._commands.append((statement.sql, params, tuple(types), list(pq_formats)))

    def run(self) -> list[list[tuple[Any, ...]]]:
        pg = self._pg
        if pg.transaction_status == pq.TransactionStatus.UNKNOWN:
            raise psycopg.OperationalError("the connection is closed")
        try:
            if len(self._commands) == 1:
                # One statement: without pipeline mode, whose entry, sync and exit
                # would cost as much again as the statement itself.
                self._send(self._commands[0], alone=True)
                return self._answer(self._receive(until=None))
            pg.enter_pipeline_mode()
            try:
                for command in self._commands:
                    self._send(command, alone=False)
                pg.pipeline_sync()
                self._flush()
                return self._answer(self._receive(until=_ExecStatus.PIPELINE_SYNC))
            finally:
                if pg.pipeline_status != pq.PipelineStatus.OFF and not pg.is_busy():
                    pg.exit_pipeline_mode()
        except BaseException:
            # Whether these were prepared is unknown: prepare them again under new names.
            for key in self._new:
                self._prepared.names.pop(key, None)
            raise

    def _send(self, command: tuple[Any, ...], *, alone: bool) -> None:
        pg = self._pg
        sql, params, types, formats = command
        if params is None:
            pg.send_query_params(sql, None)
        elif not self._prepared.named:
            pg.send_query_params(sql, params, param_types=types, param_formats=formats)
        else:
            key = (sql, types)
            name = self._prepared.names.get(key)
            if name is None:
                name = self._prepared.names[key] = self._prepared.new_name()
                self._new.append(key)
                pg.send_prepare(name, sql, param_types=types)
                if alone:  # outside a pipeline, one command at a time
                    self._flush()
                    self._answer(self._receive(until=None))
            pg.send_query_prepared(name, params, param_formats=formats)
        if alone:
            self._flush()

    def _flush(self) -> None:
        pg = self._pg
        while pg.flush():
            # More to send than the socket takes: read meanwhile, so that the server,
            # answering, never waits on a full socket while we wait on it.
            if _wait(pg.socket, select.POLLIN | select.POLLOUT) & select.POLLIN:
                pg.consume_input()

    def _receive(self, until: pq.ExecStatus | None) -> list[pq.abc.PGresult]:
        """Results up to the end of one statement's (`until` None) or the sync's."""
        pg = self._pg
        results: list[pq.abc.PGresult] = []
        while True:
            while pg.is_busy():
                _wait(pg.socket, select.POLLIN)
                pg.consume_input()
            result = pg.get_result()
            if result is None:
                if until is None:
                    return results
                continue  # the end of one statement's results, in a pipeline
            if result.status == until:
                return results
            results.append(result)

    def _answer(self, results: list[pq.abc.PGresult]) -> list[list[tuple[Any, ...]]]:
        """The rows of each result with rows; the first error raised, as psycopg's."""
        found: list[list[tuple[Any, ...]]] = []
        for result in results:
            status = result.status
            if status == _ExecStatus.TUPLES_OK:
                # Loaded as psycopg's cursors load them (its C loaders, its JSON's).
                self._transformer.set_pgresult(result)
                found.append(self._transformer.load_rows(0, result.ntuples, tuple))
            elif status not in _ANSWERED:
                # FATAL_ERROR, or PIPELINE_ABORTED for those after it (never first).
                error = psycopg.errors.error_from_result(
                    result, encoding=self._driver.info.encoding
                )
                if error.sqlstate == STATEMENTS_LOST:
                    # Deallocated behind this cache's back: all are prepared again.
                    self._prepared.names.clear()
                raise error
        return found


def _wait(fileno: int, events: int) -> int:
    """Block (the GIL released) until the socket is ready for `events`; what it is ready for.
    An error or hang-up counts as readable: libpq's next read reports it."""
    poller = select.poll()
    poller.register(fileno, events)
    while True:
        ready = poller.poll()
        if ready:
            revents = ready[0][1]
            if revents & (select.POLLERR | select.POLLHUP | select.POLLNVAL):
                return revents | select.POLLIN
            return revents
