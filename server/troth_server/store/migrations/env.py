"""Alembic environment: runs on the connection the server hands in, or on sqlalchemy.url."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from troth_server.store._tables import include_object_for, metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        transaction_per_migration=True,
        compare_type=True,
        include_object=include_object_for(connection.dialect.name),
    )
    with context.begin_transaction():
        context.run_migrations()


given = context.config.attributes.get("connection")
if given is not None:
    _run(given)
else:
    engine = create_engine(context.config.get_main_option("sqlalchemy.url") or "")
    with engine.begin() as conn:
        _run(conn)
    engine.dispose()
