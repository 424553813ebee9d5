"""Where the suite's PostgreSQL comes from (tests/_pg.py), each case proven by running
pytest in a subprocess on a tiny probe: no PostgreSQL at all (skipped, one loud
line), the same under CI=true (failed, saying why), binaries but no server (a
throwaway cluster, shared by the xdist workers, stopped at the end, and by its
watchdog if the run is killed), and TROTH_TEST_PG given.

The machine's default server is hidden by pointing TROTH_TEST_PG_DEFAULT at a
closed port; the binaries by pointing TROTH_PG_BIN at an empty directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from _pg import DECISION_ENV, DEFAULT_ENV, URL_ENV, admin_url, skip_without_binaries
from _pg_cluster import PG_BIN_ENV, free_port, pg_bindir
from _support import eventually

TESTS = Path(__file__).resolve().parents[1]

CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from _pg import pytest_configure as pytest_configure
from _pg import pytest_report_header as pytest_report_header
from _pg import pytest_runtest_logreport as pytest_runtest_logreport
from _pg import pytest_runtest_makereport as pytest_runtest_makereport
from _pg import pytest_terminal_summary as pytest_terminal_summary
from _pg import pytest_unconfigure as pytest_unconfigure
"""

PROBE = """
import os
import signal

import pytest
from _pg import admin, admin_url, decision, fresh_schema


@pytest.fixture
def schema():
    with fresh_schema(migrate=False) as url:
        yield url


def test_through_a_fixture(schema):
    assert "search_path" in schema


@pytest.mark.parametrize("n", range(4))
def test_uses_postgres(n):
    with admin() as conn:
        (data,) = conn.execute("SHOW data_directory").fetchone()
    with open(os.environ["PROBE_OUT"], "a") as out:
        out.write(f"{os.getpid()} {admin_url()} {data} {decision().state_dir or '-'}\\n")
    if os.environ.get("PROBE_DIE"):
        os.kill(os.getpid(), signal.SIGKILL)  # the run is killed: nothing of ours cleans up


def test_needs_nothing():
    pass
"""


def probe(
    tmp_path: Path, *args: str, **env: str
) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    """Run the probe under pytest with `env` over a clean environment: what it
    printed, and one `pid url data_directory` row per PostgreSQL test that ran."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_probe.py").write_text(PROBE)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    out = tmp_path / "out"
    out.unlink(missing_ok=True)
    drop = {URL_ENV, DEFAULT_ENV, DECISION_ENV, PG_BIN_ENV, "CI", "PYTEST_ADDOPTS"}
    clean = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PYTEST_")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
         "-ra", "-q", *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=240,
        env={**clean, "PROBE_OUT": str(out), **env},
    )  # fmt: skip
    rows = [line.split() for line in out.read_text().splitlines()] if out.exists() else []
    return done, rows


def hidden(tmp_path: Path) -> dict[str, str]:
    """No default server (a closed port) and no binaries (an empty directory)."""
    empty = tmp_path / "no-binaries"
    empty.mkdir(exist_ok=True)
    return {
        DEFAULT_ENV: f"postgresql://postgres@127.0.0.1:{free_port()}/test",
        PG_BIN_ENV: str(empty),
    }


def test_without_postgres_every_postgres_test_is_skipped_with_one_loud_line(tmp_path: Path) -> None:
    done, rows = probe(tmp_path, "-n", "2", **hidden(tmp_path))
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "1 passed, 5 skipped" in output, output
    loud = [line for line in output.splitlines() if "PostgreSQL tests SKIPPED" in line]
    assert len(loud) == 1, output
    assert "5 PostgreSQL tests SKIPPED" in loud[0]
    # -ra folds the skips, a fixture's too, into one line.
    assert len([line for line in output.splitlines() if line.startswith("SKIPPED")]) == 1
    assert "install the PostgreSQL server binaries" in loud[0] and f"{URL_ENV}=" in loud[0]
    assert rows == []


def test_under_ci_the_postgres_tests_fail_saying_why(tmp_path: Path) -> None:
    done, rows = probe(tmp_path, "-n", "0", CI="true", **hidden(tmp_path))
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "4 failed, 1 passed, 1 error" in output, output
    assert "5 PostgreSQL tests FAILED: CI=true requires the PostgreSQL tests" in output, output
    assert "Traceback" not in output
    assert rows == []


def test_with_binaries_and_no_server_the_run_starts_one_cluster_and_stops_it(
    tmp_path: Path,
) -> None:
    if pg_bindir() is None:
        skip_without_binaries("needs initdb and pg_ctl to start a cluster")
    closed = f"postgresql://postgres@127.0.0.1:{free_port()}/test"
    # --dist each: every worker runs every test, so both need PostgreSQL.
    done, rows = probe(tmp_path, "-n", "2", "--dist", "each", **{DEFAULT_ENV: closed})
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "12 passed" in output, output
    assert len(rows) == 8, output
    assert len({row[0] for row in rows}) == 2, f"both workers ran PostgreSQL tests: {rows}"
    urls = {row[1] for row in rows}
    assert len(urls) == 1, f"one cluster shared by the workers: {rows}"
    (url,) = urls
    assert url != closed
    # Stopped and removed at the end of the run.
    data, state_dir = Path(rows[0][2]), Path(rows[0][3])
    assert not data.exists(), f"{data} left behind"
    assert not state_dir.exists(), f"{state_dir} left behind"
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=5).close()


def test_a_killed_run_has_its_cluster_stopped_by_the_watchdog(tmp_path: Path) -> None:
    if pg_bindir() is None:
        skip_without_binaries("needs initdb and pg_ctl to start a cluster")
    closed = f"postgresql://postgres@127.0.0.1:{free_port()}/test"
    done, rows = probe(
        tmp_path, "-n", "0", "-k", "uses_postgres", PROBE_DIE="1", **{DEFAULT_ENV: closed}
    )
    assert done.returncode == -9, done.stdout + done.stderr
    (_, url, data, state_dir) = rows[0]

    def stopped() -> bool:
        try:
            psycopg.connect(url, connect_timeout=5).close()
        except psycopg.OperationalError:
            return not Path(data).exists() and not Path(state_dir).exists()
        return False

    eventually(stopped, timeout=60, what=f"the killed run's cluster ({url}) to be stopped")


def test_troth_test_pg_is_used_as_given(tmp_path: Path) -> None:
    given = admin_url()  # this run's PostgreSQL, whichever it is (skips without one)
    done, rows = probe(tmp_path, "-n", "0", **{URL_ENV: given}, **hidden(tmp_path))
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "6 passed" in output, output
    assert {row[1] for row in rows} == {given}
