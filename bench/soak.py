"""Soak: sustained load above the server's throughput, with streams connecting and
dropping, against a real server subprocess; fails on a leak or a forbidden answer.

The load (one asyncio process, raw grpc.aio stubs so that every answer is seen):

- `--in-flight` unary loops (default 3000, spread over `--processes` load
  processes, each with `--channels` connections: far more calls than the server
  answers, so it runs saturated, and refuses some past its limits): each
  creates a promise, reads it, resolves it, reads it again; every 10th loop
  starts a workflow root instead (tags `troth:invoke=soak`), every 20th searches.
  A refused call (`RESOURCE_EXHAUSTED`) is retried after its `RetryInfo` delay,
  jittered, as the SDK does;
- `--pollers` workers, each on a connection of its own that it opens and drops
  every session: a `Poll` stream of group `soak` held for 0.5 to 5 s, completing
  most tasks it gets and dropping the stream in the middle of the others;
- `--watchers` `WatchPromise` streams (new connection per session): a promise is
  created and watched, then either resolved (the stream ends with it) or the
  watch is dropped mid-stream;
- `--event-watchers` `WatchPromises` streams held for 1 to 10 s each.

It measures the server process (psutil): RSS and open file descriptors at the
start (after `--warmup` seconds of the same load, with the load stopped and
every connection closed, so the server is quiet) and at the end (the same way),
and samples them under load every `--sample` seconds. It counts answers per RPC
and status code (a stream the soak dropped itself counts as `dropped`, not as a
status), and reads the server's own refusal counters from its `overload` log line.

Exit status 1 (and `FAIL` lines) on:

- any `UNKNOWN`, `INTERNAL` or `CANCELLED` answer (DESIGN §4 rule 14: overload is
  `RESOURCE_EXHAUSTED`, never these);
- open fds at the end more than `FD_MARGIN` above the start: with every client
  connection closed the server holds a fixed set (listening socket, epoll and
  wake-up fds, its database files and pooled connections, its log), and the
  warm-up under the same load has already grown the reader pool to its size; the
  margin covers a connection gRPC core is still closing when it is counted;
- RSS at the end more than `RSS_MARGIN_MIB` or `RSS_MARGIN_SHARE` (whichever is
  larger) above the start: allocator high-water marks, SQLite's page caches and
  gRPC's arenas keep growing for a while after the warm-up, by a bounded amount;
  a leak of even 100 bytes per call at 2,000 calls/s is 12 MiB a minute, which a
  10-minute soak shows far beyond the margin.

Usage (see bench/README.md, "Soak")::

    .venv/bin/python bench/soak.py --minutes 10 [--store sqlite|postgres]
        [--in-flight 3000] [--processes 2] [--troth-arg=--max-concurrent-rpcs=1000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import json
import multiprocessing
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import psutil
from _servers import BACKENDS, Cluster, ServerError, fmt, log, machine_info, table
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from troth._grpc_args import ARG_USE_LOCAL_SUBCHANNEL_POOL
from troth.v1 import promises_pb2, promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc, types_pb2

FORBIDDEN = ("UNKNOWN", "INTERNAL", "CANCELLED")
FD_MARGIN = 2
DB_FD_BOUND = 20
PG_PORT = 5432
RSS_MARGIN_MIB = 48
RSS_MARGIN_SHARE = 0.20
GROUP = "soak"
TIMEOUT_S = 60.0
TIMED = (("troth-timeout-ms", str(round(TIMEOUT_S * 1000))),)
"""Every unary call says its timeout, as the SDK does, so the server measures how long
calls wait before it can start them (and sheds load before they wait too long)."""
CHANNEL_OPTIONS = [(ARG_USE_LOCAL_SUBCHANNEL_POOL, 1)]
MiB = 1024 * 1024


@dataclass
class Tally:
    """Answers per (rpc, status code); streams the soak dropped itself; the stream count."""

    answers: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    dropped: collections.Counter[str] = field(default_factory=collections.Counter)
    deliveries: int = 0
    events: int = 0

    def total(self) -> int:
        return sum(self.answers.values())

    def add(self, other: Tally) -> None:
        self.answers.update(other.answers)
        self.dropped.update(other.dropped)
        self.deliveries += other.deliveries
        self.events += other.events

    def by_code(self) -> collections.Counter[str]:
        codes: collections.Counter[str] = collections.Counter()
        for (_rpc, code), n in self.answers.items():
            codes[code] += n
        return codes


def retry_after(error: grpc.aio.AioRpcError) -> float | None:
    """The RetryInfo delay of an overload refusal, in seconds (None without one)."""
    try:
        status = rpc_status.from_call(error)  # type: ignore[arg-type]
    except ValueError:
        return None
    for detail in status.details if status is not None else ():
        info = error_details_pb2.RetryInfo()
        if detail.Unpack(info):
            return info.retry_delay.ToMilliseconds() / 1000
    return None


class Load:
    """Every load loop of one phase; `stop()` ends them at their next step."""

    def __init__(self, address: str, args: argparse.Namespace, tally: Tally, run: str) -> None:
        self.address = address
        self.args = args
        self.tally = tally
        self.run = run
        self.stopping = asyncio.Event()
        self.shared: list[grpc.aio.Channel] = []  # opened on the phase's event loop
        self._ids = iter(range(10**12))

    def new_id(self, kind: str) -> str:
        return f"soak-{self.run}-{kind}-{next(self._ids)}"

    async def call(self, rpc: str, make: Callable[[], Awaitable[Any]]) -> Any:
        """One unary call, retried after overload refusals as the SDK would; None if the
        answer was another error (counted) or the phase is over."""
        attempt = 0
        while not self.stopping.is_set():
            attempt += 1
            try:
                response = await make()
            except grpc.aio.AioRpcError as exc:
                self.tally.answers[rpc, exc.code().name] += 1
                delay = retry_after(exc)
                if exc.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED or delay is None:
                    return None
                ceiling = min(5.0, 0.1 * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
                await self._sleep(max(ceiling, delay * random.uniform(1.0, 1.5)))
                continue
            self.tally.answers[rpc, "OK"] += 1
            return response
        return None

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)

    # -- unary loops --------------------------------------------------------------------

    async def unary_loop(self, n: int) -> None:
        stub = promises_pb2_grpc.PromiseServiceStub(self.shared[n % len(self.shared)])
        while not self.stopping.is_set():
            roll = random.random()
            if roll < 0.05:
                await self.call("SearchPromises", lambda: stub.SearchPromises(
                    promises_pb2.SearchPromisesRequest(id=f"soak-{self.run}-p-*", page_size=10),
                    timeout=TIMEOUT_S, metadata=TIMED,
                ))  # fmt: skip
                continue
            workflow = roll < 0.15
            pid = self.new_id("w" if workflow else "p")
            tags = {"troth:invoke": GROUP, "troth:func": "soak"} if workflow else {}
            create = promises_pb2.CreatePromiseRequest(id=pid, tags=tags)
            create.ttl.FromSeconds(600)
            if await self.call("CreatePromise", functools.partial(
                stub.CreatePromise, create, timeout=TIMEOUT_S, metadata=TIMED
            )) is None:  # fmt: skip
                continue
            if workflow:
                continue  # a poller completes it
            get = functools.partial(
                stub.GetPromise,
                promises_pb2.GetPromiseRequest(id=pid),
                timeout=TIMEOUT_S,
                metadata=TIMED,
            )
            await self.call("GetPromise", get)
            resolve = promises_pb2.ResolvePromiseRequest(
                id=pid, value=types_pb2.Payload(data=b"{}"), idempotency_key=uuid.uuid4().hex
            )
            await self.call("ResolvePromise", functools.partial(
                stub.ResolvePromise, resolve, timeout=TIMEOUT_S, metadata=TIMED
            ))  # fmt: skip
            await self.call("GetPromise", get)

    # -- streams ------------------------------------------------------------------------

    async def _stream_session(
        self, rpc: str, body: Callable[[grpc.aio.Channel], Awaitable[None]]
    ) -> None:
        """One stream session on a connection of its own, opened and closed around it."""
        channel = grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS)
        try:
            await body(channel)
        except grpc.aio.AioRpcError as exc:
            self.tally.answers[rpc, exc.code().name] += 1
            delay = retry_after(exc)
            if delay is not None:
                await self._sleep(delay * random.uniform(1.0, 1.5))
        finally:
            await channel.close()

    async def poll_loop(self, n: int) -> None:
        while not self.stopping.is_set():
            await self._stream_session("Poll", lambda channel: self._poll(channel, n))

    async def _poll(self, channel: grpc.aio.Channel, n: int) -> None:
        tasks = tasks_pb2_grpc.TaskServiceStub(channel)
        worker = f"soak-{self.run}-worker-{n}"
        request = tasks_pb2.PollRequest(
            group=GROUP, worker_id=worker, capacity=4, lease=duration_pb2.Duration(seconds=10)
        )
        call = tasks.Poll(request)
        ends = time.monotonic() + random.uniform(0.5, 5.0)
        ended = False  # by the server (EOF, or an error raised to the session)
        try:
            while not self.stopping.is_set():
                left = ends - time.monotonic()
                if left <= 0:
                    break
                try:
                    delivery = await asyncio.wait_for(call.read(), left)
                except TimeoutError:
                    break
                if delivery is grpc.aio.EOF:
                    self.tally.answers["Poll", "OK"] += 1
                    ended = True
                    return
                self.tally.deliveries += 1
                if random.random() < 0.2:
                    break  # drop the stream in the middle of a task: its lease is given back
                task = delivery.task
                complete = tasks_pb2.CompleteTaskRequest(
                    task_id=task.id, counter=task.counter, worker_id=worker,
                    resolve_root=types_pb2.Payload(data=b"{}"),
                )  # fmt: skip
                await self.call("CompleteTask", functools.partial(
                    tasks.CompleteTask, complete, timeout=TIMEOUT_S, metadata=TIMED
                ))  # fmt: skip
        except grpc.aio.AioRpcError:
            ended = True
            raise
        finally:
            # (A read timed out by wait_for has cancelled the call already: dropped too.)
            call.cancel()
            if not ended:
                self.tally.dropped["Poll"] += 1

    async def watch_loop(self, n: int) -> None:
        while not self.stopping.is_set():
            await self._stream_session("WatchPromise", self._watch)

    async def _watch(self, channel: grpc.aio.Channel) -> None:
        promises = promises_pb2_grpc.PromiseServiceStub(channel)
        pid = self.new_id("watched")
        create = promises_pb2.CreatePromiseRequest(id=pid)
        create.ttl.FromSeconds(600)
        if await self.call("CreatePromise", lambda: promises.CreatePromise(
            create, timeout=TIMEOUT_S, metadata=TIMED
        )) is None:  # fmt: skip
            return
        call = promises.WatchPromise(promises_pb2.WatchPromiseRequest(id=pid))
        try:
            first = await call.read()
            if first is grpc.aio.EOF:
                return
            if random.random() < 0.5:
                await self._sleep(random.uniform(0.1, 3.0))
                return  # dropped mid-stream by the finally below
            await self._sleep(random.uniform(0.0, 2.0))
            resolve = promises_pb2.ResolvePromiseRequest(id=pid, idempotency_key=uuid.uuid4().hex)
            if await self.call("ResolvePromise", lambda: promises.ResolvePromise(
                resolve, timeout=TIMEOUT_S, metadata=TIMED
            )) is None:  # fmt: skip
                return  # the phase ended first: drop the watch
            while (await call.read()) is not grpc.aio.EOF:
                pass
            self.tally.answers["WatchPromise", (await call.code()).name] += 1
        finally:
            if not call.done():
                call.cancel()
                self.tally.dropped["WatchPromise"] += 1

    async def events_loop(self, n: int) -> None:
        while not self.stopping.is_set():
            await self._stream_session("WatchPromises", self._events)

    async def _events(self, channel: grpc.aio.Channel) -> None:
        promises = promises_pb2_grpc.PromiseServiceStub(channel)
        call = promises.WatchPromises(promises_pb2.WatchPromisesRequest(id=f"soak-{self.run}-*"))
        ends = time.monotonic() + random.uniform(1.0, 10.0)
        ended = False
        try:
            while not self.stopping.is_set() and time.monotonic() < ends:
                try:
                    event = await asyncio.wait_for(call.read(), ends - time.monotonic())
                except TimeoutError:
                    break
                if event is grpc.aio.EOF:
                    self.tally.answers["WatchPromises", (await call.code()).name] += 1
                    ended = True
                    return
                self.tally.events += 1
        except grpc.aio.AioRpcError:
            ended = True
            raise
        finally:
            call.cancel()
            if not ended:
                self.tally.dropped["WatchPromises"] += 1

    async def run_for(self, seconds: float) -> None:
        a = self.args
        self.shared = [
            grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS)
            for _ in range(a.channels)
        ]
        loops: list[Awaitable[None]] = [
            *(self.unary_loop(n) for n in range(a.in_flight)),
            *(self.poll_loop(n) for n in range(a.pollers)),
            *(self.watch_loop(n) for n in range(a.watchers)),
            *(self.events_loop(n) for n in range(a.event_watchers)),
        ]
        running = [asyncio.ensure_future(loop) for loop in loops]
        await asyncio.sleep(seconds)
        self.stopping.set()
        # Every loop ends at its next step; one stuck longer than a call's timeout is a
        # bug of the soak (or a server that stopped answering): say so, do not hang.
        done, stuck = await asyncio.wait(running, timeout=TIMEOUT_S + 5)
        for task in stuck:
            task.cancel()
        if stuck:
            log(f"soak: {len(stuck)} load loops did not stop within {TIMEOUT_S + 5:.0f}s")
        for task in done:
            task.result()
        for channel in self.shared:
            await channel.close()


@dataclass
class Resources:
    rss: int
    fds: int
    clients: int
    """Connections from clients (to the server's port) still open."""
    database: int
    """Fds of the store: SQLite's database and WAL files, or PostgreSQL sockets."""

    @property
    def other(self) -> int:
        """Everything else: listening socket, epoll, eventfds, pipes, the log."""
        return self.fds - self.clients - self.database


def census(process: psutil.Process, port: int, db_path: str | None) -> Resources:
    sockets = process.net_connections(kind="inet")
    clients = sum(1 for c in sockets if c.raddr and c.laddr.port == port)
    if db_path is not None:
        database = sum(1 for f in process.open_files() if f.path.startswith(db_path))
    else:
        database = sum(1 for c in sockets if c.raddr and c.raddr.port == PG_PORT)
    return Resources(process.memory_info().rss, process.num_fds(), clients, database)


def quiet_resources(
    process: psutil.Process, port: int, db_path: str | None, settle_s: float = 15.0
) -> Resources:
    """RSS and fds once every client connection is closed and the fd count has stopped
    changing (or after `settle_s`: then what is still open counts against the run). On a
    loaded machine the server may take seconds to close connections its clients closed;
    a count that merely stood still for 2 s is not yet quiet."""
    deadline = time.monotonic() + settle_s
    last, stable_since = process.num_fds(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = process.num_fds()
        if now != last:
            last, stable_since = now, time.monotonic()
        elif time.monotonic() - stable_since >= 2.0:
            resources = census(process, port, db_path)
            if resources.clients == 0:
                return resources
            stable_since = time.monotonic()
    return census(process, port, db_path)


def server_refusals(cluster: Cluster) -> dict[str, int]:
    """The server's refused_total from its latest `overload` line (SIGUSR1 forces one)."""
    server = cluster.servers[0]
    server.stats()  # SIGUSR1: an `overload` line, then the `stats` line waited for
    found: dict[str, int] = {}
    for line in server.stderr_path.read_text(errors="replace").splitlines():
        if '"overload"' in line:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if record.get("event") == "overload":
                    found = dict(record.get("refused_total") or {})
    return found


LOOP_KNOBS = ("in_flight", "pollers", "watchers", "event_watchers")


def _shard(args: argparse.Namespace, index: int, shards: int) -> argparse.Namespace:
    """This process's share of the load loops (the first ones take the remainders)."""
    share = argparse.Namespace(**vars(args))
    for knob in LOOP_KNOBS:
        total = getattr(args, knob)
        setattr(share, knob, total // shards + (1 if index < total % shards else 0))
    return share


def _run_shard(address: str, args: argparse.Namespace, seconds: float, run: str) -> Tally:
    """One load process's phase (in a process of its own: a single Python process
    cannot offer more than the server handles on a machine of two cores)."""
    tally = Tally()
    asyncio.run(Load(address, args, tally, run).run_for(seconds))
    return tally


@contextlib.contextmanager
def load_processes(count: int) -> Iterator[ProcessPoolExecutor]:
    """`count` load processes, started (and their imports done) before it yields, and
    ended when it exits."""
    with ProcessPoolExecutor(count, mp_context=multiprocessing.get_context("spawn")) as pool:
        # Concurrent, so that every process starts; each imports what a shard needs.
        for ready in [pool.submit(_ready, 0.2) for _ in range(count)]:
            ready.result()
        yield pool


def _ready(hold_s: float) -> None:
    time.sleep(hold_s)


def run_phase(
    pool: ProcessPoolExecutor,
    address: str,
    args: argparse.Namespace,
    seconds: float,
    run: str,
    on_sample: Callable[[float], None] | None = None,
) -> Tally:
    started = time.monotonic()
    futures = [
        pool.submit(_run_shard, address, _shard(args, i, args.processes), seconds, f"{run}{i}")
        for i in range(args.processes)
    ]
    while not all(f.done() for f in futures):
        wait(futures, timeout=args.sample)
        elapsed = time.monotonic() - started
        if on_sample is not None and not all(f.done() for f in futures) and elapsed < seconds:
            on_sample(elapsed)
    tally = Tally()
    for future in futures:
        tally.add(future.result())
    return tally


def soak(args: argparse.Namespace) -> dict[str, Any]:
    backend = BACKENDS["sqlite" if args.store == "sqlite" else "pg"]
    workdir = Path(tempfile.mkdtemp(prefix="troth-soak-"))
    cluster = Cluster("soak", backend, workdir, args.troth_arg)
    stack = contextlib.ExitStack()
    try:
        process = psutil.Process(cluster.servers[0].proc.pid)
        address = cluster.addresses[0]
        log(f"soak: {args.store} server at {address}; warm-up {args.warmup:g}s")
        # A pool of load processes per phase, ended with it: a process's exit closes
        # every connection it had, so the quiet census after a phase waits on the
        # server alone (gRPC core in a live process may close a closed channel's
        # connection much later on a loaded machine).
        with load_processes(args.processes) as warm:
            run_phase(warm, address, args, args.warmup, "warm")
        pool = stack.enter_context(load_processes(args.processes))  # started before the clock
        port = int(address.rsplit(":", 1)[1])
        db_path = str(cluster.database.path) if cluster.database.path is not None else None
        start = quiet_resources(process, port, db_path)
        refused_before = server_refusals(cluster)
        log(f"start (quiet): rss {start.rss / MiB:.1f} MiB, fds {start.fds} {start}")
        samples: list[tuple[float, int, int, float]] = []
        began = time.monotonic()
        cpu_began = process.cpu_times()
        last = [began, sum(cpu_began[:2])]

        def sample(elapsed: float) -> None:
            cluster.check_alive()
            rss, fds = process.memory_info().rss, process.num_fds()
            now, cpu = time.monotonic(), sum(process.cpu_times()[:2])
            share = (cpu - last[1]) / (now - last[0])
            last[:] = [now, cpu]
            samples.append((elapsed, rss, fds, share))
            log(f"  {elapsed:6.0f}s  rss {rss / MiB:7.1f} MiB  fds {fds:5d}  "
                f"server CPU {share:4.0%} of a core")  # fmt: skip

        seconds = args.minutes * 60
        tally = run_phase(pool, address, args, seconds, uuid.uuid4().hex[:6], sample)
        elapsed = time.monotonic() - began
        server_cpu = (sum(process.cpu_times()[:2]) - sum(cpu_began[:2])) / elapsed
        pool.shutdown()  # before the census: see the warm-up's pool
        end = quiet_resources(process, port, db_path)
        log(f"end (quiet): rss {end.rss / MiB:.1f} MiB, fds {end.fds} {end}")
        refused_total = server_refusals(cluster)
        refused = {k: n - refused_before.get(k, 0) for k, n in refused_total.items()}
        refused = {k: n for k, n in refused.items() if n}
        cluster.check_alive()
    finally:
        stack.close()
        cluster.stop()
    result = report(args, tally, start, end, samples, elapsed, refused, server_cpu)
    if result["failures"] or args.keep:
        result["server_log"] = str(cluster.servers[0].stderr_path)
        log(f"soak: the server's log is kept at {result['server_log']}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def report(
    args: argparse.Namespace,
    tally: Tally,
    start: Resources,
    end: Resources,
    samples: list[tuple[float, int, int, float]],
    elapsed: float,
    refused: dict[str, int],
    server_cpu: float,
) -> dict[str, Any]:
    codes = tally.by_code()
    rss_margin = max(RSS_MARGIN_MIB * MiB, RSS_MARGIN_SHARE * start.rss)
    failures = [
        f"{code} answered {codes[code]} times (never allowed)" for code in FORBIDDEN if codes[code]
    ]
    if end.clients > FD_MARGIN:
        failures.append(f"{end.clients} client connections still open after every client closed")
    if end.database > DB_FD_BOUND:
        failures.append(f"{end.database} database fds, more than the pools keep ({DB_FD_BOUND})")
    if end.other - start.other > FD_MARGIN:
        failures.append(
            f"fds other than connections and database grew from {start.other} to {end.other} "
            f"(margin {FD_MARGIN})"
        )
    if end.rss - start.rss > rss_margin:
        failures.append(
            f"RSS grew from {start.rss / MiB:.1f} to {end.rss / MiB:.1f} MiB "
            f"(margin {rss_margin / MiB:.0f} MiB)"
        )
    overloaded_seen = sum(n for (_rpc, code), n in tally.answers.items()
                          if code == "RESOURCE_EXHAUSTED")  # fmt: skip
    peak_rss = max((s[1] for s in samples), default=end.rss)
    peak_fds = max((s[2] for s in samples), default=end.fds)
    return {
        "machine": machine_info(),
        "store": args.store,
        "minutes": args.minutes,
        "elapsed_s": round(elapsed, 1),
        "load": {k: getattr(args, k) for k in ("processes", "channels", *LOOP_KNOBS)},
        "server_args": args.troth_arg,
        "server_cpu_share": round(server_cpu, 2),
        "answers_per_second": round(tally.total() / elapsed, 1) if elapsed else None,
        "ok_per_second": round(codes["OK"] / elapsed, 1) if elapsed else None,
        "by_code": dict(codes),
        "by_rpc": {f"{rpc} {code}": n for (rpc, code), n in sorted(tally.answers.items())},
        "dropped_streams": dict(tally.dropped),
        "deliveries": tally.deliveries,
        "events": tally.events,
        "resource_exhausted_seen": overloaded_seen,
        "server_refused_total": refused,
        "start": _resources(start),
        "end": _resources(end),
        "peak_under_load": {"rss_mib": round(peak_rss / MiB, 1), "fds": peak_fds},
        "samples": [
            {"t_s": round(t), "rss_mib": round(r / MiB, 1), "fds": f, "server_cpu": round(c, 2)}
            for t, r, f, c in samples
        ],
        "failures": failures,
    }


def _resources(r: Resources) -> dict[str, Any]:
    return {"rss_mib": round(r.rss / MiB, 1), "fds": r.fds, "client_connections": r.clients,
            "database_fds": r.database, "other_fds": r.other}  # fmt: skip


def print_report(result: dict[str, Any]) -> None:
    print(f"soak on {result['store']}: {result['elapsed_s']} s, load {result['load']}, "
          f"server args {result['server_args'] or '(defaults)'}")  # fmt: skip
    print(f"machine: {result['machine']}")
    rows = [[key, str(n)] for key, n in result["by_rpc"].items()]
    print(table(["rpc code", "answers"], rows))
    print(f"answers per code: {result['by_code']}")
    print(f"answers/s {fmt(result['answers_per_second'], ',.0f')}, "
          f"OK/s {fmt(result['ok_per_second'], ',.0f')}, "
          f"server CPU {result['server_cpu_share']:.0%} of a core")  # fmt: skip
    print(
        f"streams dropped by the soak: {result['dropped_streams']}; "
        f"tasks delivered {result['deliveries']:,}; events {result['events']:,}"
    )
    seen = result["resource_exhausted_seen"]
    counted = sum(result["server_refused_total"].values())
    print(f"RESOURCE_EXHAUSTED seen by clients {seen:,}; refusals the server counted meanwhile "
          f"{counted:,} {result['server_refused_total']}")  # fmt: skip
    s, e, p = result["start"], result["end"], result["peak_under_load"]

    def row(name: str, r: dict[str, Any]) -> list[str]:
        return [name, f"{r['rss_mib']:.1f}", str(r["fds"]), str(r.get("client_connections", "")),
                str(r.get("database_fds", "")), str(r.get("other_fds", ""))]  # fmt: skip

    print(table(
        ["", "rss MiB", "fds", "of which clients", "database", "other"],
        [row("start (quiet)", s), row("end (quiet)", e), row("peak under load", p)],
    ))  # fmt: skip
    for failure in result["failures"]:
        print(f"FAIL {failure}")
    if not result["failures"]:
        print("PASS no leak, no UNKNOWN/INTERNAL/CANCELLED answer")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="soak length (10)")
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds of warm-up (20)")
    parser.add_argument("--in-flight", type=int, default=3000, help="unary loops (3000)")
    parser.add_argument("--channels", type=int, default=8,
                        help="connections the unary loops of each process share (8)")  # fmt: skip
    parser.add_argument("--processes", type=int, default=2, help="load processes (2)")
    parser.add_argument("--pollers", type=int, default=40, help="Poll stream loops (40)")
    parser.add_argument("--watchers", type=int, default=100, help="WatchPromise loops (100)")
    parser.add_argument("--event-watchers", type=int, default=4, help="WatchPromises loops (4)")
    parser.add_argument("--sample", type=float, default=10.0, help="seconds between samples")
    parser.add_argument(
        "--troth-arg",
        action="append",
        default=[],
        help="a `troth serve` argument, e.g. --troth-arg=--max-streams=9",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the server's log (kept on FAIL)")
    args = parser.parse_args(argv)
    try:
        result = soak(args)
    except ServerError as exc:
        log(f"soak: {exc}")
        return 2
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_report(result)
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
