"""PostgreSQL: the listener's own URL (`--db-listen-url`). Replicas hear each other's
commits on it; one pointed at another database than the writes go to is logged as
an error saying what to give instead (PgBouncer: tests/integration/test_pgbouncer.py)."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator

import psycopg
import pytest
from _pg import admin_url, fresh_schema
from sqlalchemy import make_url
from structlog.testing import capture_logs

from troth_server.store import StoreEvent, open_store


@pytest.fixture
def schema_url() -> Iterator[str]:
    with fresh_schema() as url:
        yield url


def test_a_replica_hears_on_the_listen_url_it_is_given(schema_url: str) -> None:
    listen_url = f"{schema_url}&application_name=the-listen-url"
    a = open_store(schema_url)
    b = open_store(schema_url, listen_url=listen_url)
    try:
        heard: queue.SimpleQueue[StoreEvent] = queue.SimpleQueue()
        b.listen(heard.put)
        for _ in range(50):  # the listener subscribes asynchronously
            a.write(lambda tx: tx.announce({"orders"}, ()))
            try:
                assert heard.get(timeout=0.1).groups == {"orders"}
                break
            except queue.Empty:
                continue
        else:
            raise AssertionError("B never heard A")
        with psycopg.connect(admin_url(), autocommit=True) as admin:
            names = admin.execute(
                "SELECT application_name FROM pg_stat_activity WHERE query LIKE 'LISTEN %%'"
                " AND query LIKE %s",
                (f"%{make_url(schema_url).query['options'].split('=', 1)[1]}%",),
            ).fetchall()
        assert names == [("the-listen-url",)]
    finally:
        a.close()
        b.close()


def test_a_listen_url_to_another_database_is_logged_saying_what_to_give(schema_url: str) -> None:
    elsewhere = make_url(schema_url).set(database="postgres").render_as_string(False)
    with capture_logs() as logs:
        store = open_store(schema_url, listen_url=elsewhere)
        try:
            store.listen(lambda _event: None)
            for _ in range(100):
                if any(e["event"] == "listen.other_database" for e in logs):
                    break
                time.sleep(0.1)
        finally:
            store.close()
    errors = [e for e in logs if e["event"] == "listen.other_database"]
    assert errors, logs
    assert errors[0]["listening_to"] == "postgres"
    assert "--db-listen-url" in errors[0]["fix"]
