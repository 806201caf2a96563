"""Retention: old raw usage records are deleted in batches; the rollups stay whole."""

from __future__ import annotations

import asyncio
import datetime as dt

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gateway.accounting import write_batch
from gateway.control.retention import prune, prune_forever
from gateway.db import migrate
from gateway.db.session import make_engine, make_sessionmaker
from gateway.db.tables import UsageHourly, UsageRecord
from gateway.metrics import GatewayMetrics
from tests.api.test_ledger import entry

NOW = dt.datetime.now(dt.UTC)


def _totals(sessions: sessionmaker[Session]) -> tuple[object, ...]:
    """Raw records, and the requests and cost the rollups hold."""
    with sessions() as session:
        records = session.scalar(select(func.count()).select_from(UsageRecord))
        rolled = session.scalar(select(func.sum(UsageHourly.requests)))
        cost = session.scalar(select(func.sum(UsageHourly.cost_usd))) or 0.0
    return records, rolled, round(float(cost), 9)


def test_old_records_are_pruned_in_batches_and_rollups_kept(database_url: str) -> None:
    engine = make_engine(database_url)
    try:
        migrate.upgrade(engine)
        sessions = make_sessionmaker(engine)
        old = [entry(n, created_at=NOW - dt.timedelta(days=100, minutes=n)) for n in range(7)]
        recent = [entry(100 + n, created_at=NOW - dt.timedelta(days=5)) for n in range(3)]
        write_batch(sessions, old + recent)
        assert _totals(sessions) == (10, 10, 0.01)
        metrics = GatewayMetrics()
        deleted = asyncio.run(prune(sessions, max_age_days=90, metrics=metrics, batch=3))
        assert deleted == 7  # in batches of 3, 3 and 1
        assert _totals(sessions) == (3, 10, 0.01)  # the rollups still hold all ten
        with sessions() as session:
            kept = set(session.scalars(select(UsageRecord.request_id)))
        assert kept == {"r100", "r101", "r102"}
        assert metrics.registry.get_sample_value("draftgate_usage_records_pruned_total") == 7
        assert asyncio.run(prune(sessions, max_age_days=90, metrics=metrics, batch=3)) == 0
    finally:
        engine.dispose()


def test_zero_days_keeps_every_record(database_url: str) -> None:
    engine = make_engine(database_url)
    try:
        migrate.upgrade(engine)
        sessions = make_sessionmaker(engine)
        write_batch(sessions, [entry(1, created_at=NOW - dt.timedelta(days=4000))])

        async def run_once() -> None:
            await asyncio.wait_for(
                prune_forever(sessions, 0, GatewayMetrics(), asyncio.Event()), timeout=5
            )  # returns at once: nothing to do, nothing scheduled

        asyncio.run(run_once())
        assert _totals(sessions)[0] == 1
    finally:
        engine.dispose()
