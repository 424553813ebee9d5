"""No request hurts another (DESIGN §4 rule 14): while the costliest schema check a
caller can construct is being resolved, over and over from several clients, the
health check and unrelated reads and writes each answer within 100 ms.

Before schema checks moved off the writer (and got a budget), one resolve of
`^(a+)+$` against 27 `a`s and a `!` stalled reads for 6-10 s and the health check
for 6 s; the checks below would never have finished.

The bound is a correctness bound of the issue, not a benchmark (bench/validation.py
measures cost). It must hold on a loaded 2-core machine shared with other test
runs, so it is asserted on the 99th percentile of many samples, not on the
worst one: a single sample can always lose the CPU to another process for longer
than 100 ms, which says nothing about troth. A regression (a check back on the
writer or on the event loop) moves the median and the p99 to whole seconds.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from troth.v1 import promises_pb2 as pb
from troth.v1 import promises_pb2_grpc
from troth.v1 import types_pb2 as types

if TYPE_CHECKING:
    from collections.abc import Callable

    from _support import ServerProcess

BOUND_MS = 100.0
SAMPLES = 150
ATTACKERS = 4
WINDOW_S = 100.0


def worst_schema() -> dict[str, Any]:
    """Each definition tries the next twice: 2**40 checks of any non-string, so
    every check runs until the step budget stops it (the costliest bounded check)."""
    defs: dict[str, Any] = {
        f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]}
        for i in range(40)
    }
    defs["d40"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def worst_value() -> types.Payload:
    """Close to the 1 MB value limit, so parsing it costs its most too."""
    data = json.dumps(list(range(130_000))).encode()
    assert len(data) < 1_048_576
    return types.Payload(headers={"content-type": "application/json"}, data=data)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Attack:
    """Clients resolving the worst pair in a loop until stopped; counts the answers."""

    def __init__(self, channel: grpc.Channel, promise_id: str) -> None:
        self._stub = promises_pb2_grpc.PromiseServiceStub(channel)
        self._request = pb.ResolvePromiseRequest(id=promise_id, value=worst_value())
        self._stop = threading.Event()
        self.answers: list[grpc.StatusCode] = []
        self._threads = [threading.Thread(target=self._run) for _ in range(ATTACKERS)]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._stub.ResolvePromise(self._request, timeout=60)
                self.answers.append(grpc.StatusCode.OK)
            except grpc.RpcError as error:
                self.answers.append(error.code())

    def __enter__(self) -> Attack:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(120)


def timed_ms(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return (time.perf_counter() - start) * 1000


@pytest.mark.timeout(240)  # each worst-case check runs seconds on a loaded machine
def test_health_reads_and_writes_answer_within_100ms_during_the_worst_check(
    server: ServerProcess,
) -> None:
    with server.channel() as channel, server.channel() as attack_channel:
        stub = promises_pb2_grpc.PromiseServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        target = f"worst-{uuid.uuid4().hex[:8]}"
        stub.CreatePromise(pb.CreatePromiseRequest(id=target, schema=json.dumps(worst_schema())))
        # One attack alone: the check is stopped by its budget, an answer, not a stall.
        with pytest.raises(grpc.RpcError) as caught:
            promises_pb2_grpc.PromiseServiceStub(attack_channel).ResolvePromise(
                pb.ResolvePromiseRequest(id=target, value=worst_value()), timeout=60
            )
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
        assert "--max-schema-steps" in (caught.value.details() or "")
        unrelated = f"unrelated-{uuid.uuid4().hex[:8]}"
        stub.CreatePromise(pb.CreatePromiseRequest(id=unrelated))

        def sample_all(i: int, into: dict[str, list[float]]) -> None:
            into["health"].append(
                timed_ms(lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=10))
            )
            into["read"].append(
                timed_ms(lambda: stub.GetPromise(pb.GetPromiseRequest(id=unrelated), timeout=10))
            )
            write = pb.CreatePromiseRequest(id=f"{unrelated}.w{i}")
            into["write"].append(timed_ms(lambda: stub.CreatePromise(write, timeout=10)))

        # The same calls without the attack first: what the machine gives right now.
        quiet: dict[str, list[float]] = {"health": [], "read": [], "write": []}
        for i in range(SAMPLES):
            sample_all(SAMPLES * 100 + i, quiet)
        latencies: dict[str, list[float]] = {"health": [], "read": [], "write": []}
        with Attack(attack_channel, target) as attack:
            started = len(attack.answers)
            deadline = time.monotonic() + WINDOW_S
            i = 0
            # Sample until several attacks were answered meanwhile (each check runs
            # seconds, to its budget), so that the whole window is under attack.
            while (i < SAMPLES or len(attack.answers) - started < ATTACKERS) and (
                time.monotonic() < deadline
            ):
                sample_all(i, latencies)
                i += 1
            during = len(attack.answers) - started
        # The attack ran all along: its checks were answered while we measured.
        assert during >= ATTACKERS, f"only {during} attacks answered while measuring"
        assert set(attack.answers) == {grpc.StatusCode.INVALID_ARGUMENT}, set(attack.answers)
        report = {
            kind: (
                statistics.median(values),
                percentile(values, 0.99),
                max(values),
                percentile(quiet[kind], 0.99),
            )
            for kind, values in latencies.items()
        }
        print(
            f"\nduring {during} worst-case checks ({ATTACKERS} clients), "
            f"{len(latencies['health'])} samples each, ms (median, p99, max; p99 without):"
        )
        for kind, (median, p99, worst, quiet_p99) in report.items():
            print(f"  {kind:6} {median:7.1f} {p99:7.1f} {worst:7.1f} {quiet_p99:7.1f}")
        for kind, (median, p99, _worst, quiet_p99) in report.items():
            # 100 ms, unless the machine alone (no attack, same calls, just before)
            # did not give that: then the attack may not make the p99 half again
            # worse. On an idle machine (CI) the first holds; on a dev box shared
            # by several test runs the p99 without any attack can exceed 100 ms.
            assert p99 < max(BOUND_MS, 1.5 * quiet_p99), (
                f"{kind} p99 {p99:.1f} ms (median {median:.1f}, p99 without the attack "
                f"{quiet_p99:.1f}): {report}"
            )
