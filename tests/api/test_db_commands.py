"""`troth db upgrade|current`, and a server refusing a PostgreSQL schema that is behind."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from _pg import admin_url, fresh_schema
from _support import start_server

from troth_server.store._migrate import head_revision

TROTH = str(Path(sys.executable).parent / "troth")


def troth_db(*args: str) -> subprocess.CompletedProcess[str]:
    """`troth db ...`, the command the README gives operators."""
    return subprocess.run(
        [TROTH, "db", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def serve(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "troth_server", "serve", "--no-auth", "--listen", "127.0.0.1:0",
         "--db", db_url, *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_server_refuses_an_empty_postgres_schema_and_names_the_command(tmp_path: Path) -> None:
    with fresh_schema(migrate=False) as url:
        done = serve(url)
        assert done.returncode == 1
        assert "the database schema is empty" in done.stderr
        assert "troth db upgrade --db postgresql+psycopg://" in done.stderr
        assert "--migrate" in done.stderr
        assert "Traceback" not in done.stderr

        current = troth_db("current", "--check", "--db", url)
        assert current.returncode == 3
        assert "(empty)" in current.stdout and "behind" in current.stdout

        upgraded = troth_db("upgrade", "--db", url)
        assert upgraded.returncode == 0, upgraded.stderr
        assert f"upgraded from an empty database to {head_revision()} (head)" in upgraded.stdout
        again = troth_db("upgrade", "--db", url)
        assert "nothing to do" in again.stdout
        current = troth_db("current", "--check", "--db", url)
        assert current.returncode == 0
        assert "at head" in current.stdout

        server = start_server(tmp_path / "s", db_url=url)
        assert server.stop() == 0


def test_migrate_flag_upgrades_a_postgres_schema_on_start(tmp_path: Path) -> None:
    with fresh_schema(migrate=False) as url:
        server = start_server(tmp_path / "s", "--migrate", db_url=url)
        assert server.stop() == 0
        assert troth_db("current", "--check", "--db", url).returncode == 0


def test_sqlite_needs_no_db_command(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    server = start_server(tmp_path / "s", db_url=url)
    assert server.stop() == 0
    current = troth_db("current", "--check", "--db", url)
    assert current.returncode == 0, current.stdout


def missing_database() -> str:
    """This run's PostgreSQL, with a database that is not there."""
    return admin_url().rsplit("/", 1)[0] + "/no_such_database"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (lambda: "mysql://u:secret@h/db", "unsupported database URL"),
        (missing_database, "does not exist"),
    ],
    ids=["mysql", "postgres-missing-database"],
)
def test_db_command_errors_are_one_clear_line(url: Callable[[], str], message: str) -> None:
    done = troth_db("current", "--db", url())
    assert done.returncode == 1
    assert message in done.stderr
    assert "secret" not in done.stderr
    assert "Traceback" not in done.stderr
