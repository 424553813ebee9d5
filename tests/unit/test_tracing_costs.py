"""What tracing costs a worker that does not trace: no span is made while no
`TracerProvider` is set, and troth's version (package metadata, a scan of sys.path) is
read once, not at every span."""

from __future__ import annotations

import contextlib
from importlib import metadata
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from troth import _tracing

if TYPE_CHECKING:
    import pytest


def test_without_a_provider_no_span_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: trace.ProxyTracerProvider())

    def no_tracer(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a tracer was asked for with no provider set")

    monkeypatch.setattr(trace, "get_tracer", no_tracer)
    with _tracing.step_span(**{"troth.step.id": "wf.1"}):
        pass
    with _tracing.task_span({}, **{"troth.workflow.id": "wf"}):
        pass
    with _tracing.client_span("troth.start") as traceparent:
        assert traceparent is None


def test_the_version_is_read_once_however_many_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[str] = []
    real_version = metadata.version

    def counting(name: str) -> str:
        reads.append(name)
        return real_version(name)

    started: list[str] = []

    class Tracer:
        @contextlib.contextmanager
        def start_as_current_span(self, name: str, *args: Any, **kwargs: Any) -> Any:
            started.append(name)
            yield None

    monkeypatch.setattr(trace, "get_tracer_provider", lambda: object())  # one is set
    monkeypatch.setattr(trace, "get_tracer", lambda *args, **kwargs: Tracer())
    monkeypatch.setattr(metadata, "version", counting)
    _tracing._version.cache_clear()
    for _ in range(5):
        with (
            _tracing.client_span("troth.start"),
            _tracing.task_span({}, a="b"),
            _tracing.step_span(b="c"),
        ):
            pass
    assert started == ["troth.start", "troth.task", "troth.step"] * 5
    assert reads.count("troth") <= 1


def test_a_step_and_a_call_outside_a_recording_span_do_not_ask_the_provider(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Asking for the provider reads the environment: per task, not per step or call."""
    asked: list[int] = []
    real = trace.get_tracer_provider

    def counting() -> Any:
        asked.append(1)
        return real()

    monkeypatch.setattr(trace, "get_tracer_provider", counting)
    for _ in range(5):
        with _tracing.step_span(**{"troth.step.id": "wf.1"}):
            assert _tracing.current_traceparent() is None
    assert asked == []


def test_a_call_follows_the_current_recording_span_and_a_step_its_task() -> None:
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider()  # not the global one: the provider is never asked
    with provider.get_tracer("test").start_as_current_span("caller") as caller:
        sent = _tracing.current_traceparent()
        # Outside a task that made its span, a step makes none and hides nothing.
        with _tracing.step_span(**{"troth.step.id": "wf.1"}):
            assert _tracing.current_traceparent() == sent
    assert sent is not None
    assert f"-{caller.get_span_context().trace_id:032x}-" in sent
