"""Migrations: up, down, up again, and no drift from the models, on both databases."""

from __future__ import annotations

import datetime as dt

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from gateway.accounting import write_batch
from gateway.db import migrate
from gateway.db.base import Base
from gateway.db.session import make_engine, make_sessionmaker
from gateway.ledger_entry import UsageEntry

HEAD = "0026"  # the newest migration
TABLES = {
    "alembic_version",
    "api_keys",
    "audit_log",
    "backends",
    "benchmark_runs",
    "gpu_prices",
    "leases",
    "lossless_checks",
    "measurements",
    "quarantines",
    "models",
    "pools",
    "rate_windows",
    "teams",
    "usage_hourly",
    "usage_records",
}


def test_upgrade_downgrade_upgrade(database_url: str) -> None:
    engine = make_engine(database_url)
    try:
        migrate.upgrade(engine)
        assert set(inspect(engine).get_table_names()) == TABLES
        assert migrate.current_revision(engine) == HEAD
        migrate.downgrade(engine, "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        assert migrate.current_revision(engine) is None
        migrate.upgrade(engine)
        assert set(inspect(engine).get_table_names()) == TABLES
        migrate.upgrade(engine)  # a second upgrade is a no-op
        assert migrate.current_revision(engine) == HEAD
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


def test_going_back_folds_drafter_then_class_rollup_rows_together(database_url: str) -> None:
    """0021 keeps rollups per drafter, 0020 per class and rule; going back to each adds
    the rows it no longer tells apart up again."""
    engine = make_engine(database_url)
    hour = dt.datetime(2026, 12, 6, 7, tzinfo=dt.UTC)
    sql = "SELECT requests, completion_tokens, accepted_tokens FROM usage_hourly ORDER BY id"
    try:
        migrate.upgrade(engine)
        sessions = make_sessionmaker(engine)
        rows = [
            UsageEntry(f"r{n}", None, hour, None, "m", "dflash", "b", 10, 100, 200, "ok", 50.0,
                       None, 1.0, 0.001, 0.002, request_class=("interactive", "batch")[n % 2],
                       rule_index=(None, 0)[n % 2], spec_steps=10, draft_tokens=30,
                       accepted_tokens=n, drafter=("old", "new")[n // 2])
            for n in range(4)
        ]  # fmt: skip
        write_batch(sessions, rows)
        with engine.connect() as connection:
            assert len(connection.execute(text(sql)).all()) == 4
        migrate.downgrade(engine, "0020")
        with engine.connect() as connection:
            by_class = sorted(tuple(r) for r in connection.execute(text(sql)))
        assert by_class == [(2, 200, 0 + 2), (2, 200, 1 + 3)]
        migrate.downgrade(engine, "0019")
        with engine.connect() as connection:
            folded = connection.execute(text(sql)).all()
        assert [tuple(r) for r in folded] == [(4, 400, 0 + 1 + 2 + 3)]
        migrate.upgrade(engine)
        assert migrate.current_revision(engine) == HEAD
    finally:
        engine.dispose()
