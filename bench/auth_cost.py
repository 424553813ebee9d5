"""The cost of authentication on the hot path (issue 11): promise ops/s and HITL cycles/s
with authentication off, with a token-file token and with a JWT, in one run.

Each round runs every mode once, in turn (interleaved, so that a change in the
machine's load over the run falls on every mode alike), on a fresh SQLite database
(durable, `synchronous=FULL`) with the server's default settings:

- promise ops/s: 64 loops of raw grpc.aio calls (CreatePromise, then ResolvePromise
  of the same id), the bearer token in the metadata of each call;
- HITL cycles/s: the `hitl` workflow of bench/workflows.py (start, suspend on a
  latent promise, settle it by id, read the result) with one worker process, 64
  cycles in flight, `troth.Client` and `troth.Worker` sending the token
  (`TROTH_TOKEN`).

One principal, with the `admin` role, is used by the load, the clients and the
worker: every call pays the same verification (a cached token-file token is a dict
lookup after one scrypt check; a JWT is cached until its `exp` after one signature
check), which is what is measured.

Usage::

    .venv/bin/python bench/auth_cost.py [--rounds 5] [--duration 5] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import grpc.aio
import jwt
from _servers import BACKENDS, Cluster, log, machine_info, table
from _workflow_load import Harness, Notifications, hitl_cycle
from workflows import Settings, measure_phase

from troth.v1 import promises_pb2, promises_pb2_grpc, types_pb2
from troth_server.auth import mint

MODES = ("off", "token-file", "jwt")
IN_FLIGHT = 64


def credentials(root: Path) -> dict[str, tuple[tuple[str, ...], str | None]]:
    """mode -> (the server's auth arguments, the bearer token the callers send)."""
    minted = mint("bench-admin", ("admin",), (), ())
    tokens_file = root / "tokens.toml"
    tokens_file.write_text(minted.entry)
    secret = secrets.token_urlsafe(48)
    key_file = root / "jwt.key"
    key_file.write_text(secret)
    claims = {"sub": "bench-admin", "troth_roles": ["admin"], "exp": int(time.time()) + 86_400}
    return {
        "off": (("--no-auth",), None),
        "token-file": (("--auth-tokens", str(tokens_file)), minted.token),
        "jwt": (("--jwt-key-file", str(key_file)), jwt.encode(claims, secret, "HS256")),
    }


async def promise_ops(address: str, token: str | None, seconds: float) -> float:
    """Create + resolve pairs for `seconds`, IN_FLIGHT at once: promise ops/s."""
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    channels = [grpc.aio.insecure_channel(address) for _ in range(4)]
    done = 0
    stop = time.monotonic() + seconds
    run = uuid.uuid4().hex[:8]

    async def loop(n: int) -> None:
        nonlocal done
        stub = promises_pb2_grpc.PromiseServiceStub(channels[n % len(channels)])
        i = 0
        while time.monotonic() < stop:
            pid = f"ops-{run}-{n}-{i}"
            i += 1
            await stub.CreatePromise(
                promises_pb2.CreatePromiseRequest(id=pid), metadata=metadata, timeout=30
            )
            await stub.ResolvePromise(
                promises_pb2.ResolvePromiseRequest(id=pid, value=types_pb2.Payload(data=b"1")),
                metadata=metadata,
                timeout=30,
            )
            done += 2

    started = time.monotonic()
    await asyncio.gather(*(loop(n) for n in range(IN_FLIGHT)))
    elapsed = time.monotonic() - started
    for channel in channels:
        await channel.close()
    return done / elapsed


def one_round(
    root: Path, notes: Notifications, mode: str, args: tuple[str, ...], token: str | None,
    settings: Settings, round_no: int,
) -> dict[str, float]:  # fmt: skip
    if token is None:
        os.environ.pop("TROTH_TOKEN", None)
    else:
        os.environ["TROTH_TOKEN"] = token  # read by troth.Client here and by the worker
    name = f"r{round_no}-{mode}"
    workdir = root / f"ops-{name}"
    workdir.mkdir()
    ops_cluster = Cluster(f"ops-{name}", BACKENDS["sqlite"], workdir, list(args))
    try:
        asyncio.run(promise_ops(ops_cluster.addresses[0], token, settings.warmup_s))
        ops = asyncio.run(promise_ops(ops_cluster.addresses[0], token, settings.duration_s))
    finally:
        ops_cluster.stop()
    harness = Harness(root, notes, f"hitl-{name}", "sqlite", args)
    try:
        group = f"hitl-{name}-{uuid.uuid4().hex[:6]}"
        workers = harness.start_workers(group, 1)
        row = measure_phase(
            harness, workers, hitl_cycle(harness.clients, notes, group),
            part=1, workload="hitl", prefix=f"{group}-x{IN_FLIGHT}", in_flight=IN_FLIGHT,
            settings=settings,
        )  # fmt: skip
        harness.stop_workers(workers)
    finally:
        harness.close()
    if row.errors:
        raise RuntimeError(f"{mode}: {row.errors} HITL cycles failed: {row.first_error}")
    return {"promise_ops_per_s": ops, "hitl_per_s": row.per_s, "server_cpu": row.server_cpu}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (5)")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per phase (5)")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of warm-up (1)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    settings = Settings(
        targets=["sqlite"], parts=[1], quick=False, duration_s=args.duration,
        warmup_s=args.warmup, hitl_in_flight=[IN_FLIGHT], hitl_workers=[1],
        steps_in_flight=[], steps_workers=[], history_sizes=[], recovery_count=0,
        latency_samples=0, keep=False, json=args.json,
    )  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix="troth-authbench-"))
    notes = Notifications(root / "notify.sock")
    modes = credentials(root)
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    for round_no in range(args.rounds):
        for mode in MODES:
            server_args, token = modes[mode]
            result = one_round(root, notes, mode, server_args, token, settings, round_no)
            runs[mode].append(result)
            figures = {k: round(v, 2) for k, v in result.items()}
            log(f"round {round_no + 1} {mode}: {json.dumps(figures)}")
    notes.close()
    summary: dict[str, Any] = {"machine": machine_info(), "rounds": args.rounds, "modes": {}}
    base = {k: statistics.median(r[k] for r in runs["off"]) for k in runs["off"][0]}
    rows = []
    for mode in MODES:
        medians = {k: statistics.median(r[k] for r in runs[mode]) for k in runs[mode][0]}
        spread = {
            k: (min(r[k] for r in runs[mode]), max(r[k] for r in runs[mode])) for k in medians
        }
        ratios = {k: medians[k] / base[k] for k in ("promise_ops_per_s", "hitl_per_s")}
        summary["modes"][mode] = {"median": medians, "spread": spread, "ratio_to_off": ratios}
        rows.append([
            mode,
            f"{medians['promise_ops_per_s']:.0f} ({spread['promise_ops_per_s'][0]:.0f}-"
            f"{spread['promise_ops_per_s'][1]:.0f})",
            f"{ratios['promise_ops_per_s']:.2f}",
            f"{medians['hitl_per_s']:.1f} ({spread['hitl_per_s'][0]:.1f}-"
            f"{spread['hitl_per_s'][1]:.1f})",
            f"{ratios['hitl_per_s']:.2f}",
            f"{medians['server_cpu']:.0%}",
        ])  # fmt: skip
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        header = ["auth", "promise ops/s (min-max)", "x off", "HITL cycles/s (min-max)",
                  "x off", "server CPU (HITL)"]  # fmt: skip
        print(table(header, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
