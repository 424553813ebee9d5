"""The load generator: starts workflows and settles their approvals at random times.

Every call's answer goes to the journal's ``acks.jsonl`` (what the checker
holds the server to). A settle carries the generator's own idempotency key,
so a retry after a lost reply (a server killed mid-call) is recognised as the
same settle: a settle is ``applied`` when the promise comes back settled with
its key. Answers:

- ``applied``: this settle counted (the server acknowledged it);
- ``already_settled`` / ``timed_out`` / ``not_found``: refused, definitely;
- ``refused:<REASON>``: refused for another reason (e.g. ``WORKFLOW_SETTLED``);
- ``uncertain``: no answer after 45 s of retries; it may or may not have counted.

Settle plans (the brief's "twice, early, late, after timeout, cancels mid-step"):

- hitl ``normal``/``reject``: one resolve (reject) 1-6 s after the start;
- hitl ``twice``: two resolves with different values, on two replicas, at once;
- hitl ``early``: resolve with ``create_if_missing`` before the workflow waits
  (settle-before-wait on a named approval);
- hitl ``late``: resolve 8-20 s after the start;
- hitl ``timeout``: a 2-5 s approval, resolved twice (one per replica) around
  its expiry;
- hitl/multi ``cancel``: cancel the root 0.1-3 s after the start, mid-step;
- race: resolve one of its two approvals; the other is left waiting;
- multi ``forged``: before the start, anyone creates ``<wid>.0`` as if the
  step had run (``forge``); the step's side effect must still run;
- every ``cancel`` plan also creates a bystander, ``<wid>.invoice-<n>``, a
  promise of its own that only shares the prefix: it must outlive the cancel.

About one start in six is repeated later with other arguments (a new nonce):
the server refuses it (`refused:WORKFLOW_ALREADY_EXISTS` in the ack), and the
checker expects the first start's execution only.
"""

from __future__ import annotations

import heapq
import itertools
import random
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from troth import (
    AlreadySettledError,
    Client,
    DeadlineExceededError,
    NotFoundError,
    Promise,
    PromiseTimedOutError,
    ResourceExhaustedError,
    RpcError,
    UnavailableError,
)

if TYPE_CHECKING:
    from _chaos.journal import Journal

GROUP = "chaos"
ROOT_TTL = timedelta(hours=1)
BYSTANDER_TTL = timedelta(hours=2)
RUN_STEP_TAGS = {"troth:kind": "run", "troth:func": "effect"}
"""The tags a `ctx.run(effect, ...)` step carries (DESIGN §2 "Step")."""
LONG_GATE_S = 600.0
RETRY_S = 45.0
"""How long a start or settle is retried while the server is away (it is idempotent)."""
DECIDED = {"applied", "already_settled", "timed_out"}

HITL_PLANS = {
    "normal": 3,
    "reject": 1,
    "twice": 2,
    "early": 2,
    "late": 2,
    "timeout": 2,
    "cancel": 2,
}


@dataclass
class Workflow:
    """One workflow the generator started: what it is and where its approvals are."""

    wid: str
    kind: str
    plan: str
    args: list[Any]
    gates: list[str] = field(default_factory=list)


def transient(error: RpcError) -> bool:
    """Worth retrying: the server (or its store) was away, or the call ran out of time."""
    return isinstance(error, UnavailableError | DeadlineExceededError | ResourceExhaustedError)


def snapshot(client: Client, promise: Promise) -> dict[str, Any]:
    """What the checker needs of a promise read back through the public API."""

    def decode(payload: Any) -> Any:
        try:
            return client.decode(payload)
        except Exception:
            return repr(payload.data)

    return {
        "id": promise.id,
        "state": promise.state.name,
        "value": decode(promise.value),
        "param": decode(promise.param),
        "tags": dict(promise.tags),
        "expire_time": None if promise.expire_time is None else promise.expire_time.timestamp(),
        "settle_key": promise.idempotency_key_for_settle,
    }


class LoadGenerator:
    """Starts workflows at random, schedules their settles, records every answer."""

    def __init__(
        self, rng: random.Random, journal: Journal, addresses: list[str], tag: str
    ) -> None:
        self.rng = rng
        """The plan (main thread only, so a seed gives the same plan every time)."""
        self.pick = random.Random(rng.getrandbits(64))
        """Choices the calls make in the pool's threads (replicas, what to read)."""
        self.journal = journal
        self.tag = tag
        self.replicas = [Client(address, timeout=5.0) for address in addresses]
        self.client = Client(",".join(addresses), timeout=8.0)
        self.workflows: dict[str, Workflow] = {}
        self.answers: dict[str, list[str]] = defaultdict(list)
        self._lock = threading.Lock()
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="chaos-load")
        self._n = itertools.count()
        self._inflight = 0

    # ---------------------------------------------------------------- scheduling

    def _at(self, delay: float, action: Callable[[], None]) -> None:
        with self._lock:
            heapq.heappush(self._queue, (time.monotonic() + delay, next(self._seq), action))

    def _due(self, everything: bool = False) -> list[Callable[[], None]]:
        now = time.monotonic()
        due = []
        with self._lock:
            while self._queue and (everything or self._queue[0][0] <= now):
                due.append(heapq.heappop(self._queue)[2])
        return due

    def _submit(self, actions: list[Callable[[], None]]) -> None:
        for action in actions:
            with self._lock:
                self._inflight += 1
            self._pool.submit(self._guard, action)

    def _guard(self, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception as exc:  # a harness bug must show, not hang the run
            self.journal.ack(kind="error", error=repr(exc), t_sent=time.time())
        finally:
            with self._lock:
                self._inflight -= 1

    def run(self, seconds: float, interval: tuple[float, float] = (0.25, 0.7)) -> None:
        """Start workflows for `seconds`, running scheduled settles and random reads meanwhile."""
        end = time.monotonic() + seconds
        next_start = time.monotonic()
        while time.monotonic() < end:
            if time.monotonic() >= next_start:
                self.new_workflow()
                next_start = time.monotonic() + self.rng.uniform(*interval)
            if self.pick.random() < 0.1:
                self._submit([self.observe])
            self._submit(self._due())
            time.sleep(0.05)

    def finish_scheduled(self, timeout: float) -> None:
        """Run every settle still scheduled, now, and wait for all calls in flight."""
        deadline = time.monotonic() + timeout
        while True:
            self._submit(self._due(everything=True))
            with self._lock:
                idle = self._inflight == 0 and not self._queue
            if idle or time.monotonic() > deadline:
                break
            time.sleep(0.1)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        for client in [*self.replicas, self.client]:
            client.close()

    # ---------------------------------------------------------------- workflows

    def _nonce(self) -> str:
        return f"{self.rng.getrandbits(32):08x}"

    def new_workflow(self) -> Workflow:
        rng = self.rng
        n = next(self._n)
        kind = rng.choices(["hitl", "multi", "race"], weights=[5, 3, 2])[0]
        wid = f"{self.tag}-{kind}-{n}"
        sleep_s = round(rng.uniform(0.1, 0.8), 3)
        if kind == "hitl":
            plan = rng.choices(list(HITL_PLANS), weights=list(HITL_PLANS.values()))[0]
            named = plan == "early" or rng.random() < 0.5
            gate = f"appr-{wid}" if named else f"{wid}.1"
            timeout = round(rng.uniform(2.0, 5.0), 3) if plan == "timeout" else LONG_GATE_S
            flow = Workflow(
                wid, kind, plan, [self._nonce(), gate if named else "", timeout, sleep_s]
            )
            flow.gates = [gate]
        elif kind == "multi":
            plan = rng.choices(["none", "cancel", "forged"], weights=[7, 2, 1])[0]
            flow = Workflow(wid, kind, plan, [self._nonce(), rng.randint(3, 6), sleep_s])
        else:
            plan = "one"
            flow = Workflow(wid, kind, plan, [self._nonce(), LONG_GATE_S, sleep_s])
            flow.gates = [f"{wid}.0", f"{wid}.1"]
        self.workflows[wid] = flow
        self._schedule(flow, sleep_s)
        return flow

    def _schedule(self, flow: Workflow, sleep_s: float) -> None:
        rng, wid = self.rng, flow.wid
        if flow.plan == "forged":
            self._at(0.0, lambda: self.forge(flow, then_start=True))
        else:
            start_delay = rng.uniform(0.0, 0.3) if flow.plan == "early" else 0.0
            self._at(start_delay, lambda: self.start(flow, flow.args))
        if rng.random() < 0.15:
            again = [self._nonce(), *flow.args[1:]]
            self._at(rng.uniform(0.5, 3.0), lambda: self.start(flow, again, repeat=True))
        value = {"v": f"{flow.plan}-{self._nonce()}"}
        plan = flow.plan
        if flow.kind == "race":
            k = rng.randint(0, 1)
            won = {"gate": k, "v": value["v"]}
            self._at(rng.uniform(1, 6), lambda: self.settle("resolve", flow.gates[k], won, wid))
        elif plan in ("normal", "reject"):
            action = "resolve" if plan == "normal" else "reject"
            self._at(rng.uniform(1, 6), lambda: self.settle(action, flow.gates[0], value, wid))
        elif plan == "twice":
            other = {"v": f"twice-{self._nonce()}"}
            when = rng.uniform(1, 6)
            self._at(when, lambda: self.settle("resolve", flow.gates[0], value, wid, replica=0))
            then = when + rng.uniform(0, 0.05)
            self._at(then, lambda: self.settle("resolve", flow.gates[0], other, wid, replica=1))
        elif plan == "early":
            self._at(0.0, lambda: self.settle("resolve", flow.gates[0], value, wid, early=True))
        elif plan == "late":
            self._at(rng.uniform(8, 20), lambda: self.settle("resolve", flow.gates[0], value, wid))
        elif plan == "timeout":
            expiry = sleep_s + float(flow.args[2])
            for replica in (0, 1):
                mine = {"v": f"timeout-{replica}-{self._nonce()}"}
                self._at(expiry + rng.uniform(-0.5, 2.0),
                         lambda r=replica, v=mine: self.settle(  # type: ignore[misc]
                             "resolve", flow.gates[0], v, wid, replica=r))  # fmt: skip
        if plan == "cancel":
            self._at(rng.uniform(0.1, 3.0), lambda: self.settle("cancel", wid, None, wid))
            self._at(0.05, lambda: self.bystander(flow))

    # ---------------------------------------------------------------- calls

    def start(self, flow: Workflow, args: list[Any], repeat: bool = False) -> None:
        t_sent = time.time()
        result = "uncertain"
        error = ""
        deadline = time.monotonic() + RETRY_S
        for attempt in itertools.count():
            client = self.client if attempt else self.pick.choice(self.replicas)
            try:
                client.start(flow.kind, *args, id=flow.wid, group=GROUP, ttl=ROOT_TTL)
                result = "ok"
                break
            except RpcError as exc:
                error = f"{type(exc).__name__}: {exc}"
                if not transient(exc):
                    result = f"refused:{getattr(exc, 'reason', None) or type(exc).__name__}"
                    break
                if time.monotonic() > deadline:
                    break
                time.sleep(0.5)
        self.journal.ack(kind="start", wid=flow.wid, workflow=flow.kind, plan=flow.plan,
                         args=args, gates=flow.gates, repeat=repeat, result=result,
                         error=error, t_sent=t_sent)  # fmt: skip

    def forge(self, flow: Workflow, *, then_start: bool = False) -> None:
        """Before the start, create `<wid>.0` as a finished `run` step of `effect` (with
        the value the step would return), as anyone could: DESIGN §4 rule 13 says
        nobody but the worker holding the root's task may write it."""
        step, t_sent, result = f"{flow.wid}.0", time.time(), "created"
        try:
            self.client.create(step, tags=RUN_STEP_TAGS, ttl=ROOT_TTL)
            self.client.resolve(step, "s0")
        except RpcError as exc:
            result = f"refused:{getattr(exc, 'reason', None) or type(exc).__name__}"
        self.journal.ack(kind="forge", id=step, wid=flow.wid, result=result, t_sent=t_sent)
        if then_start:
            self.start(flow, flow.args)

    def bystander(self, flow: Workflow) -> None:
        """A promise of its own whose id merely starts with `<wid>.` (DESIGN §4 rule 13):
        nobody settles it, so it must stay PENDING with the expiry it was given, through
        the cancel of `<wid>`, which is what the checker holds the server to."""
        pid, t_sent = f"{flow.wid}.invoice-{self._nonce()}", time.time()
        result, expire = "uncertain", None
        try:
            created = self.client.create(pid, {"bystander": True}, ttl=BYSTANDER_TTL)
            result = "ok"
            expire_time = created.promise.expire_time
            expire = None if expire_time is None else expire_time.timestamp()
        except RpcError:
            pass
        self.journal.ack(kind="create", id=pid, wid=flow.wid, result=result, expire_time=expire,
                         ttl_s=BYSTANDER_TTL.total_seconds(), t_sent=t_sent)  # fmt: skip

    def settle(
        self,
        action: str,
        pid: str,
        value: Any,
        wid: str,
        *,
        replica: int | None = None,
        early: bool = False,
        key: str | None = None,
        not_found_until: float | None = None,
    ) -> None:
        key = key or uuid.uuid4().hex
        if not_found_until is None:
            not_found_until = time.monotonic() + 30.0
        t_sent = time.time()
        result, error = "uncertain", ""
        deadline = time.monotonic() + RETRY_S
        for attempt in itertools.count():
            if attempt:
                client = self.client
            elif replica is not None:
                client = self.replicas[replica % len(self.replicas)]
            else:
                client = self.pick.choice(self.replicas)
            try:
                if action == "cancel":
                    done = client.cancel(pid, value, idempotency_key=key)
                else:
                    method = client.resolve if action == "resolve" else client.reject
                    done = method(pid, value, idempotency_key=key, create_if_missing=early)
                mine = done.applied or done.promise.idempotency_key_for_settle == key
                result = "applied" if mine else "already_settled"
                break
            except AlreadySettledError:
                result = "already_settled"
                break
            except PromiseTimedOutError:
                result = "timed_out"
                break
            except NotFoundError:
                if time.monotonic() < not_found_until:
                    self._at(0.5, lambda: self.settle(action, pid, value, wid, replica=replica,
                                                      early=early, key=key,
                                                      not_found_until=not_found_until))  # fmt: skip
                    return
                result = "not_found"
                break
            except RpcError as exc:
                error = f"{type(exc).__name__}: {exc}"
                if not transient(exc):
                    result = f"refused:{getattr(exc, 'reason', None) or type(exc).__name__}"
                    break
                if time.monotonic() > deadline:
                    break
                time.sleep(0.5)
        with self._lock:
            self.answers[pid].append(result)
        self.journal.ack(kind="settle", action=action, id=pid, wid=wid, value=value, key=key,
                         early=early, result=result, error=error, t_sent=t_sent)  # fmt: skip

    def observe(self) -> None:
        """Read a random root or approval from a random replica; record it if settled."""
        with self._lock:
            flows = list(self.workflows.values())
        if not flows:
            return
        flow = self.pick.choice(flows)
        pid = self.pick.choice([flow.wid, *flow.gates])
        client = self.pick.choice(self.replicas)
        try:
            promise = client.get(pid)
        except RpcError:
            return
        if promise.is_settled:
            self.journal.ack(kind="read", t_sent=time.time(), **snapshot(client, promise))

    # ---------------------------------------------------------------- the end

    def settle_the_rest(self) -> int:
        """Resolve every approval nothing decided yet, so every workflow can finish."""
        count = 0
        for flow in list(self.workflows.values()):
            if "applied" in self.answers.get(flow.wid, []):
                continue  # cancelled
            answers = [a for gate in flow.gates for a in self.answers.get(gate, [])]
            if flow.gates and not DECIDED & set(answers):
                gate = flow.gates[0]
                value = {"gate": 0, "v": "drain"} if flow.kind == "race" else {"v": "drain"}
                self._at(0.0, lambda g=gate, v=value, w=flow.wid: self.settle(  # type: ignore[misc]
                    "resolve", g, v, w))  # fmt: skip
                count += 1
        return count

    def unsettled_roots(self) -> list[str]:
        """Roots not settled yet (read through the failover client)."""
        waiting = []
        for wid in list(self.workflows):
            try:
                if not self.client.get(wid).is_settled:
                    waiting.append(wid)
            except NotFoundError:
                pass  # never started (its start is not acknowledged; the checker knows)
            except RpcError:
                waiting.append(wid)
        return waiting

    def read_back(self) -> dict[str, dict[str, Any]]:
        """Every root, step and approval of the run, as the public API shows them now."""
        found: dict[str, dict[str, Any]] = {}
        for flow in self.workflows.values():
            for pid in [flow.wid, *flow.gates]:
                try:
                    found[pid] = snapshot(self.client, self.client.get(pid))
                except NotFoundError:
                    pass
            for promise in self.client.search_all(f"{flow.wid}.*"):
                found[promise.id] = snapshot(self.client, promise)
        return found
