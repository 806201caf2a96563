"""The fleet report: the bill, right-sized bills per method, achievable savings, over-provisioning.

Per model over a period: the hourly traffic (from the rollups), the actual spend (GPU-hours
held times price, `services/spend.py`), and for each method the model's backends run (and
plain, always): the replicas it would need hour by hour within the model's ITL objective,
from the same throughput curves that price requests (`planner/rightsize.py`), times GPUs,
hours and price. docs/costs.md defines every field and works an example by hand.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gateway.accounting import hour_of
from gateway.db import queries
from gateway.db.tables import UsageHourly
from gateway.errors import NotFound
from gateway.registry import Snapshot
from gateway.schemas.reports import (
    FleetActual,
    FleetAuto,
    FleetLatency,
    FleetMethod,
    FleetNow,
    FleetObjective,
    FleetReport,
    FleetTraffic,
)
from gateway.services.spend import (
    backend_entries,
    check_price_kind,
    held_intervals,
    period,
    spend,
)
from gateway.settings import Settings
from planner.cost import ThroughputCurve
from planner.rightsize import Hour, ReplicaCapacity, itl_ms, replica_capacity, size_hours

HOUR = dt.timedelta(hours=1)


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


def traffic_hours(
    session: Session,
    model: str,
    start: dt.datetime,
    end: dt.datetime,
    now: dt.datetime,
) -> list[TrafficHour]:
    """Each hour of [start, end) the model was held or had traffic, with its traffic."""
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
    sums: dict[dt.datetime, list[float]] = {}
    by_method: dict[dt.datetime, dict[str, int]] = defaultdict(dict)
    busy_by_method: dict[dt.datetime, dict[str, float]] = defaultdict(dict)
    for stored, method, *values in session.execute(query):
        hour = stored.astimezone(dt.UTC)
        row = sums.setdefault(hour, [0.0, 0.0, 0.0, 0.0])
        for i, value in enumerate(values):
            row[i] += float(value or 0)
        by_method[hour][method] = int(values[2] or 0)
        busy_by_method[hour][method] = float(values[3] or 0)
    # Held spans around the period: an hour's rate is its tokens over the seconds the model
    # was served in it (a stack started at :50 served its tokens in 10 minutes, not 50).
    held = _held_spans(session, model, hour_of(start), min(hour_of(end) + HOUR, now), now)
    hours = sorted(set(sums) | {h for span in held for h in _hours_of(*span) if start <= h < end})
    out = []
    for hour in hours:
        elapsed = (hour, min(hour + HOUR, now))
        inside = (max(hour, start), min(hour + HOUR, end, now))
        served_s = _held_within(elapsed, held)
        weight = _held_within(inside, held) / 3600
        if hour in sums and not served_s:  # traffic, so something served it: all hour long
            served_s = _overlap(elapsed, elapsed).total_seconds()
            weight = _overlap(inside, inside) / HOUR
        if weight <= 0:
            continue
        n, prompt, completion, busy = sums.get(hour, [0.0, 0.0, 0.0, 0.0])
        out.append(
            TrafficHour(
                hour=hour,
                weight=weight,
                elapsed_s=max(1.0, served_s),
                requests=int(n),
                prompt_tokens=int(prompt),
                completion_tokens=int(completion),
                busy_s=busy,
                completion_by_method=by_method[hour],
                busy_s_by_method=busy_by_method[hour],
            )
        )
    return out


def _held_spans(
    session: Session, model: str, start: dt.datetime, end: dt.datetime, now: dt.datetime
) -> list[tuple[dt.datetime, dt.datetime]]:
    """When any backend of the model was held, merged, within [start, end)."""
    spans = sorted(
        (max(h.start, start), min(h.end, end))
        for h in held_intervals(backend_entries(session, end), now)
        if h.description.get("model") == model and h.end > start and h.start < end
    )
    merged: list[tuple[dt.datetime, dt.datetime]] = []
    for a, b in spans:
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


Span = tuple[dt.datetime, dt.datetime]


def _overlap(x: Span, y: Span) -> dt.timedelta:
    return max(dt.timedelta(0), min(x[1], y[1]) - max(x[0], y[0]))


def _held_within(window: Span, held: Sequence[Span]) -> float:
    """Seconds of `window` inside the (merged) held spans."""
    return sum((_overlap(window, span) for span in held), dt.timedelta(0)).total_seconds()


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


def _served_bill(
    sized: Mapping[str, Sized], hours: Sequence[TrafficHour], sizing: Sizing
) -> float | None:
    """The right-sized bill of the methods as they were served, each pool for its share."""
    total = 0.0
    for h in hours:
        for method, tokens in h.completion_by_method.items():
            pool = sized.get(method)
            if pool is None or pool.usd_per_gpu_hour is None:
                return None  # a method without a curve or a price: no figure
            total += pool.gpu_hours(h.demand(tokens), h.weight, sizing) * pool.usd_per_gpu_hour
    return total


def _auto(
    candidates: Mapping[str, Sized], hours: Sequence[TrafficHour], sizing: Sizing
) -> FleetAuto | None:
    """Each hour on the method cheapest for it: what the `auto` policy aims for."""
    if not candidates or not hours:
        return None
    bill, gpu_hours, chosen = _auto_bill(candidates, hours, sizing)
    return FleetAuto(
        gpu_hours=gpu_hours,
        bill_usd=bill,
        bill_usd_95=_ends(lambda end: _auto_bill(end, hours, sizing)[0], candidates),
        hours_by_method=dict(chosen),
    )


def _auto_bill(
    candidates: Mapping[str, Sized], hours: Sequence[TrafficHour], sizing: Sizing
) -> tuple[float, float, Counter[str]]:
    bill, gpu_hours, chosen = 0.0, 0.0, Counter[str]()
    for h in hours:
        options = []
        for c in candidates.values():
            used = c.gpu_hours(h.demand(), h.weight, sizing)
            options.append((used * (c.usd_per_gpu_hour or 0.0), used, c.pool.method))
        cost, used, method = min(options)
        bill, gpu_hours = bill + cost, gpu_hours + used
        chosen[method] += 1
    return bill, gpu_hours, chosen


def _ends(
    bill: Callable[[Mapping[str, Sized]], float | None], sized: Mapping[str, Sized]
) -> tuple[float, float] | None:
    """A bill's 95% interval: with every pool at the fast end of its band, and at the slow
    end (the errors of the curves taken to move together: a bound, not a sum of squares)."""
    ends = {method: s.ends() for method, s in sized.items()}
    if any(e is None for e in ends.values()):
        return None
    low = bill({m: e[0] for m, e in ends.items() if e is not None})
    high = bill({m: e[1] for m, e in ends.items() if e is not None})
    return None if low is None or high is None else (low, high)


def _difference_95(plain: FleetMethod, best: FleetMethod) -> tuple[float, float] | None:
    """The interval of plain's bill minus the best's (exactly 0 when plain is the best)."""
    if best.method == plain.method:
        return 0.0, 0.0
    if plain.bill_usd_95 is None or best.bill_usd_95 is None:
        return None
    return plain.bill_usd_95[0] - best.bill_usd_95[1], plain.bill_usd_95[1] - best.bill_usd_95[0]


def _latency(
    sized: Mapping[str, Sized], hours: Sequence[TrafficHour], backends: Mapping[str, int]
) -> list[FleetLatency]:
    """Per served method: its ITL at the load it was served at, and plain's at that load.

    The load of a method's backends in an hour is its busy seconds over the hour's elapsed
    seconds, split over its backends; both ITLs come from the curves at that load and are
    averaged over the hours weighted by the method's output tokens.
    """
    plain = sized.get("plain")
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for h in hours:
        for method, tokens in h.completion_by_method.items():
            pool = sized.get(method)
            if pool is None or tokens <= 0:
                continue
            c = h.busy_s_by_method.get(method, 0.0) / h.elapsed_s / max(backends.get(method, 1), 1)
            row = sums[method]
            row[0] += tokens
            row[1] += tokens * c
            row[2] += tokens * itl_ms(pool.pool.curve, pool.pool.gpu_count, c)
            if plain is not None:
                row[3] += tokens * itl_ms(plain.pool.curve, plain.pool.gpu_count, c)
    out = []
    for method, (weight, load, itl, plain_itl) in sorted(sums.items()):
        base = plain_itl / weight if plain is not None else None
        out.append(
            FleetLatency(
                method=method,
                output_tokens=int(weight),
                concurrency_per_backend=load / weight,
                itl_ms=itl / weight,
                plain_itl_ms=base,
                speedup_vs_plain=None if base is None else base / (itl / weight),
            )
        )
    return out


# ITL objectives tried for the one under which speculation would pay: 1 to 256 ms per token.
OBJECTIVES_MS = tuple(2 ** (i / 4) for i in range(8 * 4 + 1))


def _objective_that_pays(
    sized: Mapping[str, Sized], hours: Sequence[TrafficHour], sizing: Sizing
) -> float | None:
    """The loosest ITL objective under which a speculative method's right-sized fleet costs
    less than plain's for this traffic (None: none does, or no prices)."""
    plain = sized.get("plain")
    if plain is None or plain.usd_per_gpu_hour is None or not hours:
        return None

    def bill(s: Sized, objective: float) -> float | None:
        capacity = replica_capacity(s.pool.curve, s.pool.gpu_count, objective)
        if not capacity.meets_objective or s.usd_per_gpu_hour is None:
            return None
        tight = Sized(s.pool, capacity, s.usd_per_gpu_hour)
        return sum(tight.gpu_hours(h.demand(), h.weight, sizing) for h in hours) * (
            s.usd_per_gpu_hour
        )

    for objective in reversed(OBJECTIVES_MS):
        base = bill(plain, objective)
        spec = [
            b for m, s in sized.items() if m != "plain" and (b := bill(s, objective)) is not None
        ]
        if spec and (base is None or min(spec) < base):
            return objective
    return None


def fleet_report(
    session: Session,
    snapshot: Snapshot,
    now_sizing: FleetNow | None,
    model: str,
    start: dt.datetime | None,
    end: dt.datetime | None,
    price_kind: str,
    sizing: Sizing,
) -> FleetReport:
    """The bill, and what the model's traffic would cost on fleets sized for it, per method."""
    check_price_kind(price_kind)
    if model not in snapshot.backends and queries.find_model(session, model) is None:
        raise NotFound(f"model {model!r} not found", param="model")
    now = dt.datetime.now(dt.UTC)
    start, end = period(start, end, now)
    hours = traffic_hours(session, model, start, end, now)
    policy = snapshot.policies.get(model)
    objective = policy.itl_objective_ms if policy is not None else None
    served = {m for h in hours for m in h.completion_by_method}
    sized = {p.method: _sized(session, snapshot, model, p, objective, price_kind)
             for p in pools(snapshot, model, served)}  # fmt: skip
    methods = [
        s.report(hours, sizing, snapshot.bands[(model, m, s.pool.gpu_type)].source(
            s.capacity.concurrency))
        for m, s in sized.items()
    ]  # fmt: skip
    candidates = [m for m in methods if m.bill_usd is not None and m.meets_objective]
    # On equal bills (every method at the floor, say) the one with most room per replica.
    best = min(
        candidates,
        key=lambda m: (m.bill_usd or 0.0, -m.output_tokens_per_s_per_replica, m.method),
        default=None,
    )
    plain = next((m for m in methods if m.method == "plain"), None)
    achievable = achievable_95 = None
    if best is not None and plain is not None and plain.bill_usd is not None:
        achievable = plain.bill_usd - (best.bill_usd or 0.0)
        achievable_95 = _difference_95(plain, best)
    actual = spend(session, start, end, price_kind, model=model)
    served_bill = _served_bill(sized, hours, sizing)
    served_95 = _ends(lambda end: _served_bill(end, hours, sizing), sized)
    over = over_95 = None
    if actual.total_usd is not None and served_bill is not None:
        over = actual.total_usd - served_bill
        if served_95 is not None:
            over_95 = (actual.total_usd - served_95[1], actual.total_usd - served_95[0])
    chosen = {m.method: sized[m.method] for m in candidates}
    return FleetReport(
        model=model,
        start=start.isoformat(),
        end=end.isoformat(),
        price_kind=price_kind,
        headroom=sizing.headroom,
        min_replicas=sizing.min_replicas,
        traffic=[_traffic(h) for h in hours],
        objective=FleetObjective(
            itl_ms=objective,
            sized_for="itl objective" if objective is not None else "throughput alone",
            speculation_pays_below_itl_ms=(
                _objective_that_pays(sized, hours, sizing) if objective is None else None
            ),
        ),
        actual=FleetActual(gpu_hours=actual.gpu_hours, spend_usd=actual.total_usd),
        methods=methods,
        best=None if best is None else best.method,
        auto=_auto(chosen, hours, sizing),
        achievable_savings_usd=achievable,
        achievable_savings_usd_95=achievable_95,
        served_bill_usd=served_bill,
        served_bill_usd_95=served_95,
        over_provisioning_usd=over,
        over_provisioning_usd_95=over_95,
        latency=_latency(sized, hours, Counter(b.method for b in snapshot.backends.get(model, ()))),
        now=now_sizing,
    )


def _traffic(h: TrafficHour) -> FleetTraffic:
    return FleetTraffic(
        hour=h.hour.isoformat(),
        hours=h.weight,
        requests=h.requests,
        input_tokens=h.prompt_tokens,
        output_tokens=h.completion_tokens,
        output_tokens_per_s=h.demand(),
        mean_concurrency=h.busy_s / h.elapsed_s,
    )
