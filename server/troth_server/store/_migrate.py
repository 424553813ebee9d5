"""Runs the Alembic migrations shipped in this package, programmatically."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError

from troth_server.store import SchemaBehind, SchemaTooNew, StoreError, StoreUnavailable
from troth_server.store._engines import require_postgres_driver

if TYPE_CHECKING:
    from collections.abc import Iterator

    from sqlalchemy import Connection

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


# Any fixed key: replicas started together with --migrate take turns.
_MIGRATION_LOCK = 0x7472_6F74_6800  # "troth"


def current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def check_at_head(connection: Connection, url: str) -> None:
    """Refuse a schema that is behind (or ahead of) this server: migrating is an
    operator's decision when the database is shared."""
    current = current_revision(connection)
    _refuse_unknown(ScriptDirectory.from_config(alembic_config()), current)
    head = head_revision()
    if current != head:
        where = "empty" if current is None else f"at revision {current!r}"
        raise SchemaBehind(
            f"the database schema is {where}, and this troth-server needs {head!r}: run "
            f"`troth db upgrade --db {_shown(url)}` first, or start the server with --migrate"
        )


def upgrade_to_head(connection: Connection) -> None:
    """Bring the schema to this server's head; refuse a schema from a newer server."""
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})")
    config = alembic_config(connection)
    scripts = ScriptDirectory.from_config(config)
    current = current_revision(connection)
    _refuse_unknown(scripts, current)
    if current != scripts.get_current_head():
        command.upgrade(config, "head")


def _refuse_unknown(scripts: ScriptDirectory, current: str | None) -> None:
    if current is not None and not _known(scripts, current):
        raise SchemaTooNew(
            f"the database schema is at revision {current!r}, which this troth-server "
            f"does not know (its newest is {scripts.get_current_head()!r}): it was "
            "migrated by a newer version. Run that version or upgrade troth-server"
        )


def _known(scripts: ScriptDirectory, revision: str) -> bool:
    try:
        return scripts.get_revision(revision) is not None
    except CommandError:
        return False


def _shown(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def upgrade_database(url: str) -> tuple[str | None, str]:
    """`troth db upgrade`: (revision before, revision after)."""
    with _connection(url) as conn:
        before = current_revision(conn)
        upgrade_to_head(conn)
        return before, head_revision()


def schema_status(url: str) -> tuple[str | None, str]:
    """`troth db current`: (the database's revision, this server's head)."""
    with _connection(url) as conn:
        revision = current_revision(conn)
        _refuse_unknown(ScriptDirectory.from_config(alembic_config()), revision)
        return revision, head_revision()


@contextmanager
def _connection(url: str) -> Iterator[Connection]:
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import DBAPIError

    parsed = make_url(url)
    if parsed.get_backend_name() == "postgresql":
        require_postgres_driver()
        parsed = parsed.set(drivername="postgresql+psycopg")
    elif parsed.get_backend_name() != "sqlite":
        raise StoreError(f"unsupported database URL {_shown(url)!r}")
    engine = create_engine(parsed)
    try:
        with engine.begin() as conn:
            yield conn
    except DBAPIError as exc:
        raise StoreUnavailable(f"cannot open {_shown(url)}: {exc.orig}") from exc
    finally:
        engine.dispose()
