"""OpenTelemetry spans of the server: one per RPC, one per commit of the single writer.

- Each troth RPC, unary or one call on the multiplexed `Calls` stream, runs in a
  SERVER span named after its method (`troth.v1.PromiseService/ResolvePromise`),
  with the promise id it names, the workflow it belongs to when known, and the
  gRPC status code it ended with. It continues the caller's trace when the call
  carried a W3C `traceparent` (metadata of a unary call, `CallsRequest.traceparent`
  of a call on `Calls`; the SDK sends it from inside a span).
- A stream's opening (Poll, Calls, the watches) is a span of its own, ended at
  once: a stream can live for hours, and a span is exported only when it ends.
- A settle's span links to the trace of the workflow it belongs to (the root's
  `troth:traceparent`, stored by `Client.start`): a human's decision made from a
  gateway, the CLI or the console, in a trace of its own or none, shows in the
  workflow's story.
- Each commit of the group committer that carries an RPC's write is a span
  (`troth.commit`, with the batch size) linked to the spans of the RPCs whose
  writes it carries: one commit serves many RPCs, so links, not a parent.

The server does not configure OpenTelemetry itself unless asked
(`configure_exporter`): with no tracer provider set, `tracer()` answers None and
every caller takes its untraced path (one check per RPC, none per commit).
"""

from __future__ import annotations

import functools
import os
import time
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from troth.v1 import promises_pb2, tasks_pb2
from troth_server.domain.starts import INVOKE_TAG

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from troth_server.domain.promise import Promise

TRACER_NAME = "troth-server"
TRACEPARENT_METADATA = "traceparent"
TRACEPARENT_TAG = "troth:traceparent"
"""The root's tag holding the traceparent of its start (the SDK's `troth._tracing`)."""

PROMISE_ID = "troth.promise.id"
WORKFLOW_ID = "troth.workflow.id"
TASK_ID = "troth.task.id"
STATUS_CODE = "rpc.grpc.status_code"
BATCH_SIZE = "troth.commit.batch_size"

_PROPAGATOR = TraceContextTextMapPropagator()
_tracer: trace.Tracer | None = None
_next_look = 0.0
LOOK_EVERY_S = 1.0
"""While no provider is set, how often `tracer()` asks OpenTelemetry whether one is."""


def tracer() -> trace.Tracer | None:
    """The server's tracer once a `TracerProvider` is set, else None: what every RPC
    asks first. A provider can be set once per process, never unset: once seen, it
    is kept. Until then OpenTelemetry is asked at most once a `LOOK_EVERY_S` (asking
    reads the environment: about 1 µs, against 50 ns for the clock read), so a
    provider an embedding program sets after the server started is used within a
    second; `configure_exporter`'s at once."""
    global _tracer, _next_look
    if _tracer is not None:
        return _tracer
    now = time.monotonic()
    if now < _next_look:
        return None
    _next_look = now + LOOK_EVERY_S
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider):
        return None
    _tracer = provider.get_tracer(TRACER_NAME)
    return _tracer


@functools.cache
def _full_names() -> dict[str, str]:
    return {
        method.name: f"{service.full_name}/{method.name}"
        for file in (promises_pb2.DESCRIPTOR, tasks_pb2.DESCRIPTOR)
        for service in file.services_by_name.values()
        for method in service.methods
    }


def span_name(method: str) -> str:
    """`ResolvePromise` -> `troth.v1.PromiseService/ResolvePromise`."""
    return _full_names().get(method, method)


def _parent(metadata: Iterable[tuple[str, Any]] | None) -> otel_context.Context | None:
    for key, value in metadata or ():
        if key == TRACEPARENT_METADATA and isinstance(value, str):
            return _PROPAGATOR.extract({TRACEPARENT_METADATA: value})
    return None


def _attributes(request: Any) -> dict[str, str]:
    attributes: dict[str, str] = {}
    for field, name in (("id", PROMISE_ID), ("promise_id", PROMISE_ID), ("task_id", TASK_ID)):
        value = getattr(request, field, None)
        if isinstance(value, str) and value:
            attributes[name] = value
    return attributes


class RpcSpan:
    """The span of one RPC, current (for the writes it queues) until `end`."""

    __slots__ = ("_span", "_token")

    def __init__(self, tracer: trace.Tracer, method: str, request: Any, context: Any) -> None:
        parent = _parent(context.invocation_metadata())
        self._span = tracer.start_span(
            span_name(method),
            context=parent,
            kind=trace.SpanKind.SERVER,
            attributes={"rpc.system": "grpc", "rpc.method": method, **_attributes(request)},
        )
        self._token = otel_context.attach(trace.set_span_in_context(self._span))

    def end(self, code: str) -> None:
        otel_context.detach(self._token)
        self._span.set_attribute(STATUS_CODE, code)
        if code != "OK":
            self._span.set_status(trace.Status(trace.StatusCode.ERROR, code))
        self._span.end()


def stream_opened(tracer: trace.Tracer, method: str, request: Any, context: Any) -> None:
    """A span for a stream's opening, ended at once."""
    attributes = {"rpc.system": "grpc", "rpc.method": method, **_attributes(request)}
    tracer.start_span(
        span_name(method),
        context=_parent(context.invocation_metadata()),
        kind=trace.SpanKind.SERVER,
        attributes=attributes,
    ).end()


def workflow_id(promise: Promise) -> str | None:
    """The workflow a promise belongs to: its root's id, or its own if it is one."""
    if promise.root_id is not None:
        return promise.root_id
    return promise.id if INVOKE_TAG in promise.tags else None


def annotate_settle(promise: Promise, root: Promise | None) -> None:
    """On the current span (a settle's): the workflow it belongs to, and a link to the
    trace its start recorded on `root` (the root's `troth:traceparent`)."""
    span = trace.get_current_span()
    workflow = workflow_id(promise)
    if workflow is not None:
        span.set_attribute(WORKFLOW_ID, workflow)
    recorded = (root or promise).tags.get(TRACEPARENT_TAG)
    if not recorded:
        return
    linked = trace.get_current_span(_PROPAGATOR.extract({TRACEPARENT_METADATA: recorded}))
    context = linked.get_span_context()
    if context.is_valid:
        span.add_link(context, {"troth.link": "workflow"})


def current_span_context() -> trace.SpanContext | None:
    """The current span's context, to link a commit to (None when it records nothing)."""
    context = trace.get_current_span().get_span_context()
    return context if context.is_valid else None


def commit_span(
    tracer: trace.Tracer, size: int, carried: Sequence[trace.SpanContext]
) -> trace.Span:
    """The span of one commit of `size` writes, linked to the RPC spans it carries."""
    return tracer.start_span(
        "troth.commit",
        kind=trace.SpanKind.INTERNAL,
        attributes={BATCH_SIZE: size},
        links=[trace.Link(context) for context in carried],
    )


def end_failed(span: trace.Span, error: BaseException) -> None:
    """End `span` as failed by `error` (a commit the store refused)."""
    span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}"))
    span.end()


def configure_exporter(endpoint: str | None) -> str | None:
    """Set a tracer provider that exports over OTLP, when asked: `endpoint` (the
    `--otlp-endpoint` flag) or OpenTelemetry's own `OTEL_EXPORTER_OTLP_ENDPOINT` /
    `OTEL_TRACES_EXPORTER` (`otlp`, or `console` for spans printed on stdout).
    Answers what it set (for the server's first lines), None when not asked."""
    endpoint = endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None
    exporter_name = os.environ.get("OTEL_TRACES_EXPORTER", "otlp" if endpoint else "none")
    if exporter_name in ("", "none"):
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )
    except ImportError as exc:
        raise TracingUnavailable(
            "tracing needs the OpenTelemetry SDK: "
            "pip install './server[otel]' (in a troth checkout)"
        ) from exc
    exporter: SpanExporter
    if exporter_name == "console":
        exporter, where = ConsoleSpanExporter(), "stdout"
    elif exporter_name == "otlp":
        try:  # an optional package (`./server[otel]`)
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
                OTLPSpanExporter,
            )
        except ImportError as exc:
            raise TracingUnavailable(
                "exporting spans over OTLP needs its exporter: "
                "pip install './server[otel]' "
                "(opentelemetry-exporter-otlp-proto-grpc; in a troth checkout)"
            ) from exc
        exporter = OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()
        where = endpoint or "the OTLP default (localhost:4317)"
    else:
        raise TracingUnavailable(
            f"OTEL_TRACES_EXPORTER={exporter_name!r} is not one the server knows; "
            "use otlp, console or none"
        )
    service = os.environ.get("OTEL_SERVICE_NAME", "troth-server")
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    look_again()
    return f"{exporter_name} to {where}"


def look_again() -> None:
    """Have the next `tracer()` ask OpenTelemetry at once (a provider was just set)."""
    global _next_look
    _next_look = 0.0


class TracingUnavailable(RuntimeError):
    """Tracing was asked for, but a package it needs is not installed."""


__all__ = [
    "RpcSpan",
    "TracingUnavailable",
    "annotate_settle",
    "commit_span",
    "configure_exporter",
    "current_span_context",
    "end_failed",
    "look_again",
    "span_name",
    "stream_opened",
    "tracer",
]
