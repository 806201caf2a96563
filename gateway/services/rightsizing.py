"""The fleet report: the bill, right-sized bills per method, achievable savings, over-provisioning.

Per model over a period: the hourly traffic (from the rollups), the actual spend (GPU-hours
held times price, `services/spend.py`), and for each method the model's backends run (and
plain, always): the replicas it would need hour by hour within the model's ITL objective,
from the same throughput curves that price requests (`planner/rightsize.py`), times GPUs,
hours and price. docs/costs.md defines every field and works an example by hand.

This module reads (rollups, held intervals, prices, spend); what is computed from the rows
is pure: traffic hours and pools in `services/sizing.py`, the figures in
`services/fleet_figures.py`.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gateway.db import queries
from gateway.db.tables import UsageHourly
from gateway.errors import NotFound
from gateway.registry import Snapshot
from gateway.rollups import hour_of
from gateway.schemas.reports import FleetActual, FleetNow, FleetReport
from gateway.services.fleet_figures import FleetInputs, fleet_figures
from gateway.services.sizing import (
    HOUR,
    Pool,
    Sized,
    Sizing,
    Span,
    TrafficHour,
    hours_of_traffic,
    merge_spans,
    pools,
)
from gateway.services.spend import (
    backend_entries,
    check_price_kind,
    held_intervals,
    period,
    spend,
)
from planner.rightsize import replica_capacity

__all__ = ["Sizing", "fleet_report", "pools", "traffic_hours"]  # Sizing, pools: for callers


def traffic_hours(
    session: Session,
    model: str,
    start: dt.datetime,
    end: dt.datetime,
    now: dt.datetime,
) -> list[TrafficHour]:
    """Each hour of [start, end) the model was held or had traffic, with its traffic."""
    rows = _usage_by_hour(session, model, start, end)
    # Held spans around the period: an hour's rate is its tokens over the seconds the model
    # was served in it (a stack started at :50 served its tokens in 10 minutes, not 50).
    held = _held_spans(session, model, hour_of(start), min(hour_of(end) + HOUR, now), now)
    return hours_of_traffic(rows, held, start, end, now)


def _usage_by_hour(
    session: Session, model: str, start: dt.datetime, end: dt.datetime
) -> Sequence[Sequence[Any]]:
    """The model's rollups over [start, end) as (hour, method, requests, prompt tokens,
    completion tokens, busy seconds), summed over backends and keys."""
    u = UsageHourly
    query = (
        select(
            u.hour,
            u.method,
            func.sum(u.requests),
            func.sum(u.prompt_tokens),
            func.sum(u.completion_tokens),
            func.sum(u.busy_s),
        )
        .where(u.model == model, u.hour >= hour_of(start), u.hour < end)
        .group_by(u.hour, u.method)
    )
    return session.execute(query).all()


def _held_spans(
    session: Session, model: str, start: dt.datetime, end: dt.datetime, now: dt.datetime
) -> list[Span]:
    """When any backend of the model was held, merged, within [start, end)."""
    return merge_spans(
        (max(h.start, start), min(h.end, end))
        for h in held_intervals(backend_entries(session, end), now)
        if h.description.get("model") == model and h.end > start and h.start < end
    )


def _sized(
    session: Session,
    snapshot: Snapshot,
    model: str,
    pool: Pool,
    objective: float | None,
    price_kind: str,
) -> Sized:
    capacity = replica_capacity(pool.curve, pool.gpu_count, objective)
    band = snapshot.bands[(model, pool.method, pool.gpu_type)]
    price = _price(session, pool.gpu_type, price_kind)
    return Sized(pool, capacity, price, band.relative_95(capacity.concurrency))


def _price(session: Session, gpu_type: str, kind: str) -> float | None:
    row = queries.find_price(session, gpu_type, kind)
    return None if row is None else row.usd_per_gpu_hour


def fleet_report(
    session: Session,
    snapshot: Snapshot,
    now_sizing: FleetNow | None,
    model: str,
    start: dt.datetime | None,
    end: dt.datetime | None,
    price_kind: str,
    sizing: Sizing,
    what_if_objective_ms: float | None = None,
) -> FleetReport:
    """The bill, and what the model's traffic would cost on fleets sized for it, per method
    (within the policy's ITL objective, or `what_if_objective_ms`)."""
    check_price_kind(price_kind)
    if model not in snapshot.backends and queries.find_model(session, model) is None:
        raise NotFound(f"model {model!r} not found", param="model")
    now = dt.datetime.now(dt.UTC)
    start, end = period(start, end, now)
    hours = traffic_hours(session, model, start, end, now)
    policy = snapshot.policies.get(model)
    objective = policy.itl_objective_ms if policy is not None else None
    if what_if_objective_ms is not None:
        objective = what_if_objective_ms
    served = {m for h in hours for m in h.completion_by_method}
    sized = {p.method: _sized(session, snapshot, model, p, objective, price_kind)
             for p in pools(snapshot, model, served)}  # fmt: skip
    actual = spend(session, start, end, price_kind, model=model)
    inputs = FleetInputs(
        model=model,
        start=start,
        end=end,
        price_kind=price_kind,
        sizing=sizing,
        objective=objective,
        hours=hours,
        sized=sized,
        sources={
            m: snapshot.bands[(model, m, s.pool.gpu_type)].source(s.capacity.concurrency)
            for m, s in sized.items()
        },
        backends=Counter(b.method for b in snapshot.backends.get(model, ())),
        actual=FleetActual(gpu_hours=actual.gpu_hours, spend_usd=actual.total_usd),
        now=now_sizing,
        what_if=what_if_objective_ms is not None,
    )
    return fleet_figures(inputs)
