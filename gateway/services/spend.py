"""Actual spend: GPU-hours each backend was held (idle included) times its price.

A backend is held from its creation (or being enabled) until it is disabled or deleted; the
audit log records those moments, so the held intervals are rebuilt from it. Prices are the
current on-demand (or chosen kind) prices of each GPU type.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.db import queries
from gateway.db.tables import AuditEntry
from gateway.reports import SpendReport, SpendRow

DEFAULT_PERIOD = dt.timedelta(days=30)
Interval = tuple[dt.datetime, dt.datetime]


def held_intervals(
    entries: list[AuditEntry], now: dt.datetime
) -> dict[str, tuple[dict[str, Any], list[Interval]]]:
    """Per backend: its last known description, and when it was enabled (from the audit log)."""
    held: dict[str, tuple[dict[str, Any], list[Interval]]] = {}
    since: dict[str, dt.datetime | None] = defaultdict(lambda: None)
    for e in entries:
        name, after = e.resource_id, e.after
        enabled = bool(after and after.get("enabled", True))
        description, intervals = held.setdefault(name, ({}, []))
        if after:
            description.update(after)
        start = since[name]
        if start is not None and not enabled:
            intervals.append((start, e.at))
            since[name] = None
        elif start is None and enabled:
            since[name] = e.at
    for name, start in since.items():
        if start is not None:
            held[name][1].append((start, now))
    return held


def _overlap_hours(intervals: list[Interval], start: dt.datetime, end: dt.datetime) -> float:
    seconds = sum(max(0.0, (min(b, end) - max(a, start)).total_seconds()) for a, b in intervals)
    return seconds / 3600


def spend(
    session: Session, start: dt.datetime | None, end: dt.datetime | None, price_kind: str
) -> SpendReport:
    """GPU-hours held and their cost per backend over [start, end) (default: the last 30 days)."""
    now = dt.datetime.now(dt.UTC)
    end = (end or now).astimezone(dt.UTC)
    start = (start or end - DEFAULT_PERIOD).astimezone(dt.UTC)
    query = (
        select(AuditEntry)
        .where(AuditEntry.resource_type == "backend", AuditEntry.at < end)
        .order_by(AuditEntry.id)
    )
    rows = []
    held = held_intervals(list(session.scalars(query)), now)
    for name, (backend, intervals) in sorted(held.items()):
        gpu_hours = _overlap_hours(intervals, start, end) * int(backend.get("gpu_count") or 1)
        price = queries.find_price(session, str(backend.get("gpu_type")), price_kind)
        rows.append(
            SpendRow(
                model=backend.get("model"),
                method=backend.get("method"),
                gpu_type=backend.get("gpu_type"),
                backend=name,
                gpu_hours=gpu_hours,
                usd=None if price is None else gpu_hours * price.usd_per_gpu_hour,
                usd_per_gpu_hour=None if price is None else price.usd_per_gpu_hour,
            )
        )
    total = sum(r.usd for r in rows if r.usd is not None)
    return SpendReport(
        start=start.isoformat(),
        end=end.isoformat(),
        price_kind=price_kind,
        data=rows,
        total_usd=total,
    )
