"""PostgreSQL: a write transaction announces its changes in one NOTIFY.

A committing transaction with a pending NOTIFY holds PostgreSQL's notification
lock until its commit is done, serialising the commits of every replica; the
queue entries it writes meanwhile are work under that lock too. A group commit
of many creates and settles sends one payload carrying them all.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from _pg import fresh_schema
from sqlalchemy import make_url

from troth_server.store import Store, open_store


@pytest.fixture
def writer_and_listener() -> Iterator[tuple[Store, psycopg.Connection[object]]]:
    with fresh_schema() as url:
        store = open_store(url)
        conninfo = make_url(url).set(drivername="postgresql").render_as_string(False)
        listener = psycopg.connect(conninfo, autocommit=True)
        schema = listener.execute("SELECT current_schema()").fetchone()
        assert schema is not None
        channel = f"troth_{schema[0]}"[:63]
        listener.execute(f'LISTEN "{channel}"')
        yield store, listener
        listener.close()
        store.close()


def _heard(listener: psycopg.Connection[object], quiet_s: float = 0.5) -> int:
    """How many notifications arrive until none has for `quiet_s`."""
    count = 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        got = list(listener.notifies(timeout=quiet_s, stop_after=1000))
        if not got:
            break
        count += len(got)
    return count


@pytest.mark.parametrize(
    "created, settled",
    [
        pytest.param(
            [str(uuid.uuid4()) for _ in range(100)],
            [str(uuid.uuid4()) for _ in range(100)],
            id="100 creates and 100 settles, random ids",
        ),
        pytest.param(
            [f"order-{i:05d}/charge" for i in range(512)],
            [f"order-{i:05d}/reserve" for i in range(512)],
            id="512 creates and 512 settles, workflow steps",
        ),
    ],
)
def test_a_group_commit_sends_one_notify(
    writer_and_listener: tuple[Store, psycopg.Connection[object]],
    created: list[str],
    settled: list[str],
) -> None:
    store, listener = writer_and_listener
    store.write(lambda tx: tx.announce({"orders", "billing"}, settled, created))
    assert _heard(listener) == 1
