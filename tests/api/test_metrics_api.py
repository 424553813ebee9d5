"""Prometheus metrics (issue 12 item 7): a real server started with `--metrics-listen`
on a free port serves `/metrics`; after RPCs, a workflow run by a worker, an expiry, a
lost lease and an overload refusal, the scrape (parsed with prometheus_client's own
text parser) names every metric docs/operations.md lists, with the labels and values the
work done implies. Without the flag nothing listens."""

from __future__ import annotations

import re
import socket
import urllib.request
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest
from _pg import fresh_schema
from _support import PollStream, ServerProcess, error_info, eventually, start_server
from google.protobuf.duration_pb2 import Duration
from prometheus_client.parser import text_string_to_metric_families

from troth import Client, Context, NotFoundError, PromiseState, Worker
from troth.errors import Reason
from troth.v1 import promises_pb2 as pb
from troth.v1 import promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc
from troth_server.config import settings_from

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.metrics_core import Metric

METRICS_PAGE = Path(__file__).parents[2] / "docs" / "operations.md"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def metered(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[tuple[ServerProcess, int]]:
    port = free_port()
    with ExitStack() as stack:
        db_url = stack.enter_context(fresh_schema()) if request.param == "postgres" else None
        server = start_server(
            tmp_path_factory.mktemp("metrics"),
            "--metrics-listen", f"127.0.0.1:{port}",
            "--sweep-interval", "100ms",
            "--max-streams", "5",
            db_url=db_url,
        )  # fmt: skip
        yield server, port
        assert server.stop() == 0, f"unclean shutdown:\n{server.log()[-3000:]}"


def scrape(port: int) -> dict[str, Metric]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(families: dict[str, Metric], sample: str, **labels: str) -> float:
    """The value of the sample named `sample` whose labels include `labels` (0 if none)."""
    name = re.sub(r"_(total|count|sum|bucket|created)$", "", sample)
    family = families.get(name) or families.get(sample)
    if family is None:
        return 0.0
    return sum(
        s.value
        for s in family.samples
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    )


def approve(ctx: Context, what: str) -> object:
    approval = yield ctx.promise()
    done = yield ctx.run(str.upper, what)
    decision = yield approval
    return {"decision": decision, "done": done}


def _ms(ms: int) -> Duration:
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def test_a_scrape_shows_the_work_done(metered: tuple[ServerProcess, int]) -> None:
    server, port = metered
    with Client(server.address) as client, server.channel() as channel:
        stub = promises_pb2_grpc.PromiseServiceStub(channel)
        tasks = tasks_pb2_grpc.TaskServiceStub(channel)
        # Plain RPCs: OK, NOT_FOUND, and an expiry by the sweeper.
        client.create("m-alone", {"n": 1})
        client.resolve("m-alone", {"ok": True})
        with pytest.raises(NotFoundError):
            client.get("m-missing")
        client.create("m-short", ttl=timedelta(milliseconds=100))
        assert client.wait("m-short", timeout=10).state is PromiseState.REJECTED_TIMEDOUT

        # A workflow run by a worker: a task, a step, a resume, a connected worker.
        worker = Worker(client, group="metered", lease=timedelta(seconds=5))
        worker.workflow(approve)
        with worker:
            handle = client.start(approve, "post", id="m-flow", group="metered")
            eventually(lambda: _exists(client, "m-flow.0"), what="the approval step")
            families = scrape(port)
            assert value(families, "troth_workers_connected", group="metered",
                         workflow="approve") == 1  # fmt: skip
            client.resolve("m-flow.0", "yes")
            assert handle.result(timeout=20) == {"decision": "yes", "done": "POST"}

            # A lease that runs out (a worker that never heartbeats), and a refused
            # stream (--max-streams 5: the client's Calls, the SDK worker's two, Poll
            # and Calls, this one, and one more).
            stub.CreatePromise(pb.CreatePromiseRequest(
                id="m-raw", tags={"troth:invoke": "raw", "troth:func": "raw"}))  # fmt: skip
            silent = PollStream(
                tasks,
                tasks_pb2.PollRequest(group="raw", worker_id="silent", capacity=1, lease=_ms(1000)),
                wait=20,
            )
            silent.next_response()
            second = PollStream(
                tasks, tasks_pb2.PollRequest(group="raw", worker_id="second"), wait=20
            )
            eventually(lambda: value(scrape(port), "troth_task_leases_lost_total", group="raw")
                       >= 1, what="the silent worker's lease to run out")  # fmt: skip
            third = tasks.Poll(tasks_pb2.PollRequest(group="raw", worker_id="third"))
            with pytest.raises(grpc.RpcError) as refused:
                next(iter(third))
            assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert error_info(refused.value).reason == Reason.OVERLOADED.value
            # The store's live counts are read at most every 5 s: wait for a fresh read.
            eventually(lambda: value(scrape(port), "troth_tasks", group="raw") == 1,
                       timeout=20, what="m-raw's task in the counts")  # fmt: skip
            families = scrape(port)
            silent.cancel()
            second.cancel()

    # RPCs by method and code, with latency histograms for unary calls.
    assert value(families, "troth_rpcs_handled_total", method="CreatePromise", code="OK") >= 3
    # The worker's calls come on its Calls stream and count as the RPCs they are: the
    # workflow's suspension and its completion, with their latency.
    assert value(families, "troth_rpcs_handled_total", method="CompleteTask", code="OK") >= 2
    assert value(families, "troth_rpc_duration_seconds_count", method="CompleteTask") >= 2
    assert value(families, "troth_rpcs_handled_total", method="GetPromise",
                 code="NOT_FOUND") >= 1  # fmt: skip
    assert value(families, "troth_rpcs_handled_total", method="Poll",
                 code="RESOURCE_EXHAUSTED") == 1  # fmt: skip
    assert value(families, "troth_rpc_duration_seconds_count", method="ResolvePromise",
                 code="OK") >= 2  # fmt: skip
    assert value(families, "troth_rpc_duration_seconds_bucket", method="ResolvePromise",
                 code="OK", le="+Inf") >= 2  # fmt: skip
    assert value(families, "troth_overload_refusals_total", method="Poll",
                 limit="max-streams") == 1  # fmt: skip
    # Commits and their batch sizes.
    commits = value(families, "troth_store_commits_total")
    assert commits >= 5
    assert value(families, "troth_store_commit_batch_size_count") == commits
    assert value(families, "troth_store_commit_batch_size_sum") >= commits
    assert value(families, "troth_store_commit_duration_seconds_count") == commits
    # Promises by state, kind and group.
    assert value(families, "troth_promises_created_total", kind="workflow", group="metered") == 1
    assert value(families, "troth_promises_created_total", kind="step", group="") >= 2
    assert value(families, "troth_promises_settled_total", state="RESOLVED", kind="workflow",
                 group="metered") == 1  # fmt: skip
    assert value(families, "troth_promises_settled_total", state="REJECTED_TIMEDOUT",
                 kind="promise", group="") == 1  # fmt: skip
    assert value(families, "troth_promises_pending") >= 1  # m-raw, never completed
    # Tasks by state and group; leases lost; sweeps.
    assert value(families, "troth_tasks", group="raw") == 1  # m-raw's task, PENDING or CLAIMED
    assert value(families, "troth_task_leases_lost_total", group="raw") >= 1
    assert value(families, "troth_sweeps_total") >= 1
    assert value(families, "troth_sweep_duration_seconds_count") >= 1
    assert (
        value(families, "troth_sweep_expired_promises_total")
        + value(families, "troth_promises_settled_total", state="REJECTED_TIMEDOUT")
        >= 1
    )
    # Connected workers by group and version; streams in flight.
    assert value(families, "troth_workers_connected", group="raw") == 2  # silent, second
    # The client's Calls, the SDK worker's Poll and Calls, silent's and second's Poll.
    assert value(families, "troth_rpcs_in_flight", type="stream") == 5
    assert value(families, "troth_server_info") == 1


def test_every_metric_is_in_the_docs(metered: tuple[ServerProcess, int]) -> None:
    _, port = metered
    families = scrape(port)
    page = METRICS_PAGE.read_text()
    table = page[page.index("| Metric | Type | Labels |") :]
    table = table[: table.index("\n\n")]
    documented = dict(re.findall(r"^\| `(troth_\w+)` \| \w+ \|([^|]*)\|", table, re.MULTILINE))
    for family in families.values():
        if not family.name.startswith("troth_"):
            continue
        name = family.name + ("_total" if family.type == "counter" else "")
        stem = re.sub(r"_created$", "", family.name)
        if stem != family.name and (stem in documented or stem + "_total" in documented):
            continue  # the creation time of a counter or histogram the table lists
        assert name in documented, f"{name} is served but not in docs/operations.md's table"
        labels = {label for sample in family.samples for label in sample.labels} - {"le"}
        shown = set(re.findall(r"`(\w+)`", documented[name]))
        assert labels <= shown, f"{name}: labels {sorted(labels - shown)} not in docs/operations.md"


def test_the_metrics_address_is_checked() -> None:
    assert settings_from([]).metrics_listen is None  # off by default
    assert settings_from([], {"TROTH_METRICS_LISTEN": "0.0.0.0:9464"}).metrics_listen == (
        "0.0.0.0:9464"
    )
    with pytest.raises(SystemExit):
        settings_from(["--metrics-listen", "9464"])


def _exists(client: Client, promise_id: str) -> bool:
    try:
        client.get(promise_id)
    except NotFoundError:
        return False
    return True


def test_a_metrics_address_in_use_stops_the_start(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match="server exited with 1") as failed:
            start_server(tmp_path, "--metrics-listen", f"127.0.0.1:{port}")
    assert f"cannot serve metrics on 127.0.0.1:{port}" in str(failed.value)
    assert "--metrics-listen HOST:PORT" in str(failed.value)
