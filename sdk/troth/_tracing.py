"""OpenTelemetry tracing, optional (`pip install "troth[otel]"`): one trace for a whole workflow.

- `client.start` runs in a span of its own (`troth.start`, a child of the
  caller's current span) and stores that span's W3C `traceparent` with the
  root promise, as its tag `troth:traceparent` (`TRACEPARENT_TAG`).
- A worker runs each task of the workflow in a span (`troth.task`) whose parent
  is that stored context, whichever worker takes it and however long after;
  each step the task runs (`troth.step`) is a child of the task's span.
- `client.resolve`, `reject` and `cancel` run in spans of their own
  (`troth.resolve`, ...), children of the caller's current span: a settle made
  in the trace that started the workflow shows between the task that created
  the wait and the task that resumed after it.
- Every call made inside a span carries that span's traceparent
  (`current_traceparent`): a unary call as `traceparent` metadata, a call on
  the `Calls` stream in its `CallsRequest.traceparent`. The server's span of the
  call continues it, and the server's span of a settle links to the workflow's
  trace (the root's `troth:traceparent`), whichever trace the settle came from.

Imported lazily: without opentelemetry-api installed every helper here does
nothing and stores nothing; installed but with no SDK configured (no
`TracerProvider` set), the API's no-op tracer records nothing and no
traceparent is stored either. Tracing never fails a call: an exception of
OpenTelemetry's own is not caught here, but the API is written not to raise.
A child workflow (`ctx.start`) starts a trace of its own.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from types import ModuleType

TRACEPARENT_TAG = "troth:traceparent"
"""The tag of a workflow's root promise that holds the W3C traceparent of its start."""
TRACEPARENT_METADATA = "traceparent"
"""The gRPC metadata key (W3C Trace Context) a call carries its caller's span in."""
TRACER_NAME = "troth"

__all__ = [
    "TRACEPARENT_METADATA",
    "TRACEPARENT_TAG",
    "client_span",
    "current_traceparent",
    "step_span",
    "task_span",
]


@functools.cache
def _trace() -> ModuleType | None:
    """`opentelemetry.trace`, or None when opentelemetry-api is not installed."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    return trace


def _recording() -> ModuleType | None:
    """`opentelemetry.trace` when spans can record: installed, and a `TracerProvider`
    set (asked each time: one may be set after import). Without one, the API's spans
    would record nothing, and making them was 7 % of a worker's CPU on ten-step
    workflows (bench/README.md): then no span is made at all."""
    trace = _trace()
    if trace is None or isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return None
    return trace


def _tracer(trace: ModuleType) -> Any:
    # Asked for each span, so that a `TracerProvider` set after import is used.
    return trace.get_tracer(TRACER_NAME, _version())


@functools.cache
def _version() -> str | None:
    """troth's version, read once: reading package metadata takes a scan of
    `sys.path` (it was a quarter of a worker's CPU when read per span)."""
    from importlib import metadata

    try:
        return metadata.version("troth")
    except metadata.PackageNotFoundError:
        return None


def _traceparent() -> str | None:
    """The W3C traceparent of the current span (None when it records nothing)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent")


_task_traced: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "troth_task_traced", default=False
)
"""Whether the task running in this context made its span (`task_span`): its steps'
spans follow it. The provider is asked once per task, not per step or call (asking
reads the environment: 7 % of a worker's CPU when done per step and per call)."""


def _in_recording_span() -> bool:
    """Whether the caller's current span records (a context variable's read)."""
    trace = _trace()
    return trace is not None and trace.get_current_span().is_recording()


def current_traceparent() -> str | None:
    """The W3C traceparent of the caller's current span, to send with a call; None
    when no span records (then nothing is sent, and this cost one check). A process
    that never imported OpenTelemetry has no span: then it is not imported here
    either (a CLI call pays no import for it)."""
    if "opentelemetry.trace" not in sys.modules or not _in_recording_span():
        return None
    return _traceparent()


@contextlib.contextmanager
def client_span(name: str, **attributes: str) -> Iterator[str | None]:
    """A CLIENT span `name` around a call of `Client`, a child of the current span;
    yields its traceparent to store (None without tracing)."""
    trace = _recording()
    if trace is None:
        yield None
        return
    kind = trace.SpanKind.CLIENT
    with _tracer(trace).start_as_current_span(name, kind=kind, attributes=attributes):
        yield _traceparent()


@contextlib.contextmanager
def task_span(root_tags: Mapping[str, str], **attributes: str) -> Iterator[None]:
    """The span of one task of a workflow, a child of the context its start stored on
    the root (`troth:traceparent`), current for the task's thread while it runs."""
    trace = _recording()
    if trace is None:
        yield
        return
    parent = None
    traceparent = root_tags.get(TRACEPARENT_TAG)
    if traceparent:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        parent = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
    kind = trace.SpanKind.CONSUMER
    tracer = _tracer(trace)
    traced = _task_traced.set(True)
    try:
        with tracer.start_as_current_span("troth.task", context=parent, kind=kind,
                                          attributes=attributes):  # fmt: skip
            yield
    finally:
        _task_traced.reset(traced)


@contextlib.contextmanager
def step_span(**attributes: str) -> Iterator[None]:
    """The span of one step a task runs (its function, its record), in the task's span:
    none when the task made none (no provider was set when it began)."""
    trace = _trace() if _task_traced.get() else None
    if trace is None:
        yield
        return
    with _tracer(trace).start_as_current_span("troth.step", attributes=attributes):
        yield
