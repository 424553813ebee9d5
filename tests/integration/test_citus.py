"""troth on a Citus cluster with schema-based sharding: one deployment per schema.

Opt-in: set `TROTH_TEST_CITUS` to a libpq URL of a Citus coordinator
(`postgresql://USER@HOST:PORT/DATABASE`, a user that may create schemas). The test
makes a fresh distributed schema there (`citus_schema_distribute`), runs the
migrations into it, starts two replicas on it and runs a human-in-the-loop
workflow across them (started on one, its approval given through the other),
then drops the schema. Without the variable it is skipped, saying so. See
docs/postgresql-and-scale.md, "Running at scale".
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Generator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _support import ServerProcess, eventually, start_server
from sqlalchemy.engine import make_url

from troth import Client, Context, NotFoundError, Worker
from troth_server.store import open_store

CITUS_ENV = "TROTH_TEST_CITUS"
GROUP = "citus"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.environ.get(CITUS_ENV),
        reason=f"set {CITUS_ENV}=postgresql://USER@HOST:PORT/DATABASE (a Citus coordinator) "
        "to run troth on Citus schema-based sharding",
    ),
]


@pytest.fixture
def schema_url() -> Iterator[str]:
    """The server's `--db` URL for a fresh distributed schema of the given cluster."""
    admin = os.environ[CITUS_ENV]
    schema = f"troth_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        found = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'citus'")
        version = found.fetchone()
        assert version is not None, (
            f"{CITUS_ENV} names a database without the citus extension: point it at a Citus "
            "coordinator's database (CREATE EXTENSION citus there)"
        )
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute("SELECT citus_schema_distribute(%s)", (schema,))
    url = make_url(admin).set(drivername="postgresql+psycopg")
    url = url.update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def review(draft: str) -> str:
    return f"reviewed {draft}"


def approval_flow(ctx: Context, draft: str) -> Generator[Any, Any, str]:
    reviewed: str = yield ctx.run(review, draft)
    approval = yield ctx.promise(timeout=timedelta(minutes=5))
    decision: str = yield approval
    return f"{reviewed}: {decision}"


def test_a_deployment_in_a_distributed_schema_runs_a_human_in_the_loop_workflow(
    schema_url: str, tmp_path: Path
) -> None:
    open_store(schema_url, migrate=True).close()  # the migrations, in the schema
    servers: list[ServerProcess] = []
    try:
        servers += [start_server(tmp_path / n, db_url=schema_url) for n in ("a", "b")]
        with (
            Client(servers[0].address, timeout=10) as a,
            Client(servers[1].address, timeout=10) as b,
        ):
            worker = Worker(a, group=GROUP, lease=timedelta(seconds=5))
            worker.workflow(approval_flow)
            worker.start()
            try:
                root = f"wf-{uuid.uuid4().hex[:8]}"
                handle = a.start("approval_flow", "the draft", id=root, group=GROUP)

                def approve() -> bool:  # once the workflow waits on it
                    try:
                        b.resolve(f"{root}.1", "approved")
                    except NotFoundError:
                        return False
                    return True

                eventually(approve, 30, "the workflow to wait for its approval")
                assert handle.result(timeout=30) == "reviewed the draft: approved"
            finally:
                worker.stop()
    finally:
        for server in servers:
            server.stop()
