"""One phase of load: threads running cycles until a deadline (stdlib only, so that
both the benchmark and `_dbos_app.py`, in DBOS's own environment, use it)."""

from __future__ import annotations

import itertools
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any


def run_threads(
    cycle: Callable[[str, int], int], concurrency: int, duration: float
) -> dict[str, Any]:
    """`concurrency` threads each running cycles (`cycle(workflow_id, thread index)`,
    which returns the latency it measured, in ns) until `duration` is over; a summary
    with the fields of `_systems.Phase`."""
    prefix = uuid.uuid4().hex[:10]
    counter = itertools.count()
    latencies: list[int] = []
    errors: list[str] = []
    deadline = time.perf_counter() + duration

    def loop(slot: int) -> None:
        while time.perf_counter() < deadline:
            try:
                latencies.append(cycle(f"{prefix}-{next(counter)}", slot))
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    return summary(latencies, errors, elapsed)


def summary(latencies: list[int], errors: list[str], elapsed: float) -> dict[str, Any]:
    """A load run's figures: cycles completed, errors (and the first), p50 and p99 in ms
    (from latencies in ns), for either driver (threads here, `_aio_load`'s loop)."""
    ms = sorted(n / 1e6 for n in latencies)
    return {
        "completed": len(latencies),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "elapsed_s": elapsed,
        "p50_ms": statistics.median(ms) if ms else None,
        "p99_ms": ms[min(len(ms) - 1, int(0.99 * len(ms)))] if ms else None,
    }
