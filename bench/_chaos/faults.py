"""The fault injector: one random fault every 0.8-2.2 s, each in its own thread, all journaled.

Kinds (``KINDS``; the PostgreSQL-only ones are left out on SQLite):

- ``worker_kill``: SIGKILL a worker; a new worker process replaces it 0.3-2 s later;
- ``worker_stop``: SIGSTOP a worker for 0.5 s to 2 leases, then SIGCONT
  (a frozen worker thawed after its lease: DESIGN §2's stale deliveries);
- ``server_kill``: SIGKILL a server replica, restart it on its port 0.3-1.5 s later
  (``until`` is when it serves again: a loaded machine may take seconds more); a
  replica of several processes (``--processes``): SIGKILL one of them, which its
  supervisor restarts;
- ``server_stop``: SIGSTOP a server replica (of several processes: one of them) for
  0.3-2 s (shorter than a lease);
- ``pg_restart``: ``pg_ctl stop -m immediate`` of the private cluster, start 0.2-2 s later;
- ``clock_jump``: a replica's injected wall clock jumps by +30 s, +60 s or
  -10 min, for 2-8 s (interfaces.md §3);
- ``replica_skew``: the two replicas' clocks 5 s apart (+2.5 s / -2.5 s) for 3-10 s.

Server outages (kill + restart, stop, PostgreSQL restart) are meant to stay
under a worker's lease (6 s by default; heartbeats every third of it), though
a restart on a loaded machine may take longer (the journal's ``until`` says).
The checker excuses no rerun by a server fault either way: "an outage alone
never re-runs a step", even one longer than the lease (DESIGN §4 rule 6,
issue 9 item 3). A frozen worker, on the other hand, is frozen for up to two
leases, and a rerun after it is excused if it froze after the step began.

A target takes one fault at a time. `settle_down` stops injecting, waits for
the faults in progress, and leaves every process running and every clock true.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _chaos.journal import Journal
    from _chaos.procs import Fleet, PrivateCluster, ServerReplica, WorkerProcess

WORKER_KINDS = {"worker_kill": 3, "worker_stop": 3}
SERVER_KINDS = {"server_kill": 1, "server_stop": 1, "clock_jump": 1}
PG_KINDS = {"pg_restart": 2, "replica_skew": 1}
CLOCK_KINDS = ("clock_jump", "replica_skew")


class FaultInjector:
    def __init__(
        self,
        rng: random.Random,
        journal: Journal,
        servers: list[ServerReplica],
        cluster: PrivateCluster | None,
        fleet: Fleet,
        lease: float,
        interval: tuple[float, float] = (0.8, 2.2),
    ) -> None:
        self.rng = rng
        self.journal = journal
        self.servers = servers
        self.cluster = cluster
        self.fleet = fleet
        self.lease = lease
        self.interval = interval
        self.kinds = {**WORKER_KINDS, **SERVER_KINDS}
        if cluster is not None:
            self.kinds.update(PG_KINDS)
        if len(servers) < 2:
            self.kinds.pop("replica_skew", None)
        self.counts: Counter[str] = Counter()
        self._busy: set[str] = set()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._loop: threading.Thread | None = None

    # ---------------------------------------------------------------- the loop

    def start(self) -> None:
        self._loop = threading.Thread(target=self._run, name="chaos-faults", daemon=True)
        self._loop.start()

    def _run(self) -> None:
        while not self._stopping.wait(self.rng.uniform(*self.interval)):
            kind = self.rng.choices(list(self.kinds), weights=list(self.kinds.values()))[0]
            self.inject(kind)

    def inject(self, kind: str) -> bool:
        """Start one fault of `kind` on a random free target; False if none was free."""
        target, action = self._pick(kind)
        if action is None:
            return False
        rng = random.Random(self.rng.getrandbits(64))  # the fault's own: its thread's timing
        thread = threading.Thread(target=self._do, args=(kind, target, action, rng), daemon=True)
        self._threads.append(thread)
        thread.start()
        return True

    def _pick(self, kind: str) -> tuple[str, object]:
        with self._lock:
            if kind.startswith("worker_"):
                free = [w for w in self.fleet.alive() if w.name not in self._busy]
                if len(free) < 2:  # keep one worker untouched: the load must go on
                    return "", None
                worker = self.rng.choice(free)
                self._busy.add(worker.name)
                return worker.name, worker
            if kind in ("pg_restart", "replica_skew"):
                if "pg" in self._busy or any(s.name in self._busy for s in self.servers):
                    return "", None
                self._busy.update(["pg", *(s.name for s in self.servers)])
                return "pg", self.cluster
            free_servers = [s for s in self.servers if s.name not in self._busy]
            if not free_servers or "pg" in self._busy:
                return "", None
            server = self.rng.choice(free_servers)
            self._busy.add(server.name)
            return server.name, server

    def _do(self, kind: str, target: str, subject: object, rng: random.Random) -> None:
        try:
            getattr(self, f"_{kind}")(subject, rng)
            self.counts[kind] += 1
        except Exception as exc:
            self.journal.fault("harness_error", target, None, time.time(), error=repr(exc))
        finally:
            with self._lock:
                self._busy.discard(target)
                if target == "pg":
                    self._busy.difference_update(s.name for s in self.servers)

    # ---------------------------------------------------------------- the faults

    def _worker_kill(self, worker: WorkerProcess, rng: random.Random) -> None:
        t = time.time()
        worker.kill()
        self.journal.fault("worker_kill", worker.name, worker.pid, t)
        time.sleep(rng.uniform(0.3, 2.0))
        if not self._stopping.is_set():
            self.fleet.spawn()

    def _worker_stop(self, worker: WorkerProcess, rng: random.Random) -> None:
        duration = rng.uniform(0.5, 2.0 * self.lease)
        t = time.time()
        worker.proc.send_signal(signal.SIGSTOP)
        self._stopping.wait(duration)
        worker.proc.send_signal(signal.SIGCONT)
        self.journal.fault("worker_stop", worker.name, worker.pid, t, until=time.time())

    def _server_kill(self, server: ServerReplica, rng: random.Random) -> None:
        if server.processes > 1:  # one child; its supervisor restarts it
            t, pid = time.time(), rng.choice(server.children())
            os.kill(pid, signal.SIGKILL)
            try:
                server.wait_restarted(pid, 60.0)
            finally:
                self.journal.fault("server_kill", server.name, pid, t, until=time.time())
            return
        t, pid = time.time(), server.pid
        server.kill()
        time.sleep(rng.uniform(0.3, 1.5))
        try:
            server.start()
        finally:  # until: serving again
            self.journal.fault("server_kill", server.name, pid, t, until=time.time())

    def _server_stop(self, server: ServerReplica, rng: random.Random) -> None:
        duration = rng.uniform(0.3, 2.0)
        if server.processes > 1:  # one child
            t, pid = time.time(), rng.choice(server.children())
            os.kill(pid, signal.SIGSTOP)
            time.sleep(duration)
            os.kill(pid, signal.SIGCONT)
            self.journal.fault("server_stop", server.name, pid, t, until=time.time())
            return
        t = time.time()
        server.signal(signal.SIGSTOP)
        time.sleep(duration)
        server.signal(signal.SIGCONT)
        self.journal.fault("server_stop", server.name, server.pid, t, until=time.time())

    def _pg_restart(self, cluster: PrivateCluster, rng: random.Random) -> None:
        t = time.time()
        took = cluster.crash()
        time.sleep(rng.uniform(0.2, 2.0))
        took += cluster.start()
        cluster.restarts.append(took)
        self.journal.fault("pg_restart", "pg", None, t, until=time.time())

    def _clock_jump(self, server: ServerReplica, rng: random.Random) -> None:
        offset = rng.choice([30.0, 60.0, -600.0])
        t = time.time()
        server.set_clock(offset)
        self._stopping.wait(rng.uniform(2.0, 8.0))
        server.set_clock(0)
        self.journal.fault("clock_jump", server.name, server.pid, t, until=time.time(),
                           offset=offset)  # fmt: skip

    def _replica_skew(self, _cluster: object, rng: random.Random) -> None:
        t = time.time()
        self.servers[0].set_clock(2.5)
        self.servers[1].set_clock(-2.5)
        self._stopping.wait(rng.uniform(3.0, 10.0))
        for server in self.servers:
            server.set_clock(0)
        self.journal.fault("replica_skew", "replicas", None, t, until=time.time(), offset=5.0)

    # ---------------------------------------------------------------- the end

    def settle_down(self) -> None:
        """Stop injecting; wait for the faults in progress; every process up, clocks true."""
        self._stopping.set()
        if self._loop is not None:
            self._loop.join(30)
        for thread in self._threads:
            thread.join(60)
        if self.cluster is not None and not self.cluster.running:
            self.cluster.start()
        for server in self.servers:
            server.set_clock(0)
            server.signal(signal.SIGCONT)
            if not server.alive():
                server.start()
        for worker in self.fleet.alive():
            worker.proc.send_signal(signal.SIGCONT)
