"""Right-sizing from what was read, pure: method pools, traffic hours, a pool's fleet and bill.

`services/rightsizing.py` reads the rows (usage rollups, held intervals, prices) and hands
them here; nothing in this module touches the database.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from gateway.registry import Snapshot
from gateway.rollups import hour_of
from gateway.schemas.reports import FleetMethod
from gateway.settings import Settings
from planner.cost import ThroughputCurve
from planner.rightsize import Hour, ReplicaCapacity, size_hours

HOUR = dt.timedelta(hours=1)
Span = tuple[dt.datetime, dt.datetime]


@dataclass(frozen=True, slots=True)
class Sizing:
    """How fleets are sized: headroom over the mean, the fewest replicas of a serving pool,
    and the replicas a pool the policy does not route to keeps."""

    headroom: float
    min_replicas: int
    idle_pool_replicas: int = 1

    @classmethod
    def of(cls, settings: Settings) -> Sizing:
        """The sizing the settings ask for."""
        return cls(
            settings.sizing_headroom, settings.sizing_min_replicas, settings.idle_pool_replicas
        )


@dataclass(frozen=True, slots=True)
class Pool:
    """A method pool of a model: what one replica is, and its curve (per GPU)."""

    method: str
    k: int
    gpu_type: str
    gpu_count: int
    curve: ThroughputCurve


@dataclass(frozen=True, slots=True)
class TrafficHour:
    """One hour of a model's traffic, as the rollups have it."""

    hour: dt.datetime
    weight: float  # hours of it inside the period (and while the model was held)
    elapsed_s: float  # seconds of it the model was served (held), up to now
    requests: int
    prompt_tokens: int
    completion_tokens: int
    busy_s: float
    completion_by_method: Mapping[str, int]
    busy_s_by_method: Mapping[str, float]

    def demand(self, tokens: int | None = None) -> float:
        """Output tokens/s over the hour (of all methods, or `tokens` of one)."""
        return (self.completion_tokens if tokens is None else tokens) / self.elapsed_s


def pools(snapshot: Snapshot, model: str, methods: Iterable[str] = ()) -> list[Pool]:
    """Every method the model's backends run, plain, and `methods`, each as a pool.

    A pool's replica is its backends' most common (K, GPU type, GPU count); a method with no
    backend (plain, a method that served and was removed) takes the model's most common GPU.
    """
    backends = snapshot.backends.get(model, ())
    if not backends:
        return []
    shapes: dict[str, Counter[tuple[int, str, int]]] = defaultdict(Counter)
    for b in backends:
        shapes[b.method][(b.k or 0, b.gpu_type, b.gpu_count)] += 1
    common = Counter((b.gpu_type, b.gpu_count) for b in backends).most_common(1)[0][0]
    out = []
    for method in sorted({*shapes, "plain", *methods}):
        k, gpu_type, gpu_count = (
            shapes[method].most_common(1)[0][0] if shapes[method] else (0, *common)
        )
        curve = snapshot.curves.get((model, method, gpu_type))
        if curve is not None:
            out.append(Pool(method, k, gpu_type, gpu_count, curve))
    return out


@dataclass(slots=True)
class _HourSums:
    """The rollups of an hour, summed over their rows: totals and per method."""

    totals: dict[dt.datetime, list[float]]  # requests, prompt, completion, busy seconds
    completion_by_method: dict[dt.datetime, dict[str, int]]
    busy_s_by_method: dict[dt.datetime, dict[str, float]]


def _sum_by_hour(rows: Iterable[Sequence[Any]]) -> _HourSums:
    """Rows of (hour, method, requests, prompt, completion, busy seconds), summed per hour."""
    sums: dict[dt.datetime, list[float]] = {}
    by_method: dict[dt.datetime, dict[str, int]] = defaultdict(dict)
    busy_by_method: dict[dt.datetime, dict[str, float]] = defaultdict(dict)
    for stored, method, *values in rows:
        hour = stored.astimezone(dt.UTC)
        row = sums.setdefault(hour, [0.0, 0.0, 0.0, 0.0])
        for i, value in enumerate(values):
            row[i] += float(value or 0)
        by_method[hour][method] = int(values[2] or 0)
        busy_by_method[hour][method] = float(values[3] or 0)
    return _HourSums(sums, by_method, busy_by_method)


def hours_of_traffic(
    rows: Iterable[Sequence[Any]],
    held: Sequence[Span],
    start: dt.datetime,
    end: dt.datetime,
    now: dt.datetime,
) -> list[TrafficHour]:
    """Each hour of [start, end) the model was held (`held`: merged spans) or had traffic
    (`rows`: the rollups by hour and method), with its traffic."""
    sums = _sum_by_hour(rows)
    hours = sorted(
        set(sums.totals) | {h for span in held for h in _hours_of(*span) if start <= h < end}
    )
    out = []
    for hour in hours:
        elapsed = (hour, min(hour + HOUR, now))
        inside = (max(hour, start), min(hour + HOUR, end, now))
        served_s = _held_within(elapsed, held)
        weight = _held_within(inside, held) / 3600
        if hour in sums.totals and not served_s:  # traffic, so something served it: all hour long
            served_s = _overlap(elapsed, elapsed).total_seconds()
            weight = _overlap(inside, inside) / HOUR
        if weight <= 0:
            continue
        n, prompt, completion, busy = sums.totals.get(hour, [0.0, 0.0, 0.0, 0.0])
        out.append(
            TrafficHour(
                hour=hour,
                weight=weight,
                elapsed_s=max(1.0, served_s),
                requests=int(n),
                prompt_tokens=int(prompt),
                completion_tokens=int(completion),
                busy_s=busy,
                completion_by_method=sums.completion_by_method[hour],
                busy_s_by_method=sums.busy_s_by_method[hour],
            )
        )
    return out


def merge_spans(spans: Iterable[Span]) -> list[Span]:
    """The spans sorted, those that overlap or touch merged into one."""
    merged: list[Span] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _hours_of(a: dt.datetime, b: dt.datetime) -> Iterable[dt.datetime]:
    hour = hour_of(a)
    while hour < b:
        yield hour
        hour += HOUR


def _overlap(x: Span, y: Span) -> dt.timedelta:
    return max(dt.timedelta(0), min(x[1], y[1]) - max(x[0], y[0]))


def _held_within(window: Span, held: Sequence[Span]) -> float:
    """Seconds of `window` inside the (merged) held spans."""
    return sum((_overlap(window, span) for span in held), dt.timedelta(0)).total_seconds()


@dataclass(frozen=True, slots=True)
class Sized:
    """A pool with its replica's capacity within the objective, and its price."""

    pool: Pool
    capacity: ReplicaCapacity
    usd_per_gpu_hour: float | None
    relative_95: float = 0.0  # the curve's band at the operating point

    def scaled(self, factor: float) -> Sized:
        """This pool were its replica `factor` times as fast (an end of its interval)."""
        fast = self.capacity.output_tokens_per_s * factor
        return replace(self, capacity=replace(self.capacity, output_tokens_per_s=fast))

    def ends(self) -> tuple[Sized, Sized] | None:
        """The pool at the fast and the slow end of its 95% interval (None: the slow end
        has no throughput, the estimate is too loose to bound a bill)."""
        h = self.relative_95
        return None if h >= 1 else (self.scaled(1 + h), self.scaled(1 - h))

    def gpu_hours(self, demand_tokens_per_s: float, hours: float, sizing: Sizing) -> float:
        """GPU-hours this pool needs to serve `demand_tokens_per_s` for `hours`."""
        [one] = size_hours(
            [Hour(demand_tokens_per_s, hours)],
            self.capacity,
            self.pool.gpu_count,
            headroom=sizing.headroom,
            min_replicas=sizing.min_replicas,
        )
        return one.gpu_hours

    def report(
        self, hours: Sequence[TrafficHour], sizing: Sizing, source: Literal["measured", "estimated"]
    ) -> FleetMethod:
        """The pool's right-sized fleet over the hours."""
        sized = size_hours(
            [Hour(h.demand(), h.weight) for h in hours],
            self.capacity,
            self.pool.gpu_count,
            headroom=sizing.headroom,
            min_replicas=sizing.min_replicas,
        )
        gpu_hours, price = sum(s.gpu_hours for s in sized), self.usd_per_gpu_hour
        ends = self.ends()
        bill_95 = None
        if price is not None and ends is not None:
            low, high = (e.bill([Hour(h.demand(), h.weight) for h in hours], sizing) for e in ends)
            bill_95 = (low, high)
        return FleetMethod(
            method=self.pool.method,
            k=self.pool.k,
            gpu_type=self.pool.gpu_type,
            gpu_count=self.pool.gpu_count,
            concurrency_per_replica=self.capacity.concurrency,
            output_tokens_per_s_per_replica=self.capacity.output_tokens_per_s,
            itl_ms=self.capacity.itl_ms,
            meets_objective=self.capacity.meets_objective,
            source=source,
            relative_95=self.relative_95,
            peak_replicas=max((s.replicas for s in sized), default=0),
            gpu_hours=gpu_hours,
            usd_per_gpu_hour=price,
            bill_usd=None if price is None else gpu_hours * price,
            bill_usd_95=bill_95,
        )

    def bill(self, hours: Sequence[Hour], sizing: Sizing) -> float:
        """The right-sized bill over the hours (0 without a price)."""
        sized = size_hours(
            hours,
            self.capacity,
            self.pool.gpu_count,
            headroom=sizing.headroom,
            min_replicas=sizing.min_replicas,
        )
        return sum(s.gpu_hours for s in sized) * (self.usd_per_gpu_hour or 0.0)
