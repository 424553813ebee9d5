"""The server's spans (issue 28 item 4): a human's decision, settled by id from a
client of its own, joins the trace of the workflow it resumes.

A real server in this process (`_in_process`: its spans go to the same tracer
provider as the test's), on SQLite and on PostgreSQL, an in-process `Worker`, and
the OpenTelemetry SDK exporting to its `InMemorySpanExporter`. The workflow is
started inside one span (its trace: the workflow's); its human step is settled by
id from another client, inside a span of a trace of its own (as a gateway that
traces) or with no trace at all (a raw call, as grpcurl makes it). The server's
span of the settle continues the settler's trace and links to the workflow's; the
commit that carried the settle links to the settle's span; the worker's RESUME
task, and the server's spans of the worker's calls, are in the workflow's trace.
"""

from __future__ import annotations

import sys
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from _in_process import in_process_server
from _pg import fresh_schema
from _streams import HandCalls
from _support import eventually, exists, start_server
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from troth import Client, Context, Worker
from troth.v1 import promises_pb2, promises_pb2_grpc, tasks_pb2_grpc, types_pb2
from troth_server import _tracing as server_tracing

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

RESOLVE = "troth.v1.PromiseService/ResolvePromise"


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    """The process's tracer provider (set once per process, as OpenTelemetry allows),
    exporting to memory until the module's tests are done."""
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    server_tracing.look_again()  # (the server looks for a provider once a second)
    yield exporter
    exporter.shutdown()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def address(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    exporter: InMemorySpanExporter,
) -> Iterator[str]:
    """A server in this process, started once the provider is set."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('traced') / 'troth.db'}"
        with in_process_server(url) as (served, _metrics):
            yield served
        return
    with fresh_schema() as url, in_process_server(url) as (served, _metrics):
        yield served


def approval(ctx: Context, what: str) -> Any:
    wait = yield ctx.promise()
    decision = yield wait
    return {"decision": decision, "what": what}


def _settle_traced(address: str, step: str) -> int:
    """A gateway that traces: settles inside a span of its own trace; answers that trace."""
    with (
        Client(address) as gateway,
        trace.get_tracer("gateway").start_as_current_span("human decision") as decision,
    ):
        gateway.resolve(step, "yes")
    return decision.get_span_context().trace_id


def _settle_raw(address: str, step: str) -> int:
    """grpcurl's way: a unary call with no trace context at all."""
    with grpc.insecure_channel(address) as channel:
        promises_pb2_grpc.PromiseServiceStub(channel).ResolvePromise(
            promises_pb2.ResolvePromiseRequest(
                id=step,
                value=types_pb2.Payload(
                    headers={"content-type": "application/json"}, data=b'"yes"'
                ),
            )
        )
    return 0


@pytest.mark.parametrize("settle", [_settle_traced, _settle_raw], ids=["traced", "raw"])
def test_a_settle_by_id_joins_the_workflows_trace(
    address: str, exporter: InMemorySpanExporter, settle: Any, tmp_path: Path
) -> None:
    workflow_id = f"traced-{uuid.uuid4().hex[:8]}"
    step = f"{workflow_id}.0"
    group = f"g-{uuid.uuid4().hex[:6]}"
    with Client(address) as client:
        worker = Worker(client, group=group, lease=timedelta(seconds=5))
        worker.workflow(approval)
        with worker:
            with trace.get_tracer("app").start_as_current_span("workflow request") as request:
                handle = client.start(approval, "post", id=workflow_id, group=group)
            workflow_trace = request.get_span_context().trace_id
            eventually(lambda: exists(client, step), what="the human step")
            # Settled before the INVOKE task suspends, the worker would go on in that
            # task (no RESUME): settle once its span has ended.
            eventually(
                lambda: any(s.name == "troth.task" and s.context.trace_id == workflow_trace
                            for s in exporter.get_finished_spans()),
                what="the INVOKE task's suspension",
            )  # fmt: skip
            settler_trace = settle(address, step)
            assert handle.result(timeout=20) == {"decision": "yes", "what": "post"}

            def named(name: str) -> list[ReadableSpan]:
                return [s for s in exporter.get_finished_spans() if s.name == name]

            def resumed() -> list[ReadableSpan]:
                tasks = [s for s in named("troth.task") if s.context.trace_id == workflow_trace]
                return [
                    s
                    for s in tasks
                    if str((s.attributes or {}).get("troth.task.kind")).endswith("RESUME")
                ]

            eventually(lambda: resumed(), what="the RESUME task's span")

    (settled,) = [s for s in named(RESOLVE) if (s.attributes or {}).get("troth.promise.id") == step]
    attributes = settled.attributes or {}
    assert attributes["troth.workflow.id"] == workflow_id
    assert attributes["rpc.grpc.status_code"] == "OK"
    assert settled.kind is trace.SpanKind.SERVER
    # The decision links to the workflow's trace...
    assert workflow_trace in {link.context.trace_id for link in settled.links}
    if settler_trace:
        # ...while it continues the settler's own: a child of its client's span.
        assert settled.context.trace_id == settler_trace
        (client_span,) = [s for s in named("troth.resolve") if s.context.trace_id == settler_trace]
        assert settled.parent is not None
        assert settled.parent.span_id == client_span.context.span_id
    else:
        assert settled.parent is None  # no context sent: a trace of its own
        assert settled.context.trace_id != workflow_trace

    # The commit that carried the settle links to its span.
    settle_span = settled.context.span_id
    commits = [
        s for s in named("troth.commit") if settle_span in {k.context.span_id for k in s.links}
    ]
    assert len(commits) == 1, commits
    assert (commits[0].attributes or {})["troth.commit.batch_size"] >= 1

    # The worker's RESUME is in the workflow's trace, and so are the server's spans of
    # the calls the worker made from its tasks (on the Calls stream).
    assert resumed()
    in_workflow = {s.name for s in exporter.get_finished_spans()
                   if s.context.trace_id == workflow_trace}  # fmt: skip
    assert {"troth.v1.PromiseService/CreatePromise", "troth.v1.TaskService/CompleteTask"} <= (
        in_workflow
    ), in_workflow
    (create,) = [s for s in named("troth.v1.PromiseService/CreatePromise")
                 if (s.attributes or {}).get("troth.promise.id") == workflow_id]  # fmt: skip
    assert create.kind is trace.SpanKind.SERVER
    # A stream's opening is a span too.
    assert named("troth.v1.TaskService/Poll")


def test_the_server_exports_its_spans_as_opentelemetrys_variables_say(tmp_path: Path) -> None:
    # OTEL_TRACES_EXPORTER=console: the SDK's own exporter, spans printed on stdout.
    server = start_server(tmp_path / "console", env={"OTEL_TRACES_EXPORTER": "console"})
    try:
        with Client(server.address) as client:
            client.create("exported-1", ttl=timedelta(minutes=1))
    finally:
        assert server.stop() == 0
    log = server.log()
    assert "server.tracing" in log and "console to stdout" in log
    assert '"name": "troth.v1.PromiseService/CreatePromise"' in log
    assert '"troth.promise.id": "exported-1"' in log
    assert '"name": "troth.commit"' in log


def test_an_exporter_the_server_does_not_know_stops_it_saying_which_it_knows(
    tmp_path: Path,
) -> None:
    with pytest.raises(RuntimeError) as refused:
        start_server(tmp_path / "bogus", env={"OTEL_TRACES_EXPORTER": "jaegr"})
    assert "OTEL_TRACES_EXPORTER='jaegr' is not one the server knows" in str(refused.value)
    assert "use otlp, console or none" in str(refused.value)


def test_an_exporter_package_missing_is_named_with_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As if troth-server[otel] were not installed: importing the OTLP exporter fails.
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc.trace_exporter", None)
    with pytest.raises(server_tracing.TracingUnavailable, match=r"pip install '\./server\[otel\]'"):
        server_tracing.configure_exporter("http://127.0.0.1:4317")


@pytest.mark.parametrize(
    "traceparent",
    [
        "not a traceparent",
        "00-" + "z" * 32 + "-" + "1" * 16 + "-01",
        "00-" + "a" * 5000,
        "\u00e9t\u00e9",
    ],
    ids=["words", "bad-hex", "oversized", "non-ascii"],
)
def test_a_traceparent_the_server_cannot_read_starts_a_trace_of_its_own_on_every_road(
    address: str, exporter: InMemorySpanExporter, traceparent: str
) -> None:
    """A malformed or oversized W3C traceparent, sent as a unary call's metadata or on
    the `Calls` stream (`CallsRequest.traceparent`), is not an error: the call is
    answered as without it, and its span starts a trace of its own."""
    promise_id = f"tp-{uuid.uuid4().hex[:8]}"
    request = promises_pb2.GetPromiseRequest(id=promise_id)
    with grpc.insecure_channel(address) as channel:
        promises_pb2_grpc.PromiseServiceStub(channel).CreatePromise(
            promises_pb2.CreatePromiseRequest(id=promise_id), timeout=10
        )
        calls = HandCalls(tasks_pb2_grpc.TaskServiceStub(channel), ())
        try:
            assert calls.send("GetPromise", request, traceparent=traceparent) == (
                grpc.StatusCode.OK,
                "",
            )
        finally:
            calls.close()
        if traceparent.isascii():  # (gRPC refuses non-ASCII metadata on the client)
            promises_pb2_grpc.PromiseServiceStub(channel).GetPromise(
                request, metadata=(("traceparent", traceparent),), timeout=10
            )
    gets = [
        s for s in exporter.get_finished_spans()
        if s.name == "troth.v1.PromiseService/GetPromise"
        and (s.attributes or {}).get("troth.promise.id") == promise_id
    ]  # fmt: skip
    assert len(gets) == (2 if traceparent.isascii() else 1), gets
    for span in gets:
        assert span.parent is None
        assert (span.attributes or {})["rpc.grpc.status_code"] == "OK"
