"""Alembic environment: uses the caller's connection, else the settings' database URL."""

from alembic import context
from sqlalchemy import Connection

from gateway.db import tables  # noqa: F401  (registers every table on Base.metadata)
from gateway.db.base import Base
from gateway.db.session import make_engine
from gateway.settings import Settings

target_metadata = Base.metadata


def run_with(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        run_with(connection)
        return
    url = context.config.get_main_option("sqlalchemy.url") or Settings().database_url
    engine = make_engine(url)
    with engine.connect() as connection:
        run_with(connection)
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run against a database")
run_migrations_online()
