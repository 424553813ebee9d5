"""Alembic migrations shipped in `troth_server.store`: head, drift, and refusing newer schemas."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from _pg import fresh_schema
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from troth_server.store import SchemaBehind, SchemaTooNew, open_store
from troth_server.store._migrate import alembic_config, upgrade_to_head
from troth_server.store._tables import include_object_for, metadata


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database of each dialect: a new SQLite file, a new PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'm.db'}"
    else:
        with fresh_schema(migrate=False) as url:
            yield url


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    eng = sa.create_engine(db_url)
    yield eng
    eng.dispose()


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[sa.Engine]:
    eng = sa.create_engine(f"sqlite:///{tmp_path / 'm.db'}")
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
            "promise_tags",
            "tasks",
            "callbacks",
            "workflow_states",
            "schedules",
        }


def test_migrated_schema_matches_the_tables(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        upgrade_to_head(conn)
    with engine.connect() as conn:
        opts = {"compare_type": True, "include_object": include_object_for(conn.dialect.name)}
        context = MigrationContext.configure(conn, opts=opts)
        assert compare_metadata(context, metadata) == []


def test_alembic_check_finds_no_drift(engine: sa.Engine) -> None:
    """`alembic check`: autogenerate against the migrated schema finds nothing to add."""
    with engine.begin() as conn:
        upgrade_to_head(conn)
    with engine.connect() as conn:
        command.check(alembic_config(conn))


def test_migrated_schema_has_the_sweeper_index(sqlite_engine: sa.Engine) -> None:
    engine = sqlite_engine
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


def test_a_newer_schema_is_refused_with_what_to_do(db_url: str, engine: sa.Engine) -> None:
    open_store(db_url, migrate=True).close()
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '9999_from_the_future'"))

    with pytest.raises(SchemaTooNew) as caught:
        open_store(db_url, migrate=True)
    message = str(caught.value)
    assert "'9999_from_the_future'" in message
    assert repr(_head()) in message
    assert "newer version" in message
    assert "upgrade troth-server" in message
    # Refusing changed nothing.
    assert _revision(engine) == "9999_from_the_future"


def test_reopening_an_up_to_date_database_runs_no_migration(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    open_store(db_url, migrate=True).close()

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("migrations ran against an up-to-date database")

    monkeypatch.setattr(command, "upgrade", refuse)
    store = open_store(db_url, migrate=True)
    store.close()


def test_opening_an_empty_database_with_migrate_runs_the_migrations(
    db_url: str, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real_upgrade = command.upgrade

    def counting(config: object, revision: str, **kwargs: object) -> None:
        calls.append(revision)
        real_upgrade(config, revision, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(command, "upgrade", counting)
    open_store(db_url, migrate=True).close()
    open_store(db_url, migrate=True).close()
    assert calls == ["head"]
    assert _revision(engine) == _head()


def test_sqlite_the_embedded_default_always_migrates(sqlite_engine: sa.Engine) -> None:
    open_store(str(sqlite_engine.url)).close()
    assert _revision(sqlite_engine) == _head()


@pytest.mark.parametrize("behind", [None, "0001"])
def test_postgres_behind_schema_is_refused_without_migrate(behind: str | None) -> None:
    with fresh_schema(migrate=False) as url:
        if behind is not None:
            eng = sa.create_engine(url)
            with eng.begin() as conn:
                command.upgrade(alembic_config(conn), behind)
            eng.dispose()
        with pytest.raises(SchemaBehind) as caught:
            open_store(url)
        message = str(caught.value)
        assert ("empty" if behind is None else repr(behind)) in message
        assert "troth db upgrade --db postgresql+psycopg://" in message
        assert "--migrate" in message
        # Refusing changed nothing; --migrate then brings it to head.
        open_store(url, migrate=True).close()


def test_postgres_hot_tables_are_analyzed_early() -> None:
    with fresh_schema() as url:
        eng = sa.create_engine(url)
        with eng.connect() as conn:
            options = dict(
                conn.execute(
                    sa.text(
                        "SELECT relname, reloptions FROM pg_class "
                        "WHERE relnamespace = current_schema()::regnamespace AND relkind = 'r'"
                    )
                ).all()
            )
        eng.dispose()
    for table in ("promises", "tasks", "callbacks"):
        assert "autovacuum_analyze_scale_factor=0.02" in options[table], options
