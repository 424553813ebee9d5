"""What NOTIFY costs concurrent commits, pgbench-style, on troth's own statements.

Each of `--clients` threads (one connection each) runs write transactions back to
back for `--seconds`: a group commit's worth of rows (`--batch` promise ids,
random like a client's, inserted into a scratch table) and then, by mode:

- ``none``: no NOTIFY (what the commits cost without announcements);
- ``chunked``: the announcement cut into payloads of 3,500 bytes of ids, one
  `pg_notify` each (troth before issue 29: 3 for a batch of 200 random ids);
- ``one``: troth's announcement as it is now (`Announcer.notifications`: one
  payload, compressed when it must be);
- ``after``: no NOTIFY in the write transaction; one after it, from a thread and
  connection of the writer's own, coalescing all that committed meanwhile, in a
  transaction that does not wait for its WAL flush (a design, not troth's);
- ``per-row``: one `pg_notify` per row (the pgbench finding of issue 29, whose
  transactions were one row each: run it with `--batch 1`).

A listener drains the channel meanwhile, as every replica's does. Modes run
interleaved, `--rounds` times; the report is the median of the rounds' committed
transactions per second and of their median latency.

Usage (figures in /work/notes/notify.md and bench/README.md)::

    .venv/bin/python bench/notify_commits.py [--db postgresql://postgres@127.0.0.1:5432/test]
        [--clients 1,8,16] [--batch 200] [--modes none,chunked,one] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid
from typing import Any

import orjson
import psycopg

from troth_server.store._listen import Announcer

CHANNEL = "troth_bench_notify"
_OLD_CHUNK = 3500


def chunked(groups: list[str], created: list[str], origin: str) -> list[str]:
    """The payloads troth sent before issue 29 (`_listen.py` then): 3,500 bytes of ids each."""
    payloads, chunk, size = [], [], 0
    for promise_id in created:
        if size and size + len(promise_id) + 4 > _OLD_CHUNK:
            payloads.append(orjson.dumps({"o": origin, "g": groups, "s": [], "c": chunk}).decode())
            groups, chunk, size = [], [], 0
        chunk.append(promise_id)
        size += len(promise_id) + 4
    payloads.append(orjson.dumps({"o": origin, "g": groups, "s": [], "c": chunk}).decode())
    return payloads


def payloads_of(mode: str, ids: list[str], announcer: Announcer) -> list[str]:
    if mode == "none":
        return []
    if mode == "chunked":
        return chunked(["orders"], ids, "bench")
    if mode == "one":
        return [n["payload"] for n in announcer.notifications({"orders"}, (), ids)]
    if mode == "per-row":
        return [
            orjson.dumps({"o": "bench", "g": ["orders"], "s": [], "c": [i]}).decode() for i in ids
        ]
    raise SystemExit(f"unknown mode {mode!r}: give none, chunked, one, after or per-row")


def client(
    conninfo: str,
    mode: str,
    batch: int,
    seconds: float,
    latencies: list[float],
    start: threading.Barrier,
) -> None:
    announcer = Announcer(conninfo, CHANNEL)
    after = AfterCommit(conninfo) if mode == "after" else None
    with psycopg.connect(conninfo) as conn:
        start.wait()  # every client connected: the window starts now
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            ids = [str(uuid.uuid4()) for _ in range(batch)]
            payloads = payloads_of("one" if after else mode, ids, announcer)
            began = time.perf_counter()
            with conn.transaction():
                cur = conn.cursor()
                cur.execute("INSERT INTO bench_notify (id) SELECT unnest(%s::text[])", (ids,))
                for payload in [] if after else payloads:
                    cur.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))
            latencies.append(time.perf_counter() - began)
            if after:
                after.send(payloads)
    if after:
        after.close()


class AfterCommit:
    """``after``: each writer's announcements sent once its commit is done, by a thread
    of its own on a connection of its own, all that waits in one NOTIFY transaction
    (coalesced) without waiting for its WAL flush (`synchronous_commit = off`)."""

    def __init__(self, conninfo: str) -> None:
        self._conn = psycopg.connect(conninfo)
        self._waiting: list[str] = []
        self._ready = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def send(self, payloads: list[str]) -> None:
        with self._ready:
            self._waiting.extend(payloads)
            self._ready.notify()

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify()
        self._thread.join()
        self._conn.close()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._waiting and not self._closed:
                    self._ready.wait()
                if not self._waiting:
                    return
                # Coalesced as troth would (one payload, compressed): here, the last's.
                taken, self._waiting = self._waiting[-1:], []
            with self._conn.transaction():
                self._conn.execute("SET LOCAL synchronous_commit = off")
                for payload in taken:
                    self._conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))


def listener(conninfo: str, stop: threading.Event, heard: list[int]) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"LISTEN {CHANNEL}")
        while not stop.is_set():
            heard[0] += sum(1 for _ in conn.notifies(timeout=0.2))


def run(conninfo: str, mode: str, clients: int, batch: int, seconds: float) -> dict[str, Any]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("TRUNCATE bench_notify")
    stop, heard = threading.Event(), [0]
    listening = threading.Thread(target=listener, args=(conninfo, stop, heard))
    listening.start()
    time.sleep(0.2)
    per_client: list[list[float]] = [[] for _ in range(clients)]
    start = threading.Barrier(clients)
    threads = [
        threading.Thread(target=client, args=(conninfo, mode, batch, seconds, per_client[n], start))
        for n in range(clients)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    listening.join()
    latencies = sorted(x for lat in per_client for x in lat)
    return {
        "tps": len(latencies) / seconds,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "notifies": heard[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--clients", default="1,8,16")
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--modes", default="none,chunked,one")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    schema = f"bench_notify_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(args.db, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.bench_notify (id text PRIMARY KEY)")
    conninfo = f"{args.db}{'&' if '?' in args.db else '?'}options=-csearch_path%3D{schema}"
    modes = args.modes.split(",")
    try:
        results: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for _ in range(args.rounds):
            for clients in (int(c) for c in args.clients.split(",")):
                for mode in modes:
                    one = run(conninfo, mode, clients, args.batch, args.seconds)
                    results.setdefault((mode, clients), []).append(one)
        print(f"batch of {args.batch} rows per commit; median of {args.rounds} interleaved rounds")
        print(f"{'clients':>7} {'mode':>8} {'tps':>8} {'p50 ms':>8} {'notifies/commit':>16}")
        for (mode, clients), runs in sorted(
            results.items(), key=lambda kv: (kv[0][1], modes.index(kv[0][0]))
        ):
            tps = statistics.median(r["tps"] for r in runs)
            p50 = statistics.median(r["p50_ms"] for r in runs)
            per_commit = sum(r["notifies"] for r in runs) / max(
                1, sum(r["tps"] * args.seconds for r in runs)
            )
            print(f"{clients:>7} {mode:>8} {tps:>8.0f} {p50:>8.2f} {per_commit:>16.2f}")
    finally:
        with psycopg.connect(args.db, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


if __name__ == "__main__":
    main()
