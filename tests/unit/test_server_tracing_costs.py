"""What the server's tracing costs while no tracer provider is set: each RPC and each
queued write asks `tracer()` first, which asks OpenTelemetry (an environment read)
at most once a second, and nothing else."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opentelemetry import trace

from troth_server import _tracing

if TYPE_CHECKING:
    import pytest


def test_without_a_provider_opentelemetry_is_asked_once_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[object] = []

    def no_provider() -> trace.TracerProvider:
        asked.append(None)
        return trace.ProxyTracerProvider()

    monkeypatch.setattr(trace, "get_tracer_provider", no_provider)
    monkeypatch.setattr(_tracing, "_tracer", None)
    monkeypatch.setattr(_tracing, "_next_look", 0.0)
    assert all(_tracing.tracer() is None for _ in range(10_000))
    assert len(asked) == 1
    _tracing.look_again()  # a provider was just set: asked at once
    assert _tracing.tracer() is None
    assert len(asked) == 2
