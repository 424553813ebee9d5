"""Schema validation (issue 10, part 1): what one resolve's check costs, by engine,
for typical approval decisions and for hostile schema/value pairs; and how fast
the health check answers while the worst pair is being resolved.

Engines, each timed on the same schema/value pairs (median of `--repeat` runs):

- `jsonschema`: the check before issue 10 (jsonschema's validator for the draft,
  Python's backtracking `re`, `best_match` over `iter_errors`);
- `jsonschema-rs`: the Rust validator, with the `regex` crate (linear time);
  also how long it holds the interpreter lock (the longest gap of a thread that
  wakes every millisecond while it validates);
- `troth`: `troth_server.domain.schema.check_value` in this process (jsonschema +
  RE2 + the step, depth and uniqueItems bounds);
- `troth+ipc`: the same check as the server runs it, in its worker process
  (`troth_server.checks.SchemaChecks`): what a resolve waits for.

A hostile case that does not finish within `--case-timeout` seconds (each runs in
a child process) is reported as `>N s`. Then (unless `--no-attack`) a real
server on SQLite is started, four clients resolve the worst pair in a loop, and
the health check's latency is sampled (median, p99, max), with the same
sampled without the attack for reference.

Usage (see bench/README.md, "Schema checks")::

    .venv/bin/python bench/validation.py [--repeat 20] [--case-timeout 20] [--no-attack]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

CASES: dict[str, tuple[dict[str, Any], Any]] = {}


def _decision() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "approved": {"type": "boolean"},
            "channel": {"type": "string", "enum": ["email", "slack", "web"]},
            "reviewer": {
                "type": "object",
                "properties": {"name": {"type": "string", "pattern": "^[A-Za-z .'-]{1,64}$"}},
                "required": ["name"],
            },
            "tools": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "args": {"type": "object"}},
                    "required": ["name"],
                    "additionalProperties": False,
                },
            },
            "note": {"type": "string", "maxLength": 2000},
        },
        "required": ["approved", "channel"],
        "additionalProperties": False,
    }


def _exponential() -> dict[str, Any]:
    defs: dict[str, Any] = {
        f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]}
        for i in range(40)
    }
    defs["d40"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def _nested(levels: int) -> Any:
    value: Any = []
    for _ in range(levels):
        value = [value]
    return value


def cases() -> dict[str, tuple[dict[str, Any], Any]]:
    good = {
        "approved": True,
        "channel": "slack",
        "reviewer": {"name": "Ada Lovelace"},
        "tools": [{"name": f"tool-{i}", "args": {"n": i}} for i in range(5)],
        "note": "ship it",
    }
    bad = {**good, "tools": [*good["tools"], {"name": 7}]}
    objects = [{"id": i, "tags": [str(i), {"n": i}]} for i in range(2500)]
    recursive = {"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}}}
    return {
        "typical: approval, valid": (_decision(), good),
        "typical: approval, invalid": (_decision(), bad),
        "typical: 1,000 tools": (_decision(), {**good, "tools": good["tools"] * 200}),
        "hostile: ^(a+)+$, 27 a + !": ({"type": "string", "pattern": "^(a+)+$"}, "a" * 27 + "!"),
        "hostile: uniqueItems, 2,500 objects": ({"type": "array", "uniqueItems": True}, objects),
        "hostile: $ref tree, 60 levels": ({**recursive, "$ref": "#/$defs/n"}, _nested(60)),
        "hostile: anyOf x2 over 40 $refs": (_exponential(), 1),
    }


def _time_engine(engine: str, name: str, repeat: int) -> float:
    """Median seconds of one check (run in a child process by `run_case`)."""
    schema, value = cases()[name]
    text, data = json.dumps(schema), json.dumps(value).encode()
    if engine == "jsonschema":
        from jsonschema import exceptions, validators

        cls = validators.validator_for(schema, default=validators.Draft202012Validator)
        validator = cls(schema)

        def check() -> None:
            exceptions.best_match(validator.iter_errors(json.loads(data)))

    elif engine == "jsonschema-rs":
        import jsonschema_rs

        rs = jsonschema_rs.validator_for(schema, pattern_options=jsonschema_rs.RegexOptions())

        def check() -> None:
            next(iter(rs.iter_errors(json.loads(data))), None)

    elif engine == "troth":
        from troth_server.domain.errors import InvalidArgument
        from troth_server.domain.promise import Payload
        from troth_server.domain.schema import check_schema, check_value

        check_schema(text)
        payload = Payload({"content-type": "application/json"}, data)

        def check() -> None:
            try:
                check_value(text, payload)
            except InvalidArgument:
                pass

    else:  # troth+ipc
        from troth_server.checks import SchemaChecks
        from troth_server.domain.errors import InvalidArgument
        from troth_server.domain.promise import Payload

        checks = SchemaChecks()
        checks.schema(text)
        payload = Payload({"content-type": "application/json"}, data)

        def check() -> None:
            try:
                checks.value(text, payload)
            except InvalidArgument:
                pass

    check()  # warm caches
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        check()
        times.append(time.perf_counter() - start)
    if engine == "troth+ipc":
        checks.stop()
    return statistics.median(times)


def _gil_gap(name: str) -> float:
    """Longest stall of a 1 ms ticker thread while jsonschema-rs checks `name`."""
    import jsonschema_rs

    schema, value = cases()[name]
    rs = jsonschema_rs.validator_for(schema, pattern_options=jsonschema_rs.RegexOptions())
    done = threading.Event()
    gaps = [0.0]

    def tick() -> None:
        last = time.perf_counter()
        while not done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps[0] = max(gaps[0], now - last)
            last = now

    ticker = threading.Thread(target=tick)
    ticker.start()
    rs.is_valid(value)
    done.set()
    ticker.join()
    return gaps[0]


def _child(conn: Any, fn: Any, args: tuple[Any, ...]) -> None:
    try:
        conn.send(("ok", fn(*args)))
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"[:80]))


def run_case(fn: Any, args: tuple[Any, ...], timeout: float) -> str:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child, fn, args))
    proc.start()
    if not parent.poll(timeout):
        proc.kill()
        proc.join()
        return f">{timeout:.0f} s"
    status, result = parent.recv()
    proc.join()
    if status != "ok":
        return str(result)
    return f"{result * 1000:.3f} ms" if result < 10 else f"{result:.1f} s"


def attack(samples: int) -> dict[str, tuple[float, float, float]]:
    sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
    sys.path.insert(0, str(Path(__file__).parent.parent / "tests" / "integration"))
    import grpc
    from _support import start_server
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from test_hostile_isolation import Attack, percentile, timed_ms, worst_schema

    from troth.v1 import promises_pb2 as pb
    from troth.v1 import promises_pb2_grpc

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp), "--sweep-interval", "200ms")
        try:
            with (
                grpc.insecure_channel(server.address) as ch,
                grpc.insecure_channel(server.address) as attack_ch,
            ):
                health = health_pb2_grpc.HealthStub(ch)
                stub = promises_pb2_grpc.PromiseServiceStub(ch)
                stub.CreatePromise(
                    pb.CreatePromiseRequest(id="worst", schema=json.dumps(worst_schema()))
                )

                def sample(n: int) -> list[float]:
                    check = health_pb2.HealthCheckRequest()
                    return [timed_ms(lambda: health.Check(check, timeout=10)) for _ in range(n)]

                quiet = sample(samples)
                with Attack(attack_ch, "worst") as running:
                    started = len(running.answers)
                    loud: list[float] = []
                    while len(loud) < samples or len(running.answers) - started < 4:
                        loud += sample(50)
                    answered = len(running.answers) - started
            for label, values in (("no attack", quiet), (f"attack ({answered} checks)", loud)):
                results[label] = (
                    statistics.median(values),
                    percentile(values, 0.99),
                    max(values),
                )
        finally:
            server.stop()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20, help="checks timed per case")
    parser.add_argument("--case-timeout", type=float, default=20.0, help="seconds per case")
    parser.add_argument("--samples", type=int, default=1000, help="health checks per phase")
    parser.add_argument("--no-attack", action="store_true", help="skip the server part")
    args = parser.parse_args()
    engines = ["jsonschema", "jsonschema-rs", "troth", "troth+ipc"]
    print(f"{'case':40} " + " ".join(f"{e:>14}" for e in engines))
    for name in cases():
        row = []
        for engine in engines:
            print(f"  {name} / {engine} ...", file=sys.stderr, flush=True)
            row.append(run_case(_time_engine, (engine, name, args.repeat), args.case_timeout))
        print(f"{name:40} " + " ".join(f"{r:>14}" for r in row), flush=True)
    print("\njsonschema-rs holds the interpreter lock while it checks (longest 1 ms-ticker gap):")
    for name in ("hostile: uniqueItems, 2,500 objects", "typical: 1,000 tools"):
        print(f"  {name:40} {run_case(_gil_gap, (name,), args.case_timeout)}")
    if not args.no_attack:
        print("\nhealth check latency, ms (median, p99, max), SQLite server:")
        for label, (median, p99, worst) in attack(args.samples).items():
            print(f"  {label:28} {median:7.2f} {p99:7.2f} {worst:7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
