"""The store tests' shared fixture: a fresh store on each backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _pg import fresh_schema

from troth_server.store import Store, open_store


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A migrated, empty store: a SQLite file, then a PostgreSQL schema of its own
    (dropped afterwards). A module that needs another store defines its own."""
    if request.param == "sqlite":
        opened = open_store(f"sqlite:///{tmp_path}/t.db")
        yield opened
        opened.close()
        return
    with fresh_schema() as url:
        opened = open_store(url)
        yield opened
        opened.close()
