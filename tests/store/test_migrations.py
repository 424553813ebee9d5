"""Alembic migrations shipped in `troth_server.store`: head, drift, and refusing newer schemas."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from troth_server.store import SchemaTooNew, open_store
from troth_server.store._migrate import alembic_config, upgrade_to_head
from troth_server.store._tables import metadata


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "m.db"


@pytest.fixture
def engine(db: Path) -> Iterator[sa.Engine]:
    eng = sa.create_engine(f"sqlite:///{db}")
    yield eng
    eng.dispose()


def _head() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def _revision(engine: sa.Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def test_script_directory_has_exactly_one_head() -> None:
    scripts = ScriptDirectory.from_config(alembic_config())
    assert len(scripts.get_heads()) == 1
    assert len(scripts.get_bases()) == 1
    # Every revision is reachable from the head: no orphaned branch.
    assert {r.revision for r in scripts.walk_revisions()} == {
        r.revision for r in scripts.revision_map.iterate_revisions(_head(), "base")
    }


def test_upgrade_from_empty_to_head(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        assert sa.inspect(conn).get_table_names() == []
        upgrade_to_head(conn)
    assert _revision(engine) == _head()
    with engine.connect() as conn:
        assert set(sa.inspect(conn).get_table_names()) == {
            "alembic_version",
            "promises",
            "tasks",
            "callbacks",
        }


def test_migrated_schema_matches_the_tables(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        upgrade_to_head(conn)
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, metadata) == []


def test_migrated_schema_has_the_sweeper_index(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        upgrade_to_head(conn)
    with engine.connect() as conn:
        indexes = {i["name"]: i for i in sa.inspect(conn).get_indexes("promises")}
        sql = conn.exec_driver_sql(
            "SELECT sql FROM sqlite_master WHERE name = 'ix_promises_pending_expire_time'"
        ).scalar_one()
    assert indexes["ix_promises_pending_expire_time"]["column_names"] == ["expire_time"]
    assert "WHERE state = 'PENDING'" in sql


def test_downgrade_to_base_and_up_again(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        upgrade_to_head(conn)
        config = alembic_config(conn)
        command.downgrade(config, "base")
        assert sa.inspect(conn).get_table_names() == ["alembic_version"]
        upgrade_to_head(conn)
        assert "promises" in sa.inspect(conn).get_table_names()


def test_a_newer_schema_is_refused_with_what_to_do(db: Path, engine: sa.Engine) -> None:
    open_store(f"sqlite:///{db}").close()
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '9999_from_the_future'"))

    with pytest.raises(SchemaTooNew) as caught:
        open_store(f"sqlite:///{db}")
    message = str(caught.value)
    assert "'9999_from_the_future'" in message
    assert repr(_head()) in message
    assert "newer version" in message
    assert "upgrade troth-server" in message
    # Refusing changed nothing.
    assert _revision(engine) == "9999_from_the_future"


def test_reopening_an_up_to_date_database_runs_no_migration(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    open_store(f"sqlite:///{db}").close()

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("migrations ran against an up-to-date database")

    monkeypatch.setattr(command, "upgrade", refuse)
    store = open_store(f"sqlite:///{db}")
    store.close()


def test_opening_an_empty_file_runs_the_migrations(
    db: Path, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real_upgrade = command.upgrade

    def counting(config: object, revision: str, **kwargs: object) -> None:
        calls.append(revision)
        real_upgrade(config, revision, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(command, "upgrade", counting)
    open_store(f"sqlite:///{db}").close()
    open_store(f"sqlite:///{db}").close()
    assert calls == ["head"]
    assert _revision(engine) == _head()
