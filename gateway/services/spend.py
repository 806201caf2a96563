"""Actual spend: GPU-hours each backend was held (idle included) times its price.

A backend is held from its creation (or being enabled) until it is disabled, deleted or
stopped with the stack that started it; the audit log records those moments, so the held
intervals are rebuilt from it, each with the GPU type and count in force during it (a
backend moved from 1 to 8 GPUs is billed 1 GPU before the change and 8 after). Prices are the
current prices of the asked kind for each GPU type; no price means no figure (`null`),
never $0.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, get_args

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.db import queries
from gateway.db.tables import AuditEntry
from gateway.errors import ValidationFailed
from gateway.schemas.reports import SpendReport, SpendRow
from gateway.schemas.resources import PriceKind

DEFAULT_PERIOD = dt.timedelta(days=30)
# Audit entries of a backend that describe another one (the switched-in backend has a
# `create` of its own); the switched-out one is held until its `delete`, after the drain.
NOT_ITS_STATE = frozenset({"switch", "switch-failed"})


@dataclass(frozen=True, slots=True)
class Held:
    """One interval a backend was enabled, with its description during it."""

    backend: str
    start: dt.datetime
    end: dt.datetime
    description: dict[str, Any]

    @property
    def gpu_count(self) -> int:
        return int(self.description.get("gpu_count") or 1)

    def hours_within(self, start: dt.datetime, end: dt.datetime) -> float:
        """Hours of this interval inside [start, end)."""
        return max(0.0, (min(self.end, end) - max(self.start, start)).total_seconds()) / 3600


def check_price_kind(price_kind: str) -> None:
    """Raise ValidationFailed naming the known price kinds."""
    kinds = get_args(PriceKind)
    if price_kind not in kinds:
        raise ValidationFailed(
            f"price_kind must be one of {', '.join(kinds)}; got {price_kind!r}",
            param="price_kind",
        )


def held_intervals(entries: Iterable[AuditEntry], now: dt.datetime) -> list[Held]:
    """Every interval each backend was enabled, from its audit entries in order."""
    held: list[Held] = []
    open_since: dict[str, tuple[dt.datetime, dict[str, Any]]] = {}
    for e in entries:
        if e.action in NOT_ITS_STATE:
            continue
        name, after = e.resource_id, e.after
        if name in open_since:  # any change closes the interval; an enabled state reopens it
            start, description = open_since.pop(name)
            held.append(Held(name, start, e.at, description))
        if after and after.get("enabled", True):
            open_since[name] = (e.at, dict(after))
    held += [Held(name, start, now, d) for name, (start, d) in open_since.items()]
    return held


def backend_entries(session: Session, before: dt.datetime) -> list[AuditEntry]:
    """Every backend audit entry before `before`, oldest first."""
    query = (
        select(AuditEntry)
        .where(AuditEntry.resource_type == "backend", AuditEntry.at < before)
        .order_by(AuditEntry.id)
    )
    return list(session.scalars(query))


def period(
    start: dt.datetime | None, end: dt.datetime | None, now: dt.datetime
) -> tuple[dt.datetime, dt.datetime]:
    """[start, end) in UTC; the last 30 days up to now by default."""
    end = (end or now).astimezone(dt.UTC)
    return (start or end - DEFAULT_PERIOD).astimezone(dt.UTC), end


def spend(
    session: Session,
    start: dt.datetime | None,
    end: dt.datetime | None,
    price_kind: str,
    model: str | None = None,
) -> SpendReport:
    """GPU-hours held and their cost per backend and GPU configuration over [start, end)."""
    check_price_kind(price_kind)
    now = dt.datetime.now(dt.UTC)
    start, end = period(start, end, now)
    hours: dict[tuple[str, str, str, str, int], float] = defaultdict(float)
    for h in held_intervals(backend_entries(session, end), now):
        d = h.description
        if model is not None and d.get("model") != model:
            continue
        key = (h.backend, str(d.get("model")), str(d.get("method")), str(d.get("gpu_type")))
        hours[(*key, h.gpu_count)] += h.hours_within(start, end) * h.gpu_count
    rows = []
    for (name, model_name, method, gpu_type, gpu_count), gpu_hours in sorted(hours.items()):
        price = queries.find_price(session, gpu_type, price_kind)
        rows.append(
            SpendRow(
                model=model_name,
                method=method,
                gpu_type=gpu_type,
                gpu_count=gpu_count,
                backend=name,
                gpu_hours=gpu_hours,
                usd=None if price is None else gpu_hours * price.usd_per_gpu_hour,
                usd_per_gpu_hour=None if price is None else price.usd_per_gpu_hour,
            )
        )
    unpriced = sum(r.gpu_hours for r in rows if r.usd is None)
    return SpendReport(
        start=start.isoformat(),
        end=end.isoformat(),
        price_kind=price_kind,
        data=rows,
        gpu_hours=sum(r.gpu_hours for r in rows),
        total_usd=None if unpriced > 0 else sum(r.usd or 0.0 for r in rows),
        unpriced_gpu_hours=unpriced,
    )
