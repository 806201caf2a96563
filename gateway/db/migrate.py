"""Apply Alembic migrations from code: `draftgate db upgrade` and gateway start-up."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, text

import migrations

# Any constant works; replicas starting together must agree on it.
_MIGRATION_LOCK_ID = 0x6472_6166_7467  # "draftg"


def alembic_config(connection: Connection) -> Config:
    """An Alembic config bound to an open connection, independent of the working directory."""
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    config.attributes["connection"] = connection
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Upgrade the schema; on PostgreSQL, replicas starting together take turns."""
    with engine.connect() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_lock(:id)"), {"id": _MIGRATION_LOCK_ID})
            connection.commit()
        try:
            command.upgrade(alembic_config(connection), revision)
            connection.commit()
        finally:
            if connection.dialect.name == "postgresql":
                connection.execute(
                    text("SELECT pg_advisory_unlock(:id)"), {"id": _MIGRATION_LOCK_ID}
                )
                connection.commit()


def downgrade(engine: Engine, revision: str) -> None:
    """Downgrade the schema to `revision` (`base` removes every table)."""
    with engine.connect() as connection:
        command.downgrade(alembic_config(connection), revision)
        connection.commit()


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, or None when it has none."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()
