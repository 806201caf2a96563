"""Right-sized fleets: the replicas a method needs for an hour's traffic within a latency objective.

A replica (one backend of `gpu_count` GPUs) of a method serves at most the throughput its
curve reaches at the highest concurrency whose inter-token latency, `1000 * c / tokens/s(c)`,
stays within the objective; without an objective, the most its curve reaches at all. An
hour's demand is its output tokens over its seconds; with `headroom` for the peaks an
hourly mean hides, the replicas are `ceil(demand * (1 + headroom) / capacity)`, and never
fewer than `min_replicas` (a model that is served keeps that many up, traffic or not).
The bill of a method over hours is the sum of replicas x GPUs x hours x price.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from planner.cost import ThroughputCurve

# Concurrencies a replica could run at: 1 to 4096 in steps of 2^(1/8) (about 9%).
SEARCH = tuple(2 ** (i / 8) for i in range(8 * 12 + 1))


@dataclass(frozen=True, slots=True)
class ReplicaCapacity:
    """The most one replica of a method serves within the objective, and where."""

    concurrency: float
    output_tokens_per_s: float  # the replica's, all its GPUs
    itl_ms: float
    meets_objective: bool  # False: not even one stream meets it; sized at its fastest


def itl_ms(curve: ThroughputCurve, gpu_count: int, concurrency: float) -> float:
    """Mean time per output token a stream sees at `concurrency` on one replica."""
    c = max(concurrency, 1.0)
    return 1000 * c / (curve.at(c) * gpu_count)


def replica_capacity(
    curve: ThroughputCurve, gpu_count: int, itl_objective_ms: float | None
) -> ReplicaCapacity:
    """One replica's throughput at its best concurrency within the objective (per-GPU curve)."""
    points = [(c, curve.at(c) * gpu_count, itl_ms(curve, gpu_count, c)) for c in SEARCH]
    within = [p for p in points if itl_objective_ms is None or p[2] <= itl_objective_ms]
    if not within:  # one stream alone is the fastest a replica can serve
        c, tps, itl = points[0]
        return ReplicaCapacity(c, tps, itl, meets_objective=False)
    c, tps, itl = max(within, key=lambda p: (p[1], -p[0]))
    return ReplicaCapacity(c, tps, itl, meets_objective=True)


def replicas_needed(
    demand_tokens_per_s: float, capacity: ReplicaCapacity, headroom: float, min_replicas: int
) -> int:
    """Whole replicas that serve `demand_tokens_per_s` with `headroom` to spare."""
    if demand_tokens_per_s <= 0:
        return min_replicas
    wanted = demand_tokens_per_s * (1 + headroom) / capacity.output_tokens_per_s
    return max(min_replicas, math.ceil(wanted - 1e-9))


@dataclass(frozen=True, slots=True)
class Hour:
    """One hour of a model's traffic: output tokens/s on average, and how much of it counts."""

    output_tokens_per_s: float
    hours: float = 1.0  # the part of the hour inside the period (the last one may be partial)


@dataclass(frozen=True, slots=True)
class SizedHour:
    """What one hour takes with one method."""

    replicas: int
    gpu_hours: float


def size_hours(
    hours: Sequence[Hour],
    capacity: ReplicaCapacity,
    gpu_count: int,
    *,
    headroom: float,
    min_replicas: int,
) -> list[SizedHour]:
    """Replicas and GPU-hours per hour for one method (pure)."""
    sized = []
    for h in hours:
        n = replicas_needed(h.output_tokens_per_s, capacity, headroom, min_replicas)
        sized.append(SizedHour(n, n * gpu_count * h.hours))
    return sized
