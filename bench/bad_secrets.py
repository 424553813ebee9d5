"""A flood of bad secrets against an admin's reads (issue 26, part 6): what a stranger
who knows a key id costs everybody else.

The key id is the public first part of every token-file token
(`troth_<key id>_<secret>`): anyone who has seen a token's prefix in a log or a
config can send that key id with random secrets, each of which the server must
check (one scrypt, 16 MiB) before it can refuse it. One run, on one server with
a token file (`--auth-tokens`, default settings otherwise) and a fresh database:

1. **quiet**: an admin (its token verified once, before) sends SearchPromises
   (`id="bench-*"`, a page of 100 over `--promises` promises), one call after the
   other, for `--duration` seconds: p50, p99, max;
2. **flooded**: the same, while `--loops` (48) threads of a second process send
   GetPromise with a fresh random secret each time for the admin's own key id
   (no backoff: an attacker does not honour RetryInfo), from one second before
   the phase to its end. The flood process stops by itself at the end of its
   time (each call has a 10 s deadline) and is killed if it does not.

It prints both phases, the ratio of the p99s (target: flooded within 2x of
quiet), what the flood was answered (codes and reasons, calls per second), the
server's CPU per phase, and how many `auth.refused` lines the server logged.

Usage (see bench/README.md, "Issue 26: bad secrets")::

    .venv/bin/python bench/bad_secrets.py [--backend sqlite|pg] [--duration 8] [--json]
"""

from __future__ import annotations

import argparse
import collections
import json
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc
from _servers import BACKENDS, Cluster, fmt, log, machine_info, percentile_ms, table
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from troth.v1 import promises_pb2, promises_pb2_grpc
from troth_server.auth import mint

TARGET_RATIO = 2.0
"""Flooded p99 within this many times the quiet p99."""
FLOOD_LEAD_S = 1.0
"""The flood starts this long before the flooded phase is measured."""
CALL_TIMEOUT_S = 10.0
FLOOD_CHANNELS = 8


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def seed(stub: Any, token: str, count: int) -> None:
    """`count` pending promises `bench-<n>` for the searches to page over."""
    futures = [
        stub.CreatePromise.future(
            promises_pb2.CreatePromiseRequest(id=f"bench-{n}"),
            metadata=bearer(token),
            timeout=60,
        )
        for n in range(count)
    ]
    for future in futures:
        future.result()


def searches(stub: Any, token: str, seconds: float) -> list[int]:
    """Sequential SearchPromises for `seconds`: each call's latency, in ns (sorted)."""
    request = promises_pb2.SearchPromisesRequest(id="bench-*", page_size=100)
    latencies = []
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        start = time.perf_counter_ns()
        stub.SearchPromises(request, metadata=bearer(token), timeout=60)
        latencies.append(time.perf_counter_ns() - start)
    return sorted(latencies)


def flood(address: str, key_id: str, loops: int, seconds: float) -> dict[str, Any]:
    """`loops` threads sending a random secret for `key_id` per call for `seconds`."""
    channels = [grpc.insecure_channel(address) for _ in range(FLOOD_CHANNELS)]
    answers: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def loop(n: int) -> None:
        stub = promises_pb2_grpc.PromiseServiceStub(channels[n % len(channels)])
        mine: collections.Counter[str] = collections.Counter()
        request = promises_pb2.GetPromiseRequest(id="bench-0")
        while (left := stop - time.monotonic()) > 0:
            token = f"troth_{key_id}_{secrets.token_urlsafe(32)}"
            try:
                stub.GetPromise(request, metadata=bearer(token), timeout=min(CALL_TIMEOUT_S, left))
                mine["OK"] += 1
            except grpc.RpcError as exc:
                mine[f"{exc.code().name} {_reason(exc)}".strip()] += 1
        with lock:
            answers.update(mine)

    threads = [threading.Thread(target=loop, args=(n,), daemon=True) for n in range(loops)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + CALL_TIMEOUT_S)
    elapsed = time.monotonic() - started
    for channel in channels:
        channel.close()
    total = sum(answers.values())
    return {"calls": total, "seconds": elapsed, "answers": dict(answers.most_common())}


def _reason(exc: grpc.RpcError) -> str:
    status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    if status is None:
        return ""
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info.reason
    return ""


def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="troth-badsecrets-"))
    admin = mint("bench-admin", ("admin",))
    tokens_file = root / "tokens.toml"
    tokens_file.write_text(admin.entry)
    key_id = admin.token.split("_")[1] if args.key == "known" else secrets.token_hex(8)
    cluster = Cluster("bad-secrets", BACKENDS[args.backend], root,
                      ["--auth-tokens", str(tokens_file)])  # fmt: skip
    server = cluster.servers[0]
    latencies: dict[str, list[int]] = {"quiet": [], "flooded": []}
    cpu: dict[str, list[float]] = {"quiet": [], "flooded": []}
    rounds: list[dict[str, Any]] = []
    answers: collections.Counter[str] = collections.Counter()
    flood_calls = 0
    flood_seconds = 0.0
    try:
        address = cluster.addresses[0]
        channel = grpc.insecure_channel(address)
        stub = promises_pb2_grpc.PromiseServiceStub(channel)
        seed(stub, admin.token, args.promises)
        searches(stub, admin.token, 1.0)  # warm-up: the admin's token is verified here
        refused_before = _count(server.stderr_path, "auth.refused")

        def phase(name: str, measured: list[int], since: float | None) -> dict[str, Any]:
            latencies[name] += measured
            spent = cluster.cpu_seconds()
            if since is not None and spent is not None:
                cpu[name].append((spent - since) / args.duration)
            return _phase(sorted(measured))

        for n in range(args.rounds):
            log(f"round {n + 1}: quiet, {args.duration:g} s of SearchPromises")
            quiet = phase("quiet", *_timed(cluster, stub, admin.token, args.duration))
            log(f"round {n + 1}: flooded, {args.loops} loops of random secrets for {key_id}")
            flood_s = FLOOD_LEAD_S + args.duration
            flooder = subprocess.Popen(
                [sys.executable, __file__, "--flood", address, key_id, str(args.loops),
                 str(flood_s)],
                stdout=subprocess.PIPE,
            )  # fmt: skip
            try:
                time.sleep(FLOOD_LEAD_S)
                flooded = phase("flooded", *_timed(cluster, stub, admin.token, args.duration))
                out, _ = flooder.communicate(timeout=flood_s + 2 * CALL_TIMEOUT_S)
            finally:
                if flooder.poll() is None:
                    flooder.kill()
                    flooder.wait()
            attack = json.loads(out)
            answers.update(attack["answers"])
            flood_calls += attack["calls"]
            flood_seconds += attack["seconds"]
            rounds.append({"quiet": quiet, "flooded": flooded,
                           "p99_ratio": flooded["p99_ms"] / quiet["p99_ms"]})  # fmt: skip
        channel.close()
        cluster.check_alive()
        time.sleep(0.5)  # the server writes its log out every 0.2 s
        refused_lines = _count(server.stderr_path, "auth.refused") - refused_before
    finally:
        cluster.stop()
        if args.keep:
            log(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    phases = {}
    for name, measured in latencies.items():
        phases[name] = _phase(sorted(measured))
        phases[name]["server_cpu"] = sum(cpu[name]) / len(cpu[name]) if cpu[name] else None
    ratio = phases["flooded"]["p99_ms"] / phases["quiet"]["p99_ms"]
    return {
        "machine": machine_info(),
        "backend": args.backend,
        "key": args.key,
        "loops": args.loops,
        "rounds": rounds,
        "duration_s": args.duration,
        "promises": args.promises,
        "phases": phases,
        "flood": {
            "calls": flood_calls,
            "per_s": flood_calls / flood_seconds if flood_seconds else 0.0,
            "answers": dict(answers.most_common()),
            "auth_refused_lines": refused_lines,
        },
        "p99_ratio": ratio,
        "verdict": "PASS" if ratio <= TARGET_RATIO else "MISS",
    }


def _timed(
    cluster: Cluster, stub: Any, token: str, seconds: float
) -> tuple[list[int], float | None]:
    """The latencies of `searches`, and the server's CPU seconds before them."""
    before = cluster.cpu_seconds()
    return searches(stub, token, seconds), before


def _phase(latencies: list[int]) -> dict[str, Any]:
    return {
        "calls": len(latencies),
        "p50_ms": percentile_ms(latencies, 50),
        "p99_ms": percentile_ms(latencies, 99),
        "max_ms": latencies[-1] / 1e6 if latencies else None,
    }


def _count(path: Path, word: str) -> int:
    try:
        return path.read_text(errors="replace").count(word)
    except OSError:
        return 0


def report(result: dict[str, Any]) -> str:
    rows = []
    for n, figures in enumerate(result["rounds"], start=1):
        for name in ("quiet", "flooded"):
            phase = figures[name]
            rows.append([f"round {n}", name, str(phase["calls"]), fmt(phase["p50_ms"], ".1f"),
                         fmt(phase["p99_ms"], ".1f"), fmt(phase["max_ms"], ".1f"), ""])  # fmt: skip
    for name, phase in result["phases"].items():
        cpu = None if phase["server_cpu"] is None else 100 * phase["server_cpu"]
        rows.append(["all", name, str(phase["calls"]), fmt(phase["p50_ms"], ".1f"),
                     fmt(phase["p99_ms"], ".1f"), fmt(phase["max_ms"], ".1f"),
                     fmt(cpu, ".0f")])  # fmt: skip
    attack = result["flood"]
    ratios = ", ".join(f"{r['p99_ratio']:.2f}" for r in result["rounds"])
    lines = [
        f"admin SearchPromises (page of 100 over {result['promises']} promises), "
        f"{result['backend']}, {result['duration_s']:g} s per phase",
        table(["", "phase", "calls", "p50 ms", "p99 ms", "max ms", "server CPU %"], rows, 2),
        "",
        f"flood: {result['loops']} loops, random secrets for a {result['key']} key id, "
        f"{attack['calls']} calls, {attack['per_s']:.0f}/s; "
        f"auth.refused lines logged: {attack['auth_refused_lines']}",
        *(f"  {count:>8}  {answer}" for answer, count in attack["answers"].items()),
        "",
        f"p99 flooded / quiet, by round: {ratios}",
        f"{result['verdict']} flooded p99 / quiet p99 = {result['p99_ratio']:.2f} "
        f"(target <= {TARGET_RATIO:g})",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--flood"]:
        address, key_id, loops, seconds = argv[1:5]
        print(json.dumps(flood(address, key_id, int(loops), float(seconds))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "pg"], default="sqlite",
                        help="the server's store (sqlite)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="quiet + flooded rounds (3)")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per phase (8)")
    parser.add_argument("--loops", type=int, default=48, help="flooding loops (48)")
    parser.add_argument("--promises", type=int, default=300, help="promises to search (300)")
    parser.add_argument("--key", choices=["known", "unknown"], default="known",
                        help="flood the admin's key id (known), or a key id the token file "
                        "does not hold (unknown: the floor, a refusal with no scrypt)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    if not 1 <= args.loops <= 256:
        parser.error("--loops must be 1 to 256")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    result = run(args)
    print(json.dumps(result, indent=2) if args.json else report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
