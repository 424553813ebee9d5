"""`store._pg_pipeline`: PostgreSQL's hot statements on libpq, prepared once per
connection. On the machine's PostgreSQL, in a temporary table of the test's own."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from _pg import admin_url
from sqlalchemy.exc import DBAPIError

from troth_server.store._pg_pipeline import Pipeline, Prepared, positional
from troth_server.store._sql import _retryable

INSERT = "INSERT INTO t (id, n, data, doc) VALUES (%(id)s, %(n)s, %(data)s, %(doc)s)"
BY_ID = "SELECT id, n, data, doc FROM t WHERE id = %(id)s"


@pytest.fixture
def conn() -> Iterator[psycopg.Connection[Any]]:
    # As the server's writer has it: psycopg prepares nothing of its own.
    with psycopg.connect(admin_url(), prepare_threshold=None) as opened:
        opened.execute("CREATE TEMP TABLE t (id text PRIMARY KEY, n bigint, data bytea, doc jsonb)")
        opened.commit()
        yield opened


def test_named_placeholders_become_numbered_ones_once_per_name() -> None:
    found = positional("SELECT %(a)s, %(b)s, %(a)s, 'x%%y' WHERE z = %(c)s")
    assert found.sql == b"SELECT $1, $2, $1, 'x%y' WHERE z = $3"
    assert found.names == ("a", "b", "c")


def test_several_statements_answer_the_rows_of_those_that_return_rows(
    conn: psycopg.Connection[Any],
) -> None:
    prepared = Prepared()
    pipeline = Pipeline(conn, prepared)
    pipeline.begin()
    pipeline.execute(
        INSERT,
        [
            {"id": "a", "n": 1, "data": b"\x00\x01", "doc": '{"k": "v"}'},
            {"id": "b", "n": 2**40, "data": b"", "doc": None},
        ],
    )
    pipeline.execute(BY_ID, [{"id": "a"}, {"id": "b"}, {"id": "none"}])
    pipeline.query(b"COMMIT")
    assert pipeline.run() == [
        [("a", 1, b"\x00\x01", {"k": "v"})],
        [("b", 2**40, b"", None)],
        [],
    ]
    assert conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
    # One statement alone, outside pipeline mode, with the statement prepared already.
    alone = Pipeline(conn, prepared)
    alone.execute(BY_ID, [{"id": "b"}])
    assert alone.run() == [[("b", 2**40, b"", None)]]


def test_the_first_error_is_raised_and_nothing_after_it_is_applied(
    conn: psycopg.Connection[Any],
) -> None:
    prepared = Prepared()
    pipeline = Pipeline(conn, prepared)
    pipeline.begin()
    pipeline.execute(INSERT, [{"id": "a", "n": 1, "data": b"", "doc": None}] * 2)
    pipeline.execute(INSERT, [{"id": "c", "n": 3, "data": b"", "doc": None}])
    pipeline.query(b"COMMIT")
    with pytest.raises(psycopg.errors.UniqueViolation):
        pipeline.run()
    conn.rollback()
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)
    # The statements prepared by the failed pipeline (if at all) are prepared again.
    again = Pipeline(conn, prepared)
    again.execute(BY_ID, [{"id": "a"}])
    assert again.run() == [[]]


def test_statements_deallocated_behind_the_cache_are_prepared_again(
    conn: psycopg.Connection[Any],
) -> None:
    prepared = Prepared()
    first = Pipeline(conn, prepared)
    first.execute(BY_ID, [{"id": "a"}])
    assert first.run() == [[]]
    conn.execute("DEALLOCATE ALL")
    conn.commit()
    stale = Pipeline(conn, prepared)
    stale.execute(BY_ID, [{"id": "a"}])
    with pytest.raises(psycopg.errors.InvalidSqlStatementName) as raised:
        stale.run()
    assert prepared.names == {}
    # The write path runs the transaction again after this error.
    wrapped = DBAPIError.instance(None, None, raised.value, psycopg.Error)
    assert isinstance(wrapped, DBAPIError)
    assert _retryable(wrapped, committing=False) == "statements lost"
    conn.rollback()
    retried = Pipeline(conn, prepared)
    retried.execute(BY_ID, [{"id": "a"}])
    assert retried.run() == [[]]


def test_unnamed_statements_prepare_nothing_and_answer_the_same(
    conn: psycopg.Connection[Any],
) -> None:
    """A transaction-mode pooler: nothing prepared on the session, settings per transaction."""
    unnamed = Prepared(named=False, after_begin=(b"SET LOCAL enable_seqscan = off",))
    pipeline = Pipeline(conn, unnamed)
    pipeline.begin()
    pipeline.execute(INSERT, [{"id": "u", "n": 7, "data": b"\x02", "doc": '{"a": 1}'}])
    pipeline.execute(BY_ID, [{"id": "u"}])
    pipeline.query(b"SHOW enable_seqscan")
    pipeline.query(b"COMMIT")
    assert pipeline.run() == [[("u", 7, b"\x02", {"a": 1})], [("off",)]]
    alone = Pipeline(conn, unnamed)
    alone.execute(BY_ID, [{"id": "u"}])
    assert alone.run() == [[("u", 7, b"\x02", {"a": 1})]]
    assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone() == (0,)
    assert conn.execute("SHOW enable_seqscan").fetchone() == ("on",)
    assert unnamed.names == {}
