"""Migrations: up, down, up again, and no drift from the models, on both databases."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from gateway.db import migrate
from gateway.db.base import Base
from gateway.db.session import make_engine

TABLES = {
    "alembic_version",
    "api_keys",
    "audit_log",
    "backends",
    "benchmark_runs",
    "gpu_prices",
    "leases",
    "measurements",
    "models",
    "pools",
    "rate_windows",
    "usage_hourly",
    "usage_records",
}


def test_upgrade_downgrade_upgrade(database_url: str) -> None:
    engine = make_engine(database_url)
    try:
        migrate.upgrade(engine)
        assert set(inspect(engine).get_table_names()) == TABLES
        assert migrate.current_revision(engine) == "0019"
        migrate.downgrade(engine, "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        assert migrate.current_revision(engine) is None
        migrate.upgrade(engine)
        assert set(inspect(engine).get_table_names()) == TABLES
        migrate.upgrade(engine)  # a second upgrade is a no-op
        assert migrate.current_revision(engine) == "0019"
    finally:
        engine.dispose()


def test_models_and_migrations_agree(database_url: str) -> None:
    engine = make_engine(database_url)
    try:
        migrate.upgrade(engine)
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()
