"""The lossless watchdog's report: how often served answers differed from their replays on
the model's reference method, per model and serving configuration, over a period.

Counts are summed in the database; only the diverged checks are read, for where they first
differ. Every rate carries its 95% Wilson score interval (sound at 0 of n, where the normal
interval collapses to a point) and stands beside its model's floor: the checks of a method
against itself, which floating-point nondeterminism across batches alone can make differ.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, case, func, select
from sqlalchemy.orm import Session

from gateway.db.tables import LosslessCheck, UsageRecord
from gateway.schemas.reports import (
    FirstDivergence,
    LosslessFloor,
    LosslessGroup,
    LosslessModel,
    LosslessReplays,
    LosslessReport,
)
from gateway.services.spend import period

REPLAY_CLASS = "lossless-replay"  # the request class the watchdog records its replays under
Z_95 = 1.959964  # the standard normal's 97.5th percentile
# What a group is: the model, the served answer's configuration and the replay's method
GROUP = (
    LosslessCheck.model,
    LosslessCheck.method,
    LosslessCheck.k,
    LosslessCheck.drafter,
    LosslessCheck.backend_name,
    LosslessCheck.engine_version,
    LosslessCheck.reference_method,
)
GroupKey = tuple[Any, ...]  # the values of GROUP, in its order


def wilson_interval(divergences: int, samples: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of the proportion divergences / samples (samples > 0)."""
    p = divergences / samples
    shrink = 1 + z * z / samples
    center = (p + z * z / (2 * samples)) / shrink
    half = z / shrink * math.sqrt(p * (1 - p) / samples + z * z / (4 * samples * samples))
    return max(0.0, center - half), min(1.0, center + half)  # rounding aside, within [0, 1]


def quantile(ordered: Sequence[int], q: float) -> float:
    """The q-quantile of sorted values, linearly interpolated between ranks."""
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def first_divergence(diverged: Sequence[tuple[str, int]]) -> FirstDivergence | None:
    """Where diverged checks first differ, from each one's (unit, common_prefix)."""
    if not diverged:
        return None
    units = {unit for unit, _ in diverged}
    ordered = sorted(prefix for _, prefix in diverged)
    return FirstDivergence(
        unit=units.pop() if len(units) == 1 else "mixed",
        min=ordered[0],
        p25=quantile(ordered, 0.25),
        p50=quantile(ordered, 0.5),
        p75=quantile(ordered, 0.75),
        max=ordered[-1],
    )


@dataclass(frozen=True)
class Window:
    """Which checks and replays: [start, end), of one model or of all."""

    start: dt.datetime
    end: dt.datetime
    model: str | None = None

    def checks(self, *columns: Any) -> Select[Any]:
        c = LosslessCheck
        query = select(*columns).where(c.created_at >= self.start, c.created_at < self.end)
        return query if self.model is None else query.where(c.model == self.model)

    def replays(self, *columns: Any) -> Select[Any]:
        r = UsageRecord
        query = select(*columns).where(
            r.request_class == REPLAY_CLASS, r.created_at >= self.start, r.created_at < self.end
        )
        return query if self.model is None else query.where(r.model == self.model)


def _diverged(session: Session, window: Window) -> dict[GroupKey, list[tuple[str, int]]]:
    """Each group's diverged checks, as (unit, common_prefix)."""
    c = LosslessCheck
    query = window.checks(*GROUP, c.unit, c.common_prefix).where(c.diverged)
    found: dict[GroupKey, list[tuple[str, int]]] = defaultdict(list)
    for row in session.execute(query):
        found[tuple(row[: len(GROUP)])].append((row.unit, row.common_prefix))
    return found


def _groups(session: Session, window: Window) -> dict[str, list[LosslessGroup]]:
    """Each model's groups, their counts summed in the database."""
    c = LosslessCheck
    diverged = _diverged(session, window)
    query = window.checks(
        *GROUP,
        func.count(),
        func.sum(case((c.diverged, 1), else_=0)),
        func.sum(case((c.unit == "token", 1), else_=0)),
        func.min(c.created_at),
        func.max(c.created_at),
    ).group_by(*GROUP)
    groups: dict[str, list[LosslessGroup]] = defaultdict(list)
    for row in session.execute(query):
        key = tuple(row[: len(GROUP)])
        groups[key[0]].append(_group(key, row[len(GROUP) :], diverged.get(key, [])))
    return groups


def _group(key: GroupKey, sums: Sequence[Any], diverged: list[tuple[str, int]]) -> LosslessGroup:
    _, method, k, drafter, backend, engine_version, reference_method = key
    samples, divergences, by_tokens = int(sums[0]), int(sums[1]), int(sums[2])
    first_seen, last_seen = sums[3], sums[4]
    return LosslessGroup(
        method=method,
        k=k,
        drafter=drafter,
        backend=backend,
        engine_version=engine_version,
        reference_method=reference_method,
        is_floor=method == reference_method,
        samples=samples,
        divergences=divergences,
        by_tokens=by_tokens,
        divergence_rate=divergences / samples,
        interval_95=wilson_interval(divergences, samples),
        first_divergence=first_divergence(diverged),
        first_seen=first_seen,
        last_seen=last_seen,
    )


def floor_of(groups: Sequence[LosslessGroup]) -> LosslessFloor:
    """The model's checks of a method against itself, pooled; no rate without any."""
    samples = sum(g.samples for g in groups if g.is_floor)
    divergences = sum(g.divergences for g in groups if g.is_floor)
    if samples == 0:
        return LosslessFloor(samples=0, divergences=0, divergence_rate=None, interval_95=None)
    return LosslessFloor(
        samples=samples,
        divergences=divergences,
        divergence_rate=divergences / samples,
        interval_95=wilson_interval(divergences, samples),
    )


def _replays(session: Session, window: Window) -> dict[str, LosslessReplays]:
    """Each model's replays in the ledger: how many, how many priced, and their cost."""
    r = UsageRecord
    query = window.replays(
        r.model, func.count(), func.count(r.cost_usd), func.sum(r.cost_usd)
    ).group_by(r.model)
    return {
        model: LosslessReplays(
            requests=int(count), unpriced=int(count - priced), cost_usd=float(cost or 0.0)
        )
        for model, count, priced, cost in session.execute(query)
    }


def _order(group: LosslessGroup) -> tuple[Any, ...]:
    """The floor first, then by method, K, drafter, backend, engine and reference."""
    return (
        not group.is_floor,
        group.method,
        -1 if group.k is None else group.k,
        group.drafter or "",
        group.backend,
        group.engine_version or "",
        group.reference_method,
    )


def lossless(
    session: Session, start: dt.datetime | None, end: dt.datetime | None, model: str | None
) -> LosslessReport:
    """Divergences from the reference method per model and group over [start, end), each
    model's floor and what its replays cost."""
    start, end = period(start, end, dt.datetime.now(dt.UTC))
    window = Window(start, end, model)
    groups = _groups(session, window)
    replays = _replays(session, window)
    models = [
        LosslessModel(
            model=name,
            floor=floor_of(groups[name]),
            replays=replays.get(name, LosslessReplays(requests=0, unpriced=0, cost_usd=0.0)),
            groups=sorted(groups[name], key=_order),
        )
        for name in sorted(groups.keys() | replays.keys())
    ]
    return LosslessReport(start=start.isoformat(), end=end.isoformat(), models=models)
