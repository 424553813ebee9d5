"""The chaos checker (bench/_chaos/checker.py) on made-up runs: a clean run has no anomaly,
and each check fails on a deliberate violation of what it checks (a check that cannot fail
proves nothing). Pure: no server, no process."""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from _chaos import checker

T0 = 1_000_000.0
READ = T0 + 100


def _effects(wid: str, nonce: str, steps: list[str], pid: int = 100, t: float = T0) -> list[Any]:
    out = []
    for n, step in enumerate(steps):
        base = {"pid": pid, "wid": wid, "step": step, "nonce": nonce}
        out += [{**base, "phase": "begin", "t": t + n}, {**base, "phase": "end", "t": t + n + 0.5}]
    return out


def _start(wid: str, kind: str, args: list[Any], gates: list[str], **extra: Any) -> Any:
    return {"kind": "start", "wid": wid, "workflow": kind, "plan": "p", "args": args,
            "gates": gates, "repeat": False, "result": "ok", "t_sent": T0 - 1,
            "t_done": T0 - 0.9, **extra}  # fmt: skip


def _settle(pid: str, action: str, value: Any, key: str, result: str = "applied") -> Any:
    return {"kind": "settle", "action": action, "id": pid, "wid": pid.split(".")[0],
            "value": value, "key": key, "result": result, "t_sent": T0 + 5,
            "t_done": T0 + 5.1}  # fmt: skip


def _promise(pid: str, state: str, value: Any = None, param: Any = None, key: str = "") -> Any:
    return {"id": pid, "state": state, "value": value, "param": param, "tags": {},
            "expire_time": READ + 500, "settle_key": key}  # fmt: skip


def clean_run() -> checker.Run:
    hitl_args = ["n1", "", 600.0, 0.1]
    multi_args = ["n2", 2, 0.1]
    race_args = ["n3", 600.0, 0.1]
    cancel_args = ["n4", 3, 0.1]
    effects = [
        *_effects("w-h", "n1", ["prepare", "mail", "act"]),
        *_effects("w-m", "n2", ["s0"], pid=100),
        *_effects("w-m", "n2", ["s0", "s1"], pid=101, t=T0 + 10),  # s0 again: 100 was killed
        *_effects("w-r", "n3", ["mail", "act"]),
        *_effects("w-c", "n4", ["s0"], pid=102, t=T0 + 20),
        *_effects("w-c", "n4", ["s0"], pid=103, t=T0 + 30),  # again: 102 was frozen in it
    ]
    acks = [
        _start("w-h", "hitl", hitl_args, ["w-h.1"]),
        _start("w-m", "multi", multi_args, []),
        _start("w-m", "multi", ["other", 2, 0.1], [], repeat=True, t_sent=T0 + 1, t_done=T0 + 2),
        _start("w-r", "race", race_args, ["w-r.0", "w-r.1"]),
        _start("w-c", "multi", cancel_args, []),
        _settle("w-h.1", "resolve", {"v": "a"}, "k1"),
        _settle("w-h.1", "resolve", {"v": "b"}, "k1b", result="already_settled"),
        _settle("w-r.1", "resolve", {"gate": 1, "v": "b"}, "k2"),
        _settle("w-c", "cancel", None, "k3"),
        {
            "kind": "create",
            "id": "w-c.invoice-1",
            "wid": "w-c",
            "result": "ok",
            "expire_time": T0 + 7201,
            "ttl_s": 7200.0,
            "t_sent": T0 + 1,
            "t_done": T0 + 1,
        },  # a bystander
        {
            "kind": "read",
            "id": "w-h.1",
            "state": "RESOLVED",
            "value": {"v": "a"},
            "settle_key": "k1",
            "t_sent": T0 + 6,
            "t_done": T0 + 6,
        },
    ]
    faults = [
        {"kind": "worker_kill", "target": "worker-0", "pid": 100, "t": T0 + 0.7},
        {
            "kind": "worker_stop",
            "target": "worker-1",
            "pid": 102,
            "t": T0 + 20.2,
            "until": T0 + 29,
        },
        {"kind": "server_kill", "target": "server-0", "pid": 7, "t": T0 + 3},
    ]
    final = {
        "w-h": _promise("w-h", "RESOLVED", {"nonce": "n1", "decision": {"v": "a"}}, hitl_args),
        "w-h.0": _promise("w-h.0", "RESOLVED", "prepare"),
        "w-h.1": _promise("w-h.1", "RESOLVED", {"v": "a"}, key="k1"),
        "w-h.2": _promise("w-h.2", "RESOLVED", "mail"),
        "w-m": _promise("w-m", "RESOLVED", {"nonce": "n2", "steps": 2}, multi_args),
        "w-r": _promise(
            "w-r", "RESOLVED", {"nonce": "n3", "decision": {"gate": 1, "v": "b"}}, race_args
        ),
        "w-r.0": _promise("w-r.0", "REJECTED_CANCELED", {"reason": "workflow ended"}),
        "w-r.1": _promise("w-r.1", "RESOLVED", {"gate": 1, "v": "b"}, key="k2"),
        "w-c": _promise("w-c", "REJECTED_CANCELED", None, cancel_args, key="k3"),
        "w-c.invoice-1": {**_promise("w-c.invoice-1", "PENDING"), "expire_time": T0 + 7201},
    }
    return checker.Run(effects, acks, faults, final, READ)


def test_a_clean_run_has_no_anomaly() -> None:
    assert checker.check(clean_run()) == []


def _set(pid: str, **fields: Any) -> Callable[[checker.Run], None]:
    def change(run: checker.Run) -> None:
        run.final[pid].update(fields)

    return change


def _drop(pid: str) -> Callable[[checker.Run], None]:
    def change(run: checker.Run) -> None:
        del run.final[pid]

    return change


def _add_ack(record: Any) -> Callable[[checker.Run], None]:
    return lambda run: run.acks.append(record)


def _add_effects(*records: Any) -> Callable[[checker.Run], None]:
    return lambda run: run.effects.extend(records)


def _no_faults(run: checker.Run) -> None:
    run.faults.clear()


def _cancelled_named_gate(run: checker.Run) -> None:
    """A cancelled hitl workflow whose named approval (`appr-<wid>`) stays PENDING."""
    args = ["n5", "appr-w-x", 600.0, 0.1]
    run.acks.append(_start("w-x", "hitl", args, ["appr-w-x"]))
    run.acks.append(_settle("w-x", "cancel", None, "kx"))
    run.final["w-x"] = _promise("w-x", "REJECTED_CANCELED", None, args, key="kx")
    run.final["appr-w-x"] = _promise("appr-w-x", "PENDING")


def _bystander_capped(run: checker.Run) -> None:
    """The create answered with the root's expiry instead of the ttl asked for."""
    ack = next(a for a in run.acks if a["kind"] == "create")
    ack["expire_time"] = T0 + 3600
    run.final["w-c.invoice-1"]["expire_time"] = T0 + 3600


def _drop_step(step: str) -> Callable[[checker.Run], None]:
    def change(run: checker.Run) -> None:
        run.effects = [e for e in run.effects if e["step"] != step]

    return change


VIOLATIONS: dict[str, tuple[str, Callable[[checker.Run], None]]] = {
    # final_state
    "root left pending": ("final_state", _set("w-m", state="PENDING")),
    "root failed": ("final_state", _set("w-m", state="REJECTED", value={"error": "x"})),
    "too few steps": ("final_state", _set("w-m", value={"nonce": "n2", "steps": 1})),
    "cancel acked, root resolved": ("final_state", _set("w-c", state="RESOLVED")),
    "cancelled with no cancel": ("final_state", _set("w-m", state="REJECTED_CANCELED")),
    "decision not the approval's": (
        "final_state", _set("w-h", value={"nonce": "n1", "decision": {"v": "zz"}})),
    "race decided by the other gate": (
        "final_state", _set("w-r", value={"nonce": "n3", "decision": {"gate": 0, "v": "b"}})),
    "step effect never ran": ("final_state", _drop_step("act")),
    # ack
    "started root gone": ("ack", _drop("w-m")),
    "approval value changed": ("ack", _set("w-h.1", value={"v": "zzz"})),
    "approval settled by another key": ("ack", _set("w-h.1", settle_key="other")),
    "two settles applied": ("ack", _add_ack(_settle("w-h.1", "resolve", {"v": "c"}, "k9"))),
    "timed out, then resolved": (
        "ack", _add_ack(_settle("w-h.1", "resolve", {"v": "d"}, "k8", result="timed_out"))),
    "refused settle counted": ("ack", _set("w-h.1", settle_key="k1b", value={"v": "b"})),
    "bystander cancelled with the root": ("ack", _set("w-c.invoice-1", state="REJECTED_CANCELED")),
    "bystander's ttl cut later": ("ack", _set("w-c.invoice-1", expire_time=T0 + 3600)),
    "bystander's ttl cut at once": ("ack", _bystander_capped),
    "settled read changes": ("ack", _add_ack(
        {"kind": "read", "id": "w-r.1", "state": "REJECTED_TIMEDOUT", "value": None,
         "settle_key": "", "t_sent": T0 + 7, "t_done": T0 + 7})),
    # repeat
    "rerun with nobody killed": ("repeat", _no_faults),
    "rerun by the same live process": ("repeat", _add_effects(*_effects("w-h", "n1", ["mail"],
                                                                        t=T0 + 50))),
    "kill after the rerun": ("repeat", lambda run: run.faults[0].update(t=T0 + 99)),
    "frozen only before it ran": (
        "repeat", lambda run: run.faults[1].update(t=T0 + 10, until=T0 + 19.9)),
    # pending_past_expiry
    "pending past expiry": (
        "pending_past_expiry", _set("w-h.1", state="PENDING", expire_time=READ - 60,
                                    settle_key="", value=None)),
    # one_execution
    "a step of the second start": (
        "one_execution", _add_effects(*_effects("w-m", "other", ["s2"], pid=101, t=T0 + 40))),
    "root param of the second start": ("one_execution", _set("w-m", param=["other", 2, 0.1])),
    "root value of another execution": (
        "one_execution", _set("w-m", value={"nonce": "other", "steps": 2})),
    # pending_under_settled_root
    "gate left waiting after ctx.any": ("pending_under_settled_root",
                                        _set("w-r.0", state="PENDING", value=None)),
    "named gate left waiting after cancel": ("pending_under_settled_root", _cancelled_named_gate),
    # harness
    "harness exception": ("harness", _add_ack({"kind": "error", "error": "boom", "t_sent": 0})),
}  # fmt: skip


@pytest.mark.parametrize("name", VIOLATIONS)
def test_each_check_fails_on_a_violation_of_it(name: str) -> None:
    check, violate = VIOLATIONS[name]
    run = copy.deepcopy(clean_run())
    violate(run)
    found = checker.check(run)
    assert check in {a.check for a in found}, (name, found)


def test_every_check_has_a_violation() -> None:
    assert {check for check, _ in VIOLATIONS.values()} == set(checker.CHECKS)


def test_runs_pair_begins_with_ends_of_the_same_process() -> None:
    runs = checker.runs_of(_effects("w", "n", ["s"], pid=1) + _effects("w", "n", ["s"], pid=2,
                                                                         t=T0 + 5))  # fmt: skip
    assert [(r["pid"], r["end"]) for r in runs[("w", "s")]] == [(1, T0 + 0.5), (2, T0 + 5.5)]


def test_the_journal_reads_back_whole_lines_and_skips_a_torn_last_one(tmp_path: Path) -> None:
    from _chaos import journal

    path = tmp_path / "effects.jsonl"
    journal.append(path, {"pid": 1, "step": "s0"})
    journal.append(path, {"pid": 2, "step": "s1"})
    with path.open("a") as file:
        file.write('{"pid": 3, "st')  # a writer killed mid-line
    assert journal.read(path) == [{"pid": 1, "step": "s0"}, {"pid": 2, "step": "s1"}]
