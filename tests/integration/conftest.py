"""Fixtures for tests with worker processes: a server of their own, and a worker fleet."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _support import ServerProcess, start_server
from _workers import WorkerFleet


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A server per test (its own database), so killed workers leave nothing behind."""
    proc = start_server(tmp_path / "server", "--sweep-interval", "200ms")
    yield proc
    proc.stop()


@pytest.fixture
def fleet(
    tmp_path: Path, own_server: ServerProcess, request: pytest.FixtureRequest
) -> Iterator[WorkerFleet]:
    """Worker processes running the requesting test module as their script."""
    workers = WorkerFleet(tmp_path, str(request.module.__file__), own_server.address)
    yield workers
    workers.stop_all()
