"""The requests and the measuring of `approvals.py`: approvals with and without a
decision schema, the decisions a gateway sends (valid and refused), creating data
sets in bulk, the samples of a phase (calls, CPU of the servers, the client and
PostgreSQL) and the servers each part starts.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from _servers import (
    Backend,
    Cluster,
    ServerError,
    fmt,
    log,
    machine_busy_seconds,
    percentile_ms,
    postgres_cpu_delta,
    postgres_cpu_seconds,
)
from google.protobuf import duration_pb2
from promises import (
    CALL_TIMEOUT_S,
    FutureClient,
    NextRequest,
    PhaseResult,
    RawPhase,
    Request,
    summarize,
)

from troth._commands import TAG_GROUP, TAG_KIND, Kind
from troth.v1 import promises_pb2, promises_pb2_grpc, types_pb2

PromiseServiceStub: Any = promises_pb2_grpc.PromiseServiceStub
JSON_HEADERS = {"content-type": "application/json"}
TTL = duration_pb2.Duration(seconds=3600)
LOAD_IN_FLIGHT = 64  # creates that build data sets (not measured)
BUILD_TIMEOUT_S = 600.0

# What a gateway sends back for "publish this post?": a realistic decision.
APPROVAL_SCHEMA = json.dumps(
    {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "approved": {"type": "boolean"},
            "channel": {"enum": ["blog", "newsletter", "social"]},
            "reviewer": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "minLength": 1, "maxLength": 64},
                    "email": {"type": "string", "maxLength": 254},
                },
                "required": ["id"],
                "additionalProperties": False,
            },
            "priority": {"type": "integer", "minimum": 1, "maximum": 5},
            "budget_eur": {"type": "number", "minimum": 0},
            "comment": {"type": "string", "maxLength": 2000},
        },
        "required": ["approved", "channel", "reviewer"],
        "additionalProperties": False,
    }
)
VALID_DECISION = json.dumps(
    {
        "approved": True,
        "channel": "blog",
        "reviewer": {"id": "u-42", "email": "ana@example.com"},
        "priority": 2,
        "budget_eur": 120.5,
        "comment": "Fine, publish on Monday.",
    }
).encode()
# Wrong at its first field (a string for a boolean) and at two more.
INVALID_DECISION = json.dumps(
    {"approved": "yes", "channel": "print", "reviewer": {"email": "ana@example.com"}}
).encode()


# --------------------------------------------------------------------------- requests


def approval_create(
    promise_id: str, n: int, group: str, *, schema: bool, ttl_s: int = 3600
) -> promises_pb2.CreatePromiseRequest:
    """What `ctx.promise()` for a human writes: the inbox tags, a title, a message."""
    return promises_pb2.CreatePromiseRequest(
        id=promise_id,
        param=types_pb2.Payload(headers=JSON_HEADERS, data=b'{"post": %d}' % n),
        tags={TAG_KIND: Kind.PROMISE.value, TAG_GROUP: group},
        ttl=duration_pb2.Duration(seconds=ttl_s),
        schema=APPROVAL_SCHEMA if schema else "",
        title=f"Publish post {n}?",
        message="The draft passed the checks; approve to publish it on the chosen channel.",
    )


def approvals(run_id: str, counter: Iterator[int], *, schema: bool) -> NextRequest:
    prefix = f"appr-{run_id}-{'s' if schema else 'p'}"

    def make() -> Request:
        n = next(counter)
        return approval_create(f"{prefix}-{n}", n, "bench", schema=schema)

    return make


def refusals(ids: list[str]) -> NextRequest:
    """Resolves the ids round and round with a value the schema refuses (they stay PENDING)."""
    it = itertools.cycle(ids)
    value = types_pb2.Payload(headers=JSON_HEADERS, data=INVALID_DECISION)

    def make() -> Request:
        return promises_pb2.ResolvePromiseRequest(id=next(it), value=value)

    return make


def from_list(requests: Iterator[Request]) -> NextRequest:
    """The requests of an iterator, then None. The client's reply callbacks call this
    from several threads at once, and a generator refuses to be re-entered."""
    lock = threading.Lock()

    def make() -> Request | None:
        with lock:
            return next(requests, None)

    return make


def create_all(client: FutureClient, make: NextRequest, what: str) -> RawPhase:
    """Run creates until `make` runs out; every one must succeed."""
    raw = client.run("create", make, LOAD_IN_FLIGHT, BUILD_TIMEOUT_S)
    if raw.errors:
        raise ServerError(f"creating {what}: {raw.errors} creates failed, e.g. {raw.first_error}")
    return raw


# --------------------------------------------------------------------------- measuring


@dataclass
class Sample:
    """A load phase and what the server, PostgreSQL and the machine spent on it."""

    raw: RawPhase
    server_cpu_s: float | None
    busy_s: float | None
    db_cpu_s: float | None
    commits: int | None
    requests: int | None


def _add(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def merge(samples: list[Sample]) -> Sample:
    """Several phases of one kind (the rounds) as one: calls and times add up."""
    raw = RawPhase()
    out = Sample(raw, 0.0, 0.0, 0.0, 0, 0)
    for s in samples:
        raw.latencies_ns.extend(s.raw.latencies_ns)
        raw.errors += s.raw.errors
        raw.first_error = raw.first_error or s.raw.first_error
        raw.elapsed_s += s.raw.elapsed_s
        raw.client_cpu_s += s.raw.client_cpu_s
        out.server_cpu_s = _add(out.server_cpu_s, s.server_cpu_s)
        out.busy_s = _add(out.busy_s, s.busy_s)
        out.db_cpu_s = _add(out.db_cpu_s, s.db_cpu_s)
        out.commits = None if out.commits is None or s.commits is None else out.commits + s.commits
        out.requests = (
            None if out.requests is None or s.requests is None else out.requests + s.requests
        )
    return out


class Meter:
    """Runs load phases on a cluster, sampling its CPU and commit stats around each."""

    def __init__(self, cluster: Cluster, client: FutureClient) -> None:
        self.cluster = cluster
        self.client = client
        self.use_stats = cluster.catches_sigusr1()
        self.on_pg = cluster.backend.kind == "postgresql"

    def run(self, op: str, make: NextRequest, in_flight: int, duration_s: float) -> Sample:
        stats0 = self.cluster.stats() if self.use_stats else None
        cpu0, busy0 = self.cluster.cpu_seconds(), machine_busy_seconds()
        db0 = postgres_cpu_seconds() if self.on_pg else None
        raw = self.client.run(op, make, in_flight, duration_s)
        cpu1, busy1 = self.cluster.cpu_seconds(), machine_busy_seconds()
        db1 = postgres_cpu_seconds() if self.on_pg else None
        self.cluster.check_alive()
        stats1 = self.cluster.stats() if self.use_stats else None
        return Sample(
            raw,
            None if cpu0 is None or cpu1 is None else cpu1 - cpu0,
            None if busy0 is None or busy1 is None else busy1 - busy0,
            postgres_cpu_delta(db0, db1),
            None if stats0 is None or stats1 is None else stats1[0] - stats0[0],
            None if stats0 is None or stats1 is None else stats1[1] - stats0[1],
        )


def to_result(target: str, op: str, in_flight: int, sample: Sample) -> PhaseResult:
    stats = None
    if sample.commits is not None and sample.requests is not None:
        stats = ((0, 0), (sample.commits, sample.requests))
    return summarize(
        target,
        op,
        in_flight,
        sample.raw,
        sample.server_cpu_s,
        sample.busy_s,
        stats,
        sample.db_cpu_s,
    )


def start_cluster(name: str, backend: Backend, root: Path) -> Cluster:
    workdir = root / name
    workdir.mkdir()
    log(f"  starting {backend.replicas} troth server(s) on {backend.kind} ({name})")
    return Cluster(name, backend, workdir)


def rate(sample: Sample) -> str:
    raw = sample.raw
    lat = sorted(raw.latencies_ns)
    return (
        f"{len(lat) / (raw.elapsed_s or float('nan')):,.0f}/s p50 "
        f"{fmt(percentile_ms(lat, 50), '.2f')} ms p99 {fmt(percentile_ms(lat, 99), '.2f')} ms"
        + (f" ({raw.errors} errors: {raw.first_error})" if raw.errors else "")
    )


def refusal_example(address: str, promise_id: str) -> str:
    """One refused resolve, as a gateway would see it (code and message)."""
    with grpc.insecure_channel(address) as channel:
        try:
            PromiseServiceStub(channel).ResolvePromise(
                promises_pb2.ResolvePromiseRequest(
                    id=promise_id,
                    value=types_pb2.Payload(headers=JSON_HEADERS, data=INVALID_DECISION),
                ),
                timeout=CALL_TIMEOUT_S,
            )
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
    raise ServerError(f"a resolve of {promise_id} with {INVALID_DECISION!r} was accepted")
