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

    class Tracer:
        @contextlib.contextmanager
        def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
            yield None

    monkeypatch.setattr(trace, "get_tracer_provider", lambda: object())  # one is set
    monkeypatch.setattr(trace, "get_tracer", lambda *args, **kwargs: Tracer())
    monkeypatch.setattr(metadata, "version", counting)
    _tracing._version.cache_clear()
    for _ in range(5):
        with _tracing.step_span(**{"troth.step.id": "wf.1"}):
            pass
    assert reads.count("troth") <= 1
