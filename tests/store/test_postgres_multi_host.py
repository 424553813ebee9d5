"""PostgreSQL: a multi-host URL (`?host=h1:p1&host=h2:p2`, libpq tries each in turn,
as for a failover without a proxy) serves every connection of a store: its pools and
its LISTEN connection alike."""

from __future__ import annotations

import queue
from collections.abc import Iterator

import pytest
from _pg import fresh_schema
from _pg_cluster import free_port
from sqlalchemy.engine import make_url

from troth_server.store import Store, StoreEvent, open_store


def multi_host(url: str) -> str:
    """`url` with a host that refuses connections first, then its own."""
    parsed = make_url(url)
    hosts = (f"127.0.0.1:{free_port()}", f"{parsed.host}:{parsed.port or 5432}")
    return (
        parsed.set(host=None, port=None)
        .update_query_dict({"host": hosts})
        .render_as_string(hide_password=False)
    )


@pytest.fixture
def replicas() -> Iterator[tuple[Store, Store]]:
    """A on the plain URL, B on the multi-host one."""
    with fresh_schema() as url:
        a, b = open_store(url), open_store(multi_host(url))
        yield a, b
        a.close()
        b.close()


def test_a_replica_on_a_multi_host_url_hears_the_others(
    replicas: tuple[Store, Store],
) -> None:
    a, b = replicas
    heard: queue.SimpleQueue[StoreEvent] = queue.SimpleQueue()
    b.listen(heard.put)
    # The listener subscribes asynchronously: announce until B hears something.
    for _ in range(50):
        a.write(lambda tx: tx.announce({"orders"}, (), ()))
        try:
            event = heard.get(timeout=0.1)
        except queue.Empty:
            continue
        assert event.groups == {"orders"}
        return
    raise AssertionError("the replica on the multi-host URL never heard a commit")
