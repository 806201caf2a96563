"""The usage ledger: one record per request, queued in memory, written in batches.

The hot path only appends to a deque. A background task writes batches (bounded size and
interval) in a thread; if the database is down the batch stays queued and is retried, so
records wait (bounded by `ledger_max_pending`, the oldest dropped and counted beyond it).
Writes are idempotent by `request_id`, and a record is added to the hourly rollups in the
transaction that inserts it, so neither a retried batch nor several replicas double-count.
The rollups themselves: gateway/rollups.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict, deque

from sqlalchemy.exc import DataError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from gateway.access_log import AccessSummary
from gateway.db.session import transaction, upsert_insert
from gateway.db.tables import UsageRecord
from gateway.ledger_entry import ENTRY_FIELDS, UsageEntry
from gateway.metrics import GatewayMetrics
from gateway.rollups import add_to_rollups

logger = logging.getLogger(__name__)
RETRY_BACKOFF_MAX_S = 5.0
# A batch the database refuses for what is in it, not for being down: written row by row,
# the rows it still refuses set aside (SQLite raises OverflowError for an integer past
# 64 bits before the statement runs).
REFUSED_FOR_DATA = (DataError, IntegrityError, OverflowError)


def write_batch(sessions: sessionmaker[Session], batch: list[UsageEntry]) -> None:
    """Insert a batch and add the rows it really inserted to the hourly rollups.

    One transaction: a record and its share of the rollup land together or not at all, and
    a record already written (a retried batch) is neither inserted nor counted again.
    """
    rows = [{name: getattr(entry, name) for name in ENTRY_FIELDS} for entry in batch]
    with transaction(sessions) as session:
        statement = (  # a Core insert: the ORM's bulk path costs more than the write itself
            upsert_insert(session, UsageRecord.__table__)
            .on_conflict_do_nothing(index_elements=["request_id"])
            .returning(UsageRecord.__table__.c.request_id)
        )
        inserted = set(session.scalars(statement, rows).all())
        fresh = [e for e in batch if e.request_id in inserted]
        if fresh:
            add_to_rollups(session, fresh)


class Ledger:
    """Queue of usage records and the task that writes them."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        metrics: GatewayMetrics,
        *,
        batch_size: int,
        flush_interval_s: float,
        max_pending: int,
        access_log_interval_s: float = 60.0,
    ) -> None:
        self._sessions = sessions
        self._metrics = metrics
        self._batch_size = batch_size
        self._interval = flush_interval_s
        self._pending: deque[UsageEntry] = deque()
        self._max_pending = max_pending
        self._wake = asyncio.Event()
        # Set wherever the queue changes (not read by a function at the scrape: with worker
        # processes the scrape may be another worker's, which reads this one's from a file).
        self._pending_gauge = metrics.ledger_pending
        self._summary = AccessSummary(access_log_interval_s)

    def record(self, entry: UsageEntry) -> None:
        """Queue one record (hot path: no I/O)."""
        if len(self._pending) >= self._max_pending:
            self._pending.popleft()
            self._metrics.ledger_dropped.inc()
        self._pending.append(entry)
        self._pending_gauge.set(len(self._pending))
        if len(self._pending) >= self._batch_size:
            self._wake.set()

    def wake(self) -> None:
        """Wake the writer (to flush now, or to notice a stop)."""
        self._wake.set()

    def unwritten_usd_by_key(self) -> dict[int, float]:
        """The cost of the records not yet written, per API key and per team (under its id
        as the limiter counts it: below 0), safe from any thread.

        A record stays queued until its batch is committed, so one being written right now
        counts here too: budgets err on the side of refusing.
        """
        spend: dict[int, float] = defaultdict(float)
        for entry in self._pending.copy():  # one C call: no append can interleave
            if entry.api_key_id is not None and entry.cost_usd:
                spend[entry.api_key_id] += entry.cost_usd
                if entry.team_id is not None:
                    spend[-entry.team_id] += entry.cost_usd  # registry.team_subject
        return spend

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def run(self, stop: asyncio.Event) -> None:
        """Write batches until `stop`; keep records queued while the database is down."""
        backoff = self._interval
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), backoff)
            self._wake.clear()
            try:
                while self._pending:
                    await self.flush_once()
                backoff = self._interval
            except SQLAlchemyError as exc:
                backoff = min(backoff * 2, RETRY_BACKOFF_MAX_S)
                logger.warning("usage records not written yet (%d pending): %s", self.pending, exc)
            except Exception:  # the writer's top: whatever a batch raises, it keeps writing
                backoff = min(backoff * 2, RETRY_BACKOFF_MAX_S)
                logger.exception("usage records not written yet (%d pending)", self.pending)

    async def flush_once(self) -> None:
        """Write up to one batch; if the database is down the batch stays queued.

        A batch refused for its data (not an outage) is written row by row, and a row the
        database still refuses is set aside and logged, so one bad row never blocks the rest.
        """
        batch = [self._pending[i] for i in range(min(self._batch_size, len(self._pending)))]
        if not batch:
            return
        try:
            await asyncio.to_thread(write_batch, self._sessions, batch)
        except REFUSED_FOR_DATA:
            await asyncio.to_thread(self._write_one_by_one, batch)
        for _ in batch:
            self._pending.popleft()
        self._pending_gauge.set(len(self._pending))
        self._metrics.ledger_written.inc(len(batch))
        self._summary.add(batch)
        line = self._summary.line(time.monotonic())
        if line is not None:
            logger.info("access: %s", line)

    def _write_one_by_one(self, batch: list[UsageEntry]) -> None:
        for entry in batch:
            try:
                write_batch(self._sessions, [entry])
            except REFUSED_FOR_DATA as exc:
                self._metrics.ledger_refused.inc()
                logger.error("usage record %s refused by the database: %s", entry.request_id, exc)

    async def drain(self) -> None:
        """Write everything queued (at shutdown); gives up on a database error."""
        try:
            while self._pending:
                await self.flush_once()
        except SQLAlchemyError as exc:
            logger.error("shutdown with %d usage records unwritten: %s", self.pending, exc)
