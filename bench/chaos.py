"""The chaos soak: workers, servers and faults against troth's promises for N minutes, then a check.

    python bench/chaos.py --minutes 30 --seed 7 --store postgres

Several worker processes and one server (SQLite) or two replicas (PostgreSQL,
a private cluster the run starts and restarts); a load generator starting
human-in-the-loop and multi-step workflows and settling at random times; a
fault injector (SIGKILL, SIGSTOP/SIGCONT of workers and servers, PostgreSQL
restarts, clock jumps and replica skew); a side-effect ledger; and a checker
reading everything back through the public API. See bench/README.md
("Chaos") for how to read the output; the last line is ``anomalies: N`` and
the exit status is 1 when N > 0. The harness lives in ``bench/_chaos/``.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _chaos.run import Config, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=1.0, help="length of the run (default 1)")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one, printed")
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--lease", type=float, default=6.0, help="workers' lease, seconds")
    parser.add_argument(
        "--processes", type=int, default=1, help="server processes per replica (default 1)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1_000_000)
    total = args.minutes * 60.0
    drain = min(40.0, max(20.0, total * 0.3))
    config = Config(
        store=args.store,
        seed=seed,
        load_s=max(5.0, total - drain),
        drain_s=drain,
        workers=args.workers,
        lease_s=args.lease,
        processes=args.processes,
        keep=args.keep,
        out=sys.stderr,
    )
    print(f"seed: {seed}", file=sys.stderr, flush=True)
    report = run(config)
    print("\n".join(report.lines()), flush=True)
    return 1 if report.anomalies else 0


if __name__ == "__main__":
    sys.exit(main())
