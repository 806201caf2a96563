"""Retention: raw usage records older than `usage_retention_days` are deleted in batches.

The hourly rollups keep every figure the savings, spend and fleet reports read, so only the
per-request listing (`GET /admin/v1/usage`) loses the old rows. Each batch is its own short
transaction, so the ledger's writes are never held up behind one long delete; every replica
may prune (a row deleted twice is deleted once).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging

from sqlalchemy import delete, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from gateway.db.session import transaction
from gateway.db.tables import UsageRecord
from gateway.metrics import GatewayMetrics

logger = logging.getLogger(__name__)
BATCH = 5000  # rows per delete
INTERVAL_S = 3600.0  # between prunes (and one at start)


def prune_batch(sessions: sessionmaker[Session], before: dt.datetime, batch: int) -> int:
    """Delete up to `batch` of the oldest records created before `before`; how many."""
    with transaction(sessions) as session:
        oldest = (
            select(UsageRecord.id)
            .where(UsageRecord.created_at < before)
            .order_by(UsageRecord.id)
            .limit(batch)
        )
        ids = list(session.scalars(oldest))
        if ids:
            session.execute(delete(UsageRecord).where(UsageRecord.id.in_(ids)))
        return len(ids)


async def prune(
    sessions: sessionmaker[Session], max_age_days: float, metrics: GatewayMetrics, batch: int
) -> int:
    """Delete every record older than `max_age_days`, batch by batch; how many."""
    before = dt.datetime.now(dt.UTC) - dt.timedelta(days=max_age_days)
    total = 0
    while (deleted := await asyncio.to_thread(prune_batch, sessions, before, batch)) > 0:
        total += deleted
        metrics.usage_pruned.inc(deleted)
        if deleted < batch:
            break
    return total


async def prune_forever(
    sessions: sessionmaker[Session],
    max_age_days: float,
    metrics: GatewayMetrics,
    stop: asyncio.Event,
    interval_s: float = INTERVAL_S,
    batch: int = BATCH,
) -> None:
    """Prune at start and every `interval_s` until `stop`; nothing when `max_age_days` is 0."""
    if max_age_days <= 0:
        return
    while not stop.is_set():
        try:
            if deleted := await prune(sessions, max_age_days, metrics, batch):
                logger.info("pruned %d usage records older than %g days", deleted, max_age_days)
        except SQLAlchemyError as exc:  # the database is away: try again next round
            logger.warning("usage records not pruned this round: %s", exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
