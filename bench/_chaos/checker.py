"""The checker: the journal of a run and what the public API reads back -> anomalies. Pure.

Inputs are plain records (see `journal` and `load.snapshot`): the side-effect
ledger, the load generator's acknowledged answers, the faults, and a snapshot
of every root, step and approval read back at the end (``final``, by id, read
from ``read_time`` on). Each check is one function; `check` runs them all.

CHECKS:

- ``final_state``: every workflow reached the final state its settles imply
  (an applied cancel -> ``REJECTED_CANCELED``; else ``RESOLVED`` with the
  value its kind implies from its approvals' final states, and every step's
  side effect ran to its end at least once: a forged checkpoint shows here);
- ``ack``: no acknowledged write lost or changed: a started root exists; an
  applied settle is the promise's settlement (state, value, key); at most one
  settle of a promise is applied; a ``TIMED_OUT`` answer means the promise
  ends ``REJECTED_TIMEDOUT``; a refused settle is not the one that counted; a
  promise read settled during the run reads the same at the end; a promise
  created on its own (a bystander whose id merely starts with ``<wid>.``) and
  never settled is still ``PENDING`` with the expiry it was given;
- ``repeat``: a step's side effect ran again only if the process that ran it
  before was SIGKILLed after it began (and before the rerun), or was frozen
  (SIGSTOP) at some time between its begin and the rerun: it lost its lease
  while the function ran or before it could record the result, which no one
  can tell from a death (DESIGN §4 rule 6). A process frozen only *before* it
  began (a stale delivery run after the thaw) excuses nothing, nor does any
  server outage (they are shorter than a lease);
- ``pending_past_expiry``: nothing ``PENDING`` past its ``expire_time`` plus
  one sweep (and a margin);
- ``one_execution``: every side effect and the root's param and value carry
  the nonce of the first start of the workflow id;
- ``pending_under_settled_root``: no step of a settled root is ``PENDING``
  (DESIGN §4 rules 10, 11);
- ``harness``: the harness itself failed (an exception in a load or fault
  thread): a run with it proves nothing.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

CHECKS = (
    "final_state",
    "ack",
    "repeat",
    "pending_past_expiry",
    "one_execution",
    "pending_under_settled_root",
    "harness",
)

STATE_OF = {"resolve": "RESOLVED", "reject": "REJECTED", "cancel": "REJECTED_CANCELED"}
STEPS = {"hitl": ("prepare", "mail", "act"), "race": ("mail", "act")}


@dataclass(frozen=True)
class Anomaly:
    check: str
    subject: str
    detail: str

    def __str__(self) -> str:
        return f"{self.check}: {self.subject}: {self.detail}"


@dataclass
class Run:
    """Everything the checker reads."""

    effects: list[dict[str, Any]]
    acks: list[dict[str, Any]]
    faults: list[dict[str, Any]]
    final: dict[str, dict[str, Any]]
    read_time: float
    sweep_s: float = 0.2
    margin_s: float = 3.0
    expiry_slack_s: float = 0.0
    """Extra allowance for expiry: a wall clock jumped back reports expire times early."""

    def starts(self) -> dict[str, list[dict[str, Any]]]:
        found: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for ack in self.acks:
            if ack.get("kind") == "start":
                found[ack["wid"]].append(ack)
        for records in found.values():
            records.sort(key=lambda a: a["t_sent"])
        return found

    def settles(self) -> dict[str, list[dict[str, Any]]]:
        found: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for ack in self.acks:
            if ack.get("kind") == "settle":
                found[ack["id"]].append(ack)
        return found


def check(run: Run) -> list[Anomaly]:
    """Every anomaly of the run, check by check."""
    return [
        *check_final_state(run),
        *check_acks(run),
        *check_repeats(run),
        *check_expiry(run),
        *check_one_execution(run),
        *check_pending_under_settled_root(run),
        *check_harness(run),
    ]


def _first(records: list[dict[str, Any]]) -> dict[str, Any]:
    return next((r for r in records if not r.get("repeat")), records[0])


def _ended_steps(run: Run, wid: str) -> set[str]:
    return {e["step"] for e in run.effects if e["wid"] == wid and e["phase"] == "end"}


def _nonce(promise: dict[str, Any] | None, field: str) -> Any:
    if promise is None:
        return None
    data = promise.get(field)
    if field == "param":
        return data[0] if isinstance(data, list) and data else None
    return data.get("nonce") if isinstance(data, dict) else None


# --------------------------------------------------------------------------- final_state


def check_final_state(run: Run) -> list[Anomaly]:
    found = []
    settles = run.settles()
    for wid, starts in run.starts().items():
        root = run.final.get(wid)
        if root is None:
            continue  # `ack` reports a lost start; a start never acknowledged may be absent
        cancels = settles.get(wid, [])
        applied = [c for c in cancels if c["result"] == "applied"]
        uncertain = any(c["result"] == "uncertain" for c in cancels)
        state = root["state"]
        if applied:
            if state != "REJECTED_CANCELED":
                found.append(Anomaly("final_state", wid, f"cancel acknowledged, root is {state}"))
            continue
        if state == "REJECTED_CANCELED":
            if not uncertain:
                found.append(Anomaly("final_state", wid, "cancelled, but no cancel counted"))
            continue
        if state != "RESOLVED":
            found.append(Anomaly("final_state", wid, f"root is {state} ({root['value']!r})"))
            continue
        first = _first(starts)
        problem = _resolved_problem(run, first, root)
        if problem:
            found.append(Anomaly("final_state", wid, problem))
    return found


def _resolved_problem(run: Run, start: dict[str, Any], root: dict[str, Any]) -> str:
    """Why a resolved root's value or side effects do not follow from its approvals ("" if ok)."""
    kind, wid, value = start["workflow"], start["wid"], root["value"]
    if not isinstance(value, dict):
        return f"root value {value!r} is not the workflow's result"
    ended = _ended_steps(run, wid)
    if kind == "multi":
        steps = int(root["param"][1]) if isinstance(root["param"], list) else -1
        if value.get("steps") != steps:
            return f"root value {value!r}, expected {steps} steps"
        missing = [f"s{n}" for n in range(steps) if f"s{n}" not in ended]
    else:
        gates = [run.final.get(g) for g in start["gates"]]
        hitl = kind == "hitl"
        problem = _hitl_problem(value, gates[0]) if hitl else _race_problem(value, gates)
        if problem:
            return problem
        missing = [s for s in STEPS[kind] if s not in ended]
    if missing:
        return f"resolved, but the side effects of {missing} never ran to their end"
    return ""


def _hitl_problem(value: dict[str, Any], gate: dict[str, Any] | None) -> str:
    if gate is None:
        return "resolved, but its approval does not exist"
    state = gate["state"]
    if state == "RESOLVED" and value.get("decision") == gate["value"] and "decision" in value:
        return ""
    if state == "REJECTED" and "rejected" in value and value["rejected"] == gate["value"]:
        return ""
    if state == "REJECTED_TIMEDOUT" and value.get("timedout") is True:
        return ""
    return (
        f"root value {value!r} does not follow from approval {gate['id']} {state} {gate['value']!r}"
    )


def _race_problem(value: dict[str, Any], gates: list[dict[str, Any] | None]) -> str:
    decision = value.get("decision")
    k = decision.get("gate") if isinstance(decision, dict) else None
    if k not in (0, 1):
        return f"root value {value!r} names no approval"
    gate = gates[k]
    if gate is None or gate["state"] != "RESOLVED" or gate["value"] != decision:
        shown = None if gate is None else (gate["state"], gate["value"])
        return f"root decided {decision!r}, but approval {k} is {shown!r}"
    return ""


# --------------------------------------------------------------------------- ack


def check_acks(run: Run) -> list[Anomaly]:
    found = []
    for wid, starts in run.starts().items():
        if any(s["result"] == "ok" for s in starts) and wid not in run.final:
            found.append(Anomaly("ack", wid, "start acknowledged, root not found"))
    for pid, acks in run.settles().items():
        promise = run.final.get(pid)
        applied = [a for a in acks if a["result"] == "applied"]
        keys = {a["key"] for a in applied}
        if len(keys) > 1:
            found.append(Anomaly("ack", pid, f"{len(keys)} different settles were all applied"))
        for ack in applied:
            want = STATE_OF[ack["action"]]
            if promise is None:
                found.append(Anomaly("ack", pid, f"{ack['action']} acknowledged, promise gone"))
            elif promise["state"] != want or promise["settle_key"] != ack["key"]:
                found.append(Anomaly("ack", pid, f"{ack['action']} {ack['value']!r} acknowledged "
                                     f"at {ack['t_done']:.3f}, promise is {promise['state']} "
                                     f"{promise['value']!r}"))  # fmt: skip
            elif ack["action"] != "cancel" and promise["value"] != ack["value"]:
                found.append(Anomaly("ack", pid, f"value {ack['value']!r} acknowledged, "
                                     f"promise holds {promise['value']!r}"))  # fmt: skip
        if promise is None:
            continue
        timed_out = [a for a in acks if a["result"] == "timed_out"]
        if timed_out and promise["state"] != "REJECTED_TIMEDOUT":
            found.append(Anomaly("ack", pid, f"answered TIMED_OUT at {timed_out[0]['t_done']:.3f}, "
                                 f"then {promise['state']} {promise['value']!r}"))  # fmt: skip
        for ack in acks:
            refused = ack["result"] in ("already_settled", "timed_out", "not_found")
            if refused and promise["settle_key"] == ack["key"]:
                found.append(Anomaly("ack", pid, f"answered {ack['result']}, yet this settle "
                                     "is the one that counted"))  # fmt: skip
            if ack["result"] == "already_settled" and promise["state"] == "PENDING":
                found.append(Anomaly("ack", pid, "answered ALREADY_SETTLED, still PENDING"))
    for ack in run.acks:
        if ack.get("kind") == "create" and ack["result"] == "ok":
            promise = run.final.get(ack["id"])
            now = None if promise is None else (promise["state"], promise["expire_time"])
            asked = ack["t_sent"] + ack.get("ttl_s", 0) - 60 - run.expiry_slack_s
            if ack["expire_time"] is not None and ack["expire_time"] < asked:
                given = ack["expire_time"] - ack["t_sent"]
                what = f"created with a ttl of {ack['ttl_s']:.0f} s, given {given:.0f} s"
                found.append(Anomaly("ack", ack["id"], what))
            if now != ("PENDING", ack["expire_time"]):
                what = f"created PENDING to expire at {ack['expire_time']}, never settled; now"
                found.append(Anomaly("ack", ack["id"], f"{what} {now!r}"))
        if ack.get("kind") != "read":
            continue
        promise = run.final.get(ack["id"])
        then = (ack["state"], ack["value"], ack["settle_key"])
        now = (
            None if promise is None else (promise["state"], promise["value"], promise["settle_key"])
        )
        if then != now:
            found.append(Anomaly("ack", ack["id"], f"read settled {then!r} at "
                                 f"{ack['t_done']:.3f}, now {now!r}"))  # fmt: skip
    return found


# --------------------------------------------------------------------------- repeat


def runs_of(effects: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The runs of each (workflow, step): ``{"pid", "begin", "end"}`` in begin order."""
    begins: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    ends: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for e in sorted(effects, key=lambda e: e["t"]):
        if e["phase"] == "begin":
            begins[(e["wid"], e["step"])].append({"pid": e["pid"], "begin": e["t"], "end": None})
        else:
            ends[(e["wid"], e["step"], e["pid"])].append(e["t"])
    for (wid, step), runs in begins.items():
        for run in runs:
            pending = ends.get((wid, step, run["pid"]))
            if pending:
                run["end"] = pending.pop(0)
    return begins


def _excuse(run: dict[str, Any], rerun_at: float, faults: list[dict[str, Any]]) -> str:
    """Why `run` may have been repeated at `rerun_at` ("" if nothing excuses it)."""
    for fault in faults:
        if fault.get("pid") != run["pid"]:
            continue
        if fault["kind"] == "worker_kill" and run["begin"] <= fault["t"] <= rerun_at:
            return "killed"
        frozen_from, frozen_until = fault["t"], fault.get("until", float("inf"))
        if (
            fault["kind"] == "worker_stop"
            and frozen_until >= run["begin"]
            and frozen_from <= rerun_at
        ):
            return "frozen between its begin and the rerun"
    return ""


def check_repeats(run: Run) -> list[Anomaly]:
    found = []
    for (wid, step), runs in runs_of(run.effects).items():
        for earlier, later in itertools.pairwise(runs):
            if not _excuse(earlier, later["begin"], run.faults):
                ended = "unfinished" if earlier["end"] is None else f"ended {earlier['end']:.3f}"
                found.append(Anomaly("repeat", f"{wid}/{step}", f"ran by pid {earlier['pid']} "
                                     f"at {earlier['begin']:.3f} ({ended}), again by pid "
                                     f"{later['pid']} at {later['begin']:.3f}, and pid "
                                     f"{earlier['pid']} was neither killed nor frozen "
                                     "in between"))  # fmt: skip
    return found


# --------------------------------------------------------------------------- expiry


def check_expiry(run: Run) -> list[Anomaly]:
    found = []
    allowance = run.sweep_s + run.margin_s + run.expiry_slack_s
    for pid, promise in run.final.items():
        expire = promise.get("expire_time")
        if (
            promise["state"] == "PENDING"
            and expire is not None
            and expire + allowance < run.read_time
        ):
            late = run.read_time - expire
            found.append(Anomaly("pending_past_expiry", pid, f"PENDING {late:.1f} s past expiry"))
    return found


# --------------------------------------------------------------------------- one_execution


def check_one_execution(run: Run) -> list[Anomaly]:
    found = []
    nonces: dict[str, set[str]] = defaultdict(set)
    for effect in run.effects:
        nonces[effect["wid"]].add(effect["nonce"])
    for wid, starts in run.starts().items():
        ok = [s for s in starts if s["result"] == "ok"]
        if not ok:
            continue
        acked = min(s["t_done"] for s in ok)
        allowed = {s["args"][0] for s in starts if s["t_sent"] <= acked}
        root = run.final.get(wid)
        param = _nonce(root, "param")
        if root is not None and param not in allowed:
            found.append(Anomaly("one_execution", wid, f"root param nonce {param!r}, first "
                                 f"start(s) {sorted(allowed)}"))  # fmt: skip
        seen = nonces.get(wid, set())
        if len(seen) > 1 or (root is not None and seen and seen != {param}):
            found.append(Anomaly("one_execution", wid, f"steps ran with nonces {sorted(seen)}, "
                                 f"root param {param!r}"))  # fmt: skip
        if root is not None and root["state"] == "RESOLVED" and _nonce(root, "value") != param:
            found.append(Anomaly("one_execution", wid, f"root value {root['value']!r} is not "
                                 f"of the execution {param!r}"))  # fmt: skip
    return found


# --------------------------------------------------------------------------- pending under root


def check_pending_under_settled_root(run: Run) -> list[Anomaly]:
    found = []
    others = {a["id"] for a in run.acks if a.get("kind") == "create"}  # own promises, not steps
    for wid, starts in run.starts().items():
        root = run.final.get(wid)
        if root is None or root["state"] == "PENDING":
            continue
        gates = set(_first(starts).get("gates") or [])
        for pid, promise in run.final.items():
            step = (pid.startswith(wid + ".") and pid not in others) or pid in gates
            if step and promise["state"] == "PENDING":
                found.append(Anomaly("pending_under_settled_root", pid,
                                     f"PENDING, its root {wid} is {root['state']}"))  # fmt: skip
    return found


# --------------------------------------------------------------------------- harness


def check_harness(run: Run) -> list[Anomaly]:
    return [
        Anomaly("harness", record.get("target") or "load", record.get("error", ""))
        for record in [*run.acks, *run.faults]
        if record.get("kind") in ("error", "harness_error")
    ]
