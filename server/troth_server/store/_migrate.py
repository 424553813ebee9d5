"""Runs the Alembic migrations shipped in this package, programmatically."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError

from troth_server.store import SchemaTooNew

if TYPE_CHECKING:
    from sqlalchemy import Connection

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade_to_head(connection: Connection) -> None:
    """Bring the schema to this server's head; refuse a schema from a newer server."""
    config = alembic_config(connection)
    scripts = ScriptDirectory.from_config(config)
    current = MigrationContext.configure(connection).get_current_revision()
    if current is not None and not _known(scripts, current):
        raise SchemaTooNew(
            f"the database schema is at revision {current!r}, which this troth-server "
            f"does not know (its newest is {scripts.get_current_head()!r}): it was "
            "migrated by a newer version. Run that version or upgrade troth-server"
        )
    if current != scripts.get_current_head():
        command.upgrade(config, "head")


def _known(scripts: ScriptDirectory, revision: str) -> bool:
    try:
        return scripts.get_revision(revision) is not None
    except CommandError:
        return False
