"""Does troth slow down as it ages? HITL cycles/s on an empty, a parked and an aged database.

One run measures bench/workflows.py's human-in-the-loop cycle (start a
workflow, which creates a latent promise, records a step and suspends; once
the worker reports it suspended, settle the promise by id; read the result),
with its worker process (`_workflow_worker.py`), against three SQLite
databases, one after another, each with a fresh server and worker process:

- `empty`: just migrated;
- `parked`: 100k workflows waiting on a human (a PENDING root and its PENDING
  latent step each, a completed INVOKE task, a registered callback);
- `aged`: 1M rows of finished workflows (250k roots with 3 settled steps each)
  and their 1M completed tasks: what accumulates before retention prunes it
  (and, before completed tasks were deleted, for ever).

It prints cycles/s and each ratio to the empty figure (the target: >= 0.9).

The big databases are built fast, with bulk SQL inserts into a copy of a
migrated empty database, and cached under `bench/.cache/aging/` (ignored by
git), keyed by the schema revision. `--code DIR` runs the server from another
checkout's sources (e.g. `git archive` of an older commit), for a before/after.

Usage::

    .venv/bin/python bench/aging.py [--seconds 20] [--in-flight 16] [--code DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _workflow_load import CYCLE_TIMEOUT_S, Notifications, hitl_cycle, run_loops

BENCH_DIR = Path(__file__).resolve().parent
CACHE = BENCH_DIR / ".cache" / "aging"
GROUP = "aging"
PARKED = 100_000
AGED_WORKFLOWS = 250_000
STEPS = 3


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- servers --------------------------------------------------------------------------


@contextmanager
def serve(db: Path, code: Path | None, workdir: Path) -> Iterator[str]:
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(code / "server"), str(code / "sdk")])
    port_file = workdir / f"port-{time.monotonic_ns()}"
    with (workdir / "server.log").open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "troth_server", "serve", "--no-auth", "--listen", "127.0.0.1:0",
             "--db", f"sqlite:///{db}", "--port-file", str(port_file), "--log-level", "warning"],
            stdout=out, stderr=out, env=env,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start: {(workdir / 'server.log').read_text()}")
            time.sleep(0.05)
        yield f"127.0.0.1:{port_file.read_text()}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def migrated_empty(code: Path | None, workdir: Path) -> Path:
    db = workdir / "empty.db"
    with serve(db, code, workdir):
        pass
    return db


def revision(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        return str(conn.execute("SELECT version_num FROM alembic_version").fetchone()[0])


# -- building the big databases ---------------------------------------------------------

_PROMISE = (
    "INSERT INTO promises (id, state, param_headers, param_data, value_headers, value_data,"
    " tags, timer, create_time, settle_time, expire_time, settled_by, root_id, parent_id)"
    " VALUES (?, ?, '{}', X'', '{}', X'', ?, 0, ?, ?, ?, ?, ?, ?)"
)
_TASK = (
    'INSERT INTO tasks (id, root_promise_id, "group", kind, state, counter, resume_pending,'
    " create_time, workflow) VALUES (?, ?, ?, ?, 'COMPLETED', 1, 0, ?, 'hitl')"
)
_ROOT_TAGS = '{"troth:invoke":"%s","troth:func":"hitl"}'


def fill_parked(conn: sqlite3.Connection, now: int) -> None:
    tags = _ROOT_TAGS % "parked"
    conn.executemany(
        _PROMISE,
        (
            row
            for n in range(PARKED)
            for row in (
                (f"park-{n}", "PENDING", tags, now - n, None, now + 86_400_000, None, None, None),
                (f"park-{n}.0", "PENDING", '{"troth:kind":"promise"}', now - n, None,
                 now + 86_400_000, None, f"park-{n}", f"park-{n}"),
            )
        ),
    )  # fmt: skip
    conn.executemany(
        _TASK, ((f"park-task-{n}", f"park-{n}", "parked", "INVOKE", now - n) for n in range(PARKED))
    )
    conn.executemany(
        'INSERT INTO callbacks (promise_id, root_promise_id, "group", worker_id, create_time)'
        " VALUES (?, ?, 'parked', 'w', ?)",
        ((f"park-{n}.0", f"park-{n}", now - n) for n in range(PARKED)),
    )


def fill_aged(conn: sqlite3.Connection, now: int) -> None:
    tags = _ROOT_TAGS % "done"
    # Settled a day ago and more: inside the default 30-day retention, so kept.
    base = now - 86_400_000 - AGED_WORKFLOWS

    def rows() -> Iterator[tuple[Any, ...]]:
        for n in range(AGED_WORKFLOWS):
            t = base + n
            yield (f"done-{n}", "RESOLVED", tags, t, t, t + 3_600_000, "w", None, None)
            for s in range(STEPS):
                yield (f"done-{n}.{s}", "RESOLVED", '{"troth:kind":"run"}', t, t, t + 3_600_000,
                       "w", f"done-{n}", f"done-{n}")  # fmt: skip

    conn.executemany(_PROMISE, rows())
    conn.executemany(
        _TASK,
        (
            (f"done-task-{n}-{k}", f"done-{n}", "done", "RESUME", base + n)
            for n in range(AGED_WORKFLOWS)
            for k in range(STEPS + 1)
        ),
    )


def database(name: str, empty: Path) -> Path:
    """The cached database `name` for this schema revision, built on first use."""
    if name == "empty":
        return empty
    cached = CACHE / f"{name}-{revision(empty)}.db"
    if cached.exists():
        return cached
    CACHE.mkdir(parents=True, exist_ok=True)
    building = cached.with_suffix(".building")
    shutil.copy(empty, building)
    started = time.monotonic()
    with sqlite3.connect(building) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=OFF")
        now = int(time.time() * 1000)
        (fill_parked if name == "parked" else fill_aged)(conn, now)
        conn.commit()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    building.rename(cached)
    log(f"built {cached.name} in {time.monotonic() - started:.0f} s")
    return cached


# -- the cycle ------------------------------------------------------------------------


def measure(
    address: str, notes: Notifications, seconds: float, in_flight: int, prefix: str
) -> tuple[int, float]:
    """bench/workflows.py's HITL cycle: start, wait until the worker reports the
    workflow suspended on its latent promise, settle it by id, read the result."""
    from troth import Client

    clients = [Client(address, timeout=CYCLE_TIMEOUT_S) for _ in range(4)]
    try:
        cycle = hitl_cycle(clients, notes, GROUP)
        run_loops(cycle, f"{prefix}-warm", in_flight, min(3.0, seconds))
        raw = run_loops(cycle, prefix, in_flight, seconds)
    finally:
        for client in clients:
            client.close()
    if raw.errors:
        log(f"  {raw.errors} cycles failed; the first: {raw.first_error}")
    done = len(raw.latencies_ns)
    return done, done / raw.elapsed_s


def run_variant(name: str, db: Path, args: argparse.Namespace, root: Path) -> float:
    workdir = root / name
    workdir.mkdir()
    copy = workdir / "troth.db"
    shutil.copy(db, copy)
    figures = []
    notes = Notifications(workdir / "notify.sock")
    with serve(copy, args.code, workdir) as address:
        with (workdir / "worker.log").open("ab") as out:
            worker = subprocess.Popen(
                [sys.executable, str(BENCH_DIR / "_workflow_worker.py"), "--address", address,
                 "--group", GROUP, "--notify", str(notes.path)],
                stdout=out, stderr=out,
            )  # fmt: skip
        try:
            for repeat in range(args.repeats):
                count, per_s = measure(
                    address, notes, args.seconds, args.in_flight, f"{name}-{repeat}"
                )
                figures.append(per_s)
                log(f"  {name} #{repeat + 1}: {count} cycles, {per_s:.1f}/s")
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(60)
    return statistics.median(figures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per database")
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--code", type=Path, help="run the server from this checkout")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="troth-aging-") as tmp:
        root = Path(tmp)
        empty = migrated_empty(args.code, root)
        log(f"schema {revision(empty)}; server code: {args.code or 'this checkout'}")
        results = {}
        for name in ("empty", "parked", "aged"):
            results[name] = run_variant(name, database(name, empty), args, root)
    base = results["empty"]
    print(f"{'database':<10} {'cycles/s':>9} {'ratio':>6}")
    for name, per_s in results.items():
        print(f"{name:<10} {per_s:>9.1f} {per_s / base:>6.2f}")


if __name__ == "__main__":
    main()
