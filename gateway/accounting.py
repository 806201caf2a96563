"""The usage ledger: one record per request, queued in memory, written in batches.

The hot path only appends to a deque. A background task writes batches (bounded size and
interval) in a thread; if the database is down the batch stays queued and is retried, so
records wait (bounded by `ledger_max_pending`, the oldest dropped and counted beyond it).
Writes are idempotent by `request_id`, and a record is added to the hourly rollups in the
transaction that inserts it, so neither a retried batch nor several replicas double-count.
`recompute_hour` rebuilds an hour's rollups from the records, for repairs.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from sqlalchemy import Select, case, func, select
from sqlalchemy.exc import DataError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from gateway.access_log import AccessSummary
from gateway.db.session import transaction, upsert_insert
from gateway.db.tables import UsageHourly, UsageRecord
from gateway.metrics import GatewayMetrics

logger = logging.getLogger(__name__)
RETRY_BACKOFF_MAX_S = 5.0
# A batch the database refuses for what is in it, not for being down: written row by row,
# the rows it still refuses set aside (SQLite raises OverflowError for an integer past
# 64 bits before the statement runs).
REFUSED_FOR_DATA = (DataError, IntegrityError, OverflowError)


@dataclass(slots=True)
class UsageEntry:
    """One request as the ledger records it."""

    request_id: str  # unique, made by the gateway
    client_request_id: str | None
    created_at: dt.datetime
    api_key_id: int | None
    model: str
    method: str | None
    backend_name: str | None
    prompt_tokens: int
    completion_tokens: int
    status_code: int
    outcome: str  # ok, client_error, upstream_error, client_disconnect, client_stalled, rejected
    latency_ms: float
    ttft_ms: float | None
    concurrency: float | None
    cost_usd: float | None
    baseline_cost_usd: float | None
    curve_source: str | None = None  # measured / estimated / gpu_time; None when not priced
    # 95% half-widths of cost_usd and baseline_cost_usd, from their curves' bands
    cost_error_usd: float | None = None
    baseline_error_usd: float | None = None
    # The $/1M prompt tokens both costs include (None: prompts unpriced)
    prompt_usd_per_mtok: float | None = None
    tokens_estimated: bool = False  # the counts are the gateway's estimate, not the backend's
    # Of the prompt tokens, those the backend read from its prefix cache (None: not said)
    cached_prompt_tokens: int | None = None
    # The id of the response the backend stored (the Responses API), so a later turn finds it
    response_id: str | None = None
    # Its own speculative decoding, where the engine reported it (vLLM's per-request spec
    # decode metrics): verify steps, draft tokens proposed and accepted; None: not reported
    spec_steps: int | None = None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    request_class: str | None = None  # None: refused before its class was known
    rule_index: int | None = None  # the policy rule that routed it, by position; None: none
    # Its class's acceptance priced it: the method's $/1M output times this (None: the average)
    acceptance_factor: float | None = None
    drafter: str | None = None  # the drafter of the backend that served it
    # Its drafter's own windows priced it: the curve's $/1M output times this (None: the curve)
    drafter_factor: float | None = None
    # Its own context's correction (gateway/context.py), included in cost_usd and in
    # baseline_cost_usd (None: not priced at its context)
    context_usd: float | None = None
    baseline_context_usd: float | None = None


def prefill_saved_by_cache_usd(entry: UsageEntry) -> float:
    """The prefill its cache hits skipped, at the prompt price it was given (0 unpriced)."""
    if not entry.cached_prompt_tokens or entry.prompt_usd_per_mtok is None:
        return 0.0
    return entry.cached_prompt_tokens * entry.prompt_usd_per_mtok / 1e6


ENTRY_FIELDS = tuple(f.name for f in fields(UsageEntry))


def hour_of(moment: dt.datetime) -> dt.datetime:
    """The UTC hour a moment falls in."""
    return moment.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)


# _rollup_key's order
ROLLUP_KEY = [
    "hour", "model", "method", "backend_name", "api_key_id", "request_class", "rule_index",
    "drafter",
]  # fmt: skip
ROLLUP_VALUES = [
    "requests",
    "errors",
    "prompt_tokens",
    "completion_tokens",
    "cost_usd",
    "baseline_cost_usd",
    "busy_s",
    "cost_error_usd",
    "baseline_error_usd",
    "cached_prompt_tokens",
    "prefill_saved_by_cache_usd",
    "spec_steps",
    "draft_tokens",
    "accepted_tokens",
    "spec_requests",
    "accepted_sq",
    "accepted_steps",
    "steps_sq",
]
RollupKey = tuple[dt.datetime, str, str, str, int, str, int, str]


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


def _rollup_key(e: UsageEntry) -> RollupKey:
    rule = -1 if e.rule_index is None else e.rule_index
    method, backend, key = e.method or "", e.backend_name or "", e.api_key_id or 0
    hour, kind = hour_of(e.created_at), e.request_class or ""
    return hour, e.model, method, backend, key, kind, rule, e.drafter or ""


def add_to_rollups(session: Session, entries: list[UsageEntry]) -> None:
    """Increment the hourly rollup rows by these (newly inserted) records."""
    sums: dict[RollupKey, list[float]] = {}
    for e in entries:
        total = sums.setdefault(_rollup_key(e), [0] * len(ROLLUP_VALUES))
        total[0] += 1
        total[1] += e.status_code >= 400
        total[2] += e.prompt_tokens
        total[3] += e.completion_tokens
        total[4] += e.cost_usd or 0.0
        total[5] += e.baseline_cost_usd or 0.0
        total[6] += e.latency_ms / 1000
        total[7] += e.cost_error_usd or 0.0
        total[8] += e.baseline_error_usd or 0.0
        total[9] += e.cached_prompt_tokens or 0
        total[10] += prefill_saved_by_cache_usd(e)
        total[11] += e.spec_steps or 0
        total[12] += e.draft_tokens or 0
        total[13] += e.accepted_tokens or 0
        if e.spec_steps and e.accepted_tokens is not None:  # a step or more: a sample
            steps, accepted = e.spec_steps, e.accepted_tokens
            total[14] += 1
            total[15] += accepted * accepted
            total[16] += accepted * steps
            total[17] += steps * steps
    rows = [
        dict(zip(ROLLUP_KEY, key, strict=True)) | dict(zip(ROLLUP_VALUES, values, strict=True))
        for key, values in sums.items()
    ]
    table = UsageHourly.__table__
    statement = upsert_insert(session, table)
    statement = statement.on_conflict_do_update(
        index_elements=ROLLUP_KEY,
        set_={name: table.c[name] + statement.excluded[name] for name in ROLLUP_VALUES},
    )
    session.execute(statement, rows)


def recompute_hour(session: Session, hour: dt.datetime) -> None:
    """Set the hourly rollup rows of `hour` from the usage records (idempotent). Never for
    an hour older than `usage_retention_days`: its records are pruned, its rollups are not."""
    rows = [_rollup_row(hour, group) for group in session.execute(_sums_of_hour(hour))]
    if rows:
        statement = upsert_insert(session, UsageHourly)
        statement = statement.on_conflict_do_update(
            index_elements=ROLLUP_KEY,
            set_={name: getattr(statement.excluded, name) for name in ROLLUP_VALUES},
        )
        session.execute(statement, rows)


def _sums_of_hour(hour: dt.datetime) -> Select[*tuple[Any, ...]]:
    """The usage records of `hour` summed per rollup row: its dimensions (method, backend,
    key, class, rule, drafter, model), then its values in `ROLLUP_VALUES`' order."""
    end = hour + dt.timedelta(hours=1)
    r = UsageRecord
    # The same expression objects in SELECT and GROUP BY, so PostgreSQL sees one expression.
    dimensions = (
        func.coalesce(r.method, ""),
        func.coalesce(r.backend_name, ""),
        func.coalesce(r.api_key_id, 0),
        func.coalesce(r.request_class, ""),
        func.coalesce(r.rule_index, -1),
        func.coalesce(r.drafter, ""),
        r.model,
    )
    reported = (r.spec_steps > 0) & r.accepted_tokens.is_not(None)
    accepted, steps = r.accepted_tokens * 1.0, r.spec_steps * 1.0  # floats: no overflow
    return (
        select(
            *dimensions,
            func.count(),
            func.sum(case((r.status_code >= 400, 1), else_=0)),
            func.sum(r.prompt_tokens),
            func.sum(r.completion_tokens),
            func.coalesce(func.sum(r.cost_usd), 0.0),
            func.coalesce(func.sum(r.baseline_cost_usd), 0.0),
            func.coalesce(func.sum(r.latency_ms), 0.0) / 1000,
            func.coalesce(func.sum(r.cost_error_usd), 0.0),
            func.coalesce(func.sum(r.baseline_error_usd), 0.0),
            func.coalesce(func.sum(r.cached_prompt_tokens), 0),
            func.coalesce(func.sum(r.cached_prompt_tokens * r.prompt_usd_per_mtok / 1e6), 0.0),
            func.coalesce(func.sum(r.spec_steps), 0),
            func.coalesce(func.sum(r.draft_tokens), 0),
            func.coalesce(func.sum(r.accepted_tokens), 0),
            func.sum(case((reported, 1), else_=0)),
            func.coalesce(func.sum(accepted * accepted), 0.0),
            func.coalesce(func.sum(accepted * steps), 0.0),
            func.coalesce(func.sum(steps * steps), 0.0),
        )
        .where(r.created_at >= hour, r.created_at < end)
        .group_by(*dimensions)
    )


def _rollup_row(hour: dt.datetime, group: Sequence[Any]) -> dict[str, Any]:
    """One row of `_sums_of_hour` as the rollup row of `hour` it sets."""
    (
        method, backend, key, request_class, rule, drafter, model, n, errors, prompt,
        completion, cost, baseline, busy, cost_error, baseline_error, cached, saved, spec_steps,
        drafted, accepted, spec_requests, accepted_sq, accepted_steps, steps_sq,
    ) = group  # fmt: skip
    return {
        "hour": hour,
        "method": method,
        "backend_name": backend,
        "api_key_id": key,
        "request_class": request_class,
        "rule_index": rule,
        "drafter": drafter,
        "model": model,
        "requests": n,
        "errors": errors or 0,
        "prompt_tokens": prompt or 0,
        "completion_tokens": completion or 0,
        "cost_usd": cost,
        "baseline_cost_usd": baseline,
        "busy_s": busy,
        "cost_error_usd": cost_error,
        "baseline_error_usd": baseline_error,
        "cached_prompt_tokens": cached,
        "prefill_saved_by_cache_usd": saved,
        "spec_steps": spec_steps,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "spec_requests": spec_requests or 0,
        "accepted_sq": accepted_sq,
        "accepted_steps": accepted_steps,
        "steps_sq": steps_sq,
    }


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
        """The cost of the records not yet written, per API key (safe from any thread).

        A record stays queued until its batch is committed, so one being written right now
        counts here too: budgets err on the side of refusing.
        """
        spend: dict[int, float] = defaultdict(float)
        for entry in self._pending.copy():  # one C call: no append can interleave
            if entry.api_key_id is not None and entry.cost_usd:
                spend[entry.api_key_id] += entry.cost_usd
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
