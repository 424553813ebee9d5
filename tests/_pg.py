"""PostgreSQL for tests: the machine's server, one fresh schema per user.

Every test (or server fixture) gets its own schema in the `test` database,
named after this run's pid, so concurrent or earlier runs never see each
other's rows; the schema is dropped afterwards. `TROTH_TEST_PG` overrides the
admin URL (default: trust auth on 127.0.0.1:5432, database `test`).
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

import psycopg

ADMIN_URL = os.environ.get("TROTH_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
_counter = itertools.count()


def admin() -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(ADMIN_URL, autocommit=True)


def schema_url(schema: str) -> str:
    """The server's `--db` for `schema`: search_path set through libpq options."""
    base = ADMIN_URL.replace("postgresql://", "postgresql+psycopg://", 1)
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options={quote(f'-csearch_path={schema}')}"


@contextmanager
def fresh_schema(*, migrate: bool = True) -> Iterator[str]:
    """A new empty schema; yields its `--db` URL (migrated to head with `migrate`)."""
    schema = f"t{os.getpid()}_{next(_counter)}_{uuid.uuid4().hex[:6]}"
    with admin() as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    url = schema_url(schema)
    try:
        if migrate:
            from troth_server.store import open_store

            open_store(url, migrate=True).close()
        yield url
    finally:
        with admin() as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
