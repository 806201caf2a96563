"""Capacity: GPUs needed for a traffic under a latency objective, monthly cost, savings.

Each method runs replicas at the highest concurrency that keeps its inter-token latency
within the objective; the traffic's output tokens/s divided by one replica's throughput
there gives the replicas (rounded up), hence GPUs and a monthly bill. Savings compare with
plain decoding and with EAGLE-3 under the same objective.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from planner.recommend import Point

HOURS_PER_MONTH = 730.0


@dataclass(frozen=True)
class Capacity:
    """What serving a traffic with one method takes."""

    method: str
    k: int
    concurrency_per_replica: int
    output_tokens_per_s_per_replica: float
    replicas: int
    gpus: int
    usd_per_month: float


def plan_capacity(
    points: Sequence[Point],
    *,
    output_tokens_per_s: float,
    itl_objective_ms: float,
    gpu_count: int,
    price_usd_per_gpu_hour: float,
) -> list[Capacity]:
    """For each method, the cheapest way to serve `output_tokens_per_s` within the objective."""
    if output_tokens_per_s <= 0:
        raise ValueError(f"output_tokens_per_s must be > 0, got {output_tokens_per_s}")
    out = []
    for method in sorted({p.method for p in points}):
        ok = [p for p in points if p.method == method and p.itl_ms <= itl_objective_ms]
        if not ok:
            continue
        best = max(ok, key=lambda p: p.output_tokens_per_s)
        replicas = math.ceil(output_tokens_per_s / best.output_tokens_per_s)
        usd = replicas * gpu_count * price_usd_per_gpu_hour * HOURS_PER_MONTH
        out.append(
            Capacity(
                method,
                best.k,
                best.concurrency,
                best.output_tokens_per_s,
                replicas,
                replicas * gpu_count,
                usd,
            )
        )
    return sorted(out, key=lambda c: c.usd_per_month)


def savings(capacities: Sequence[Capacity], baseline: str) -> dict[str, float]:
    """USD per month each method saves against `baseline` (negative: it costs more)."""
    base = next((c for c in capacities if c.method == baseline), None)
    if base is None:
        return {}
    return {c.method: base.usd_per_month - c.usd_per_month for c in capacities}
