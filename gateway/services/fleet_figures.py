"""The fleet report's figures from what was read, pure: right-sized bills per method, the best
method, achievable savings, the bill of the methods as served, over-provisioning, latency.

`services/rightsizing.py` reads the traffic, prices and spend and hands them here as
`FleetInputs`; docs/costs.md defines every field and works an example by hand.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

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
from gateway.services.sizing import Sized, Sizing, TrafficHour
from planner.rightsize import itl_ms, replica_capacity


@dataclass(frozen=True, slots=True)
class FleetInputs:
    """What a model's fleet report is computed from, once read."""

    model: str
    start: dt.datetime
    end: dt.datetime
    price_kind: str
    sizing: Sizing
    objective: float | None  # the model's ITL objective (ms per token), if its policy sets one
    hours: Sequence[TrafficHour]
    sized: Mapping[str, Sized]  # by method
    sources: Mapping[str, Literal["measured", "estimated"]]  # each pool's curve, where it runs
    backends: Mapping[str, int]  # the model's backends per method
    actual: FleetActual
    now: FleetNow | None
    what_if: bool = False  # `objective` is a what-if, not the policy's


def fleet_figures(inputs: FleetInputs) -> FleetReport:
    """The bill, and what the model's traffic would cost on fleets sized for it, per method."""
    hours, sized, sizing = inputs.hours, inputs.sized, inputs.sizing
    methods = [s.report(hours, sizing, inputs.sources[m]) for m, s in sized.items()]
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
    served_bill = _served_bill(sized, hours, sizing)
    served_95 = _ends(lambda end: _served_bill(end, hours, sizing), sized)
    over, over_95 = _over_provisioning(inputs.actual.spend_usd, served_bill, served_95)
    chosen = {m.method: sized[m.method] for m in candidates}
    return FleetReport(
        model=inputs.model,
        start=inputs.start.isoformat(),
        end=inputs.end.isoformat(),
        price_kind=inputs.price_kind,
        headroom=sizing.headroom,
        min_replicas=sizing.min_replicas,
        idle_pool_replicas=sizing.idle_pool_replicas,
        traffic=[_traffic(h) for h in hours],
        objective=_objective(inputs),
        actual=inputs.actual,
        methods=methods,
        best=None if best is None else best.method,
        auto=_auto(chosen, hours, sizing),
        achievable_savings_usd=achievable,
        achievable_savings_usd_95=achievable_95,
        served_bill_usd=served_bill,
        served_bill_usd_95=served_95,
        over_provisioning_usd=over,
        over_provisioning_usd_95=over_95,
        latency=_latency(sized, hours, inputs.backends),
        now=inputs.now,
    )


def _objective(inputs: FleetInputs) -> FleetObjective:
    """What the fleets were sized for, and (without an objective) the one speculation needs."""
    objective = inputs.objective
    return FleetObjective(
        itl_ms=objective,
        sized_for=(
            "throughput alone"
            if objective is None
            else "what-if itl objective"
            if inputs.what_if
            else "itl objective"
        ),
        speculation_pays_below_itl_ms=(
            _objective_that_pays(inputs.sized, inputs.hours, inputs.sizing)
            if objective is None
            else None
        ),
    )


def _over_provisioning(
    spend_usd: float | None, served_bill: float | None, served_95: tuple[float, float] | None
) -> tuple[float | None, tuple[float, float] | None]:
    """The bill minus the right-sized bill of the methods as served, and its interval."""
    over = over_95 = None
    if spend_usd is not None and served_bill is not None:
        over = spend_usd - served_bill
        if served_95 is not None:
            over_95 = (spend_usd - served_95[1], spend_usd - served_95[0])
    return over, over_95


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
