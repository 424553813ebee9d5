"""Two replicas whose pool goes through PgBouncer in transaction mode.

A private `pgbouncer` (Debian's; `.ci/run` installs it) on an ephemeral port pools
per transaction in front of the suite's PostgreSQL, with fewer server connections
than the replicas have clients, so that their transactions share server sessions.
The replicas' pool goes through it (`--db-transaction-pooling`: nothing prepared,
no setting kept on a session) and their listener straight to PostgreSQL
(`--db-listen-url`): a watch and a worker on replica A hear at once of what was
done through replica B, long before A's periodic rescan would have found it.
A listener pointed at the pooler is warned about in the log, saying what to do.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest
from _pg import admin_url, fresh_schema
from _procs import reap
from _support import PollStream, ServerProcess, eventually, start_server, start_workflow
from structlog.testing import capture_logs

from troth.v1 import promises_pb2 as pb
from troth.v1 import promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc
from troth.v1 import types_pb2 as types
from troth_server.store import open_store

PGBOUNCER = shutil.which("pgbouncer") or next(
    (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None
)
SLOW_TICK = "60s"
"""The replicas' periodic rescan: what they hear sooner came through an announcement."""
PROMPT_S = 5.0
"""Promptly, on a loaded machine: well within one rescan."""


@dataclass
class Bouncer:
    port: int
    database: str
    log: Path

    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{self.database}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def schema_url() -> Iterator[str]:
    with fresh_schema() as url:
        yield url


@pytest.fixture
def bouncer(tmp_path: Path, schema_url: str) -> Iterator[Bouncer]:
    if PGBOUNCER is None:
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer; .ci/run does)")
    admin = urlsplit(admin_url())
    schema = parse_qs(urlsplit(schema_url).query)["options"][0].split("=", 1)[1]
    home = tmp_path / "pgbouncer"
    home.mkdir()
    port = _free_port()
    user = admin.username or "postgres"
    (home / "userlist.txt").write_text(f'"{user}" ""\n')
    # Every server connection of the alias is in the test's schema (its connect_query),
    # as a deployment's role would be by its search_path.
    (home / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"troth = host={admin.hostname} port={admin.port or 5432} "
        f"dbname={admin.path.lstrip('/')} user={user} "
        f"connect_query='SET search_path TO {schema}'\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {home / 'userlist.txt'}\n"
        "pool_mode = transaction\ndefault_pool_size = 3\nmax_client_conn = 200\n"
        "ignore_startup_parameters = extra_float_digits\n"
    )
    home.chmod(0o755)
    for name in ("userlist.txt", "pgbouncer.ini"):
        (home / name).chmod(0o644)
    # PgBouncer refuses to run as root: as PostgreSQL's user then.
    as_user = ["-u", "postgres"] if os.geteuid() == 0 else []
    log = tmp_path / "pgbouncer.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [PGBOUNCER, *as_user, str(home / "pgbouncer.ini")], stdout=out, stderr=out
        )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with psycopg.connect(
                    f"postgresql://{user}@127.0.0.1:{port}/troth", connect_timeout=2
                ) as conn:
                    conn.execute("SELECT 1")
                break
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer did not start:\n{log.read_text()}") from None
                time.sleep(0.05)
        yield Bouncer(port, "troth", log)
    finally:
        reap(proc, grace=5)


@dataclass
class Pair:
    a: ServerProcess
    b: ServerProcess


@pytest.fixture
def pair(
    bouncer: Bouncer, schema_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pair]:
    with ExitStack() as stack:
        with ThreadPoolExecutor(2) as pool:  # their start-ups overlap
            started = [
                pool.submit(
                    start_server,
                    tmp_path_factory.mktemp(f"bounced-{name}"),
                    "--sweep-interval",
                    SLOW_TICK,
                    "--db-transaction-pooling",
                    "--db-listen-url",
                    schema_url,
                    db_url=bouncer.url(),
                )
                for name in "ab"
            ]
        servers = [f.result() for f in started]
        for server in servers:
            stack.callback(server.stop)
        yield Pair(*servers)


def test_wake_ups_cross_replicas_whose_pool_pools_per_transaction(pair: Pair) -> None:
    run = f"bounce-{uuid.uuid4().hex[:8]}"
    with pair.a.channel() as channel_a, pair.b.channel() as channel_b:
        stub_a = promises_pb2_grpc.PromiseServiceStub(channel_a)
        stub_b = promises_pb2_grpc.PromiseServiceStub(channel_b)
        watch = stub_a.WatchPromises(pb.WatchPromisesRequest(tags={"inbox": run}), timeout=30)
        assert ("troth-watch", "started") in tuple(watch.initial_metadata() or ())
        began = time.monotonic()
        stub_b.CreatePromise(pb.CreatePromiseRequest(id=f"{run}.inbox-item", tags={"inbox": run}))
        stub_b.ResolvePromise(pb.ResolvePromiseRequest(id=f"{run}.inbox-item"))
        heard = [next(watch) for _ in range(2)]
        assert [(e.type, e.promise.id) for e in heard] == [
            (pb.PROMISE_EVENT_TYPE_CREATED, f"{run}.inbox-item"),
            (pb.PROMISE_EVENT_TYPE_SETTLED, f"{run}.inbox-item"),
        ]
        assert heard[1].promise.state == types.PROMISE_STATE_RESOLVED
        assert time.monotonic() - began < PROMPT_S
        watch.cancel()

        # A worker polling A gets the task of a workflow started through B.
        request = tasks_pb2.PollRequest(group=run, worker_id=f"{run}-w", capacity=1)
        poll = PollStream(tasks_pb2_grpc.TaskServiceStub(channel_a), request, PROMPT_S)
        try:
            time.sleep(0.5)  # the stream is open on A
            began = time.monotonic()
            root = start_workflow(stub_b, run)
            delivered = poll.next_response()
            assert delivered.task.root_promise_id == root
            assert time.monotonic() - began < PROMPT_S
        finally:
            poll.cancel()
    for server in (pair.a, pair.b):
        assert "listen.through_pooler" not in server.log()


def test_a_listener_through_the_pooler_is_warned_about(bouncer: Bouncer, schema_url: str) -> None:
    """Straight to PostgreSQL, then through the pooler: only the second is warned about."""
    with capture_logs() as logs:
        store = open_store(bouncer.url(), listen_url=schema_url, transaction_pooling=True)
        try:
            store.listen(lambda _event: None)
            # Its session is checked before its LISTEN: once that is seen, any warning
            # has been logged.
            eventually(lambda: _listening(schema_url) == 1, timeout=10, what="its LISTEN")
        finally:
            store.close()
    assert not [e for e in logs if e["event"].startswith("listen.")], logs

    with capture_logs() as logs:

        def warned() -> list[dict[str, str]]:
            return [e for e in logs if e["event"] == "listen.through_pooler"]

        store = open_store(bouncer.url(), listen_url=bouncer.url(), transaction_pooling=True)
        try:
            store.listen(lambda _event: None)
            eventually(warned, timeout=10, what="listen.through_pooler in the log")
        finally:
            store.close()
    warning = warned()[0]
    assert "--db-listen-url" in warning["fix"]
    assert "transaction" in warning["why"]


def _listening(schema_url: str) -> int:
    """Sessions of the suite's PostgreSQL whose last statement was the schema's LISTEN."""
    schema = parse_qs(urlsplit(schema_url).query)["options"][0].split("=", 1)[1]
    with psycopg.connect(admin_url(), autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query = %s", (f'LISTEN "troth_{schema}"',)
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_transaction_pooling_without_a_listener_url_is_refused() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "troth_server",
            "serve",
            "--no-auth",
            "--db-transaction-pooling",
            "--db",
            "postgresql+psycopg://x@127.0.0.1/x",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "give --db-listen-url" in done.stderr
