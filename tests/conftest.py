"""Shared fixtures: real servers on free ports (one per test module), stubs, error helpers;
and the hooks of `_pg`, which decide once per run where PostgreSQL comes from."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import settings

sys.path.insert(0, str(Path(__file__).parent))

from contextlib import ExitStack
from typing import TYPE_CHECKING

from _pg import fresh_schema

# The hooks that decide, once per run, where PostgreSQL comes from, and report it.
from _pg import pytest_configure as pytest_configure
from _pg import pytest_report_header as pytest_report_header
from _pg import pytest_runtest_logreport as pytest_runtest_logreport
from _pg import pytest_runtest_makereport as pytest_runtest_makereport
from _pg import pytest_terminal_summary as pytest_terminal_summary
from _pg import pytest_unconfigure as pytest_unconfigure
from _procs import reap_all
from _support import ServerProcess, promises_stub, start_server

# Hypothesis' per-example deadline (200 ms) measures the machine, not the property:
# on a loaded machine an example of a pure function took 396 ms and failed the test
# as "flaky". Examples are bounded by their count; a slow one is not a failure.
settings.register_profile("troth", deadline=None)
settings.load_profile("troth")

if TYPE_CHECKING:
    from collections.abc import Iterator

    import grpc

    from troth.v1 import promises_pb2_grpc


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Nothing a test started outlives the session (what a test forgot is reaped)."""
    reap_all()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServerProcess]:
    """One real server per test module and back end: its own SQLite file, or its
    own schema of the machine's PostgreSQL."""
    backend = request.param
    with ExitStack() as stack:
        db_url = stack.enter_context(fresh_schema()) if backend == "postgres" else None
        proc = start_server(
            tmp_path_factory.mktemp("server"),
            "--sweep-interval",
            "200ms",
            db_url=db_url,
        )
        yield proc
        assert proc.stop() == 0, f"unclean shutdown:\n{proc.log()[-3000:]}"


@pytest.fixture(scope="module")
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    with server.channel() as ch:
        yield ch


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> promises_pb2_grpc.PromiseServiceStub:
    return promises_stub(channel)
