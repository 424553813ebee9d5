"""A gauge of the machine's speed while a benchmark runs: for A/Bs of a few per cent.

On the shared VMs this project is measured on, the same pure-Python work takes
28-53 ms of CPU from one second to the next on an idle machine (neighbours on
the host, not steal time, which reads 0): a cost per workflow then moves by
10-25 % between back-to-back runs of the same code, more than most levers
change it. `Gauge` runs a fixed piece of work in its own process every
`PERIOD_S` (about 3 % of one core) while the benchmark runs, and reports the
median CPU it took: a cost divided by it (`normalised`) is in "gauge units",
which move with the machine's speed as the benchmark's own work does.
"""

from __future__ import annotations

import signal
import statistics
import subprocess
import sys
from typing import Final

PERIOD_S: Final = 0.1
"""How often the gauge's work runs."""

_PROGRAM = f"""
import sys, time
def work():
    d = {{}}
    for i in range(20000):
        d[i % 1000] = str(i)
    return sorted(d.values())
samples = []
try:
    while True:
        started = time.process_time()
        work()
        samples.append(time.process_time() - started)
        time.sleep({PERIOD_S})
except KeyboardInterrupt:
    pass
print(" ".join(f"{{s * 1000:.4f}}" for s in samples), flush=True)
"""


class Gauge:
    """The gauge's process: start it with the phase, `stop()` it after; `ms` is the
    median CPU of its work (in ms), None before `stop()` or if it took no sample."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _PROGRAM], stdout=subprocess.PIPE, text=True
        )
        self.ms: float | None = None
        self.samples: list[float] = []

    def stop(self) -> float | None:
        self._proc.send_signal(signal.SIGINT)
        out, _ = self._proc.communicate(timeout=10)
        self.samples = [float(x) for x in out.split()]
        self.ms = statistics.median(self.samples) if self.samples else None
        return self.ms

    def normalised(self, cpu_ms: float) -> float | None:
        """`cpu_ms` in gauge units (one: the gauge's work, as long as it took here)."""
        return None if not self.ms else cpu_ms / self.ms
