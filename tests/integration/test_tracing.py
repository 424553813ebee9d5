"""OpenTelemetry tracing (issue 12 item 7): one trace shows a whole approval.

A real server (subprocess), an in-process `Worker`, and the OpenTelemetry SDK
exporting to its `InMemorySpanExporter`. Inside one span of the caller's, the
workflow is started and, once it waits, its approval is settled through the
Client; the worker's tasks (the INVOKE that created the wait, the RESUME after
the settle) continue the trace stored with the root (`troth:traceparent`), and
each step they run is a child of its task's span."""

from __future__ import annotations

import sys
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from _support import ServerProcess, eventually, exists, start_server
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from troth import Client, Context, Worker
from troth import _tracing as tracing

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@pytest.fixture(scope="module")
def traced_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_server(tmp_path_factory.mktemp("tracing"))
    yield server
    assert server.stop() == 0, f"unclean shutdown:\n{server.log()[-3000:]}"


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
    yield exporter
    exporter.shutdown()  # keeps nothing more (a provider cannot be unset)


def shout(text: str) -> str:
    return text.upper()


def approval(ctx: Context, what: str) -> Any:
    wait = yield ctx.promise()
    decision = yield wait
    done = yield ctx.run(shout, what)
    return {"decision": decision, "done": done}


def test_one_trace_shows_start_step_settle_resume(
    traced_server: ServerProcess, exporter: InMemorySpanExporter, tmp_path: Path
) -> None:
    workflow_id = f"traced-{uuid.uuid4().hex[:8]}"
    tracer = trace.get_tracer("test")
    with Client(traced_server.address) as client:
        worker = Worker(client, group="traced", lease=timedelta(seconds=5))
        worker.workflow(approval)
        with worker:
            with tracer.start_as_current_span("approval request") as outer:
                handle = client.start(approval, "post", id=workflow_id, group="traced")
                eventually(lambda: exists(client, f"{workflow_id}.0"), what="the wait")
                # Settled before the INVOKE task suspends, the worker would go on in
                # that task (no RESUME): settle once its span has ended.
                trace_id = outer.get_span_context().trace_id
                eventually(
                    lambda: any(s.name == "troth.task" and s.context.trace_id == trace_id
                                for s in exporter.get_finished_spans()),
                    what="the INVOKE task's suspension",
                )  # fmt: skip
                client.resolve(f"{workflow_id}.0", "yes")
            assert handle.result(timeout=20) == {"decision": "yes", "done": "POST"}
            root = client.get(workflow_id)

            def spans() -> list[ReadableSpan]:
                return [s for s in exporter.get_finished_spans()
                        if s.context.trace_id == outer.get_span_context().trace_id]  # fmt: skip

            def tasks() -> list[ReadableSpan]:
                return [s for s in spans() if s.name == "troth.task"]

            # The RESUME task's span ends just after its CompleteTask call returns.
            eventually(lambda: len(tasks()) == 2, what="both tasks' spans")

    by_id = {s.context.span_id: s for s in spans()}
    names = sorted(s.name for s in spans())
    assert names == sorted(["approval request", "troth.start", "troth.resolve", "troth.task",
                            "troth.task", "troth.step", "troth.step"]), names  # fmt: skip
    (start,) = [s for s in spans() if s.name == "troth.start"]
    (settle,) = [s for s in spans() if s.name == "troth.resolve"]
    invoke, resume = sorted(tasks(), key=lambda s: s.start_time or 0)
    outer_id = outer.get_span_context().span_id

    # The root carries the start's context; both tasks are its children.
    assert root.tags[tracing.TRACEPARENT_TAG].split("-")[2] == f"{start.context.span_id:016x}"
    assert start.parent is not None and start.parent.span_id == outer_id
    assert settle.parent is not None and settle.parent.span_id == outer_id
    for task in (invoke, resume):
        assert task.parent is not None and task.parent.span_id == start.context.span_id
        assert task.attributes is not None
        assert task.attributes["troth.workflow.id"] == workflow_id
    assert invoke.attributes is not None and invoke.attributes["troth.task.kind"].endswith("INVOKE")
    assert resume.attributes is not None and resume.attributes["troth.task.kind"].endswith("RESUME")
    # Each step is a child of the task that ran it: the wait (INVOKE), the run (RESUME).
    steps = {s.attributes["troth.step.kind"]: s for s in spans() if s.name == "troth.step"
             if s.attributes is not None}  # fmt: skip
    assert steps.keys() == {"promise", "run"}
    assert by_id[steps["promise"].parent.span_id] is invoke  # type: ignore[union-attr]
    assert by_id[steps["run"].parent.span_id] is resume  # type: ignore[union-attr]
    assert steps["run"].attributes is not None
    assert steps["run"].attributes["troth.step.function"] == "shout"
    # In time (causal order of their starts; a span may end after the next began, e.g.
    # the INVOKE task suspending while the settle is already on its way):
    # start -> the INVOKE task -> its wait -> the settle -> the RESUME task -> its run.
    order = [start, invoke, steps["promise"], settle, resume, steps["run"]]
    starts = [s.start_time or 0 for s in order]
    assert starts == sorted(starts), [
        s.name for s in sorted(order, key=lambda s: s.start_time or 0)
    ]


def test_without_opentelemetry_nothing_is_stored(
    traced_server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As if opentelemetry-api were not installed: the import fails.
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    tracing._trace.cache_clear()
    try:
        with tracing.client_span("troth.start") as traceparent:
            assert traceparent is None
        with Client(traced_server.address) as client:
            workflow_id = f"untraced-{uuid.uuid4().hex[:8]}"
            client.start("nobody-runs-it", id=workflow_id, group="untraced")
            assert tracing.TRACEPARENT_TAG not in client.get(workflow_id).tags
    finally:
        monkeypatch.undo()
        tracing._trace.cache_clear()
