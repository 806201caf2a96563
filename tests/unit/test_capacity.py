"""Capacity planning by hand."""

from __future__ import annotations

import pytest

from planner.capacity import HOURS_PER_MONTH, plan_capacity, savings
from planner.recommend import Point


def p(method: str, k: int, c: int, tps: float, itl: float) -> Point:
    return Point(method, k, c, tps, itl, 0.0)


POINTS = [
    p("plain", 0, 16, 1000, 10),
    p("plain", 0, 64, 3000, 25),
    p("eagle3", 3, 16, 2000, 8),
    p("eagle3", 3, 64, 4000, 30),
    p("dflash", 7, 16, 2500, 12),
    p("dflash", 7, 64, 5000, 19),
]


def test_replicas_gpus_and_monthly_cost_under_the_objective() -> None:
    plans = plan_capacity(
        POINTS,
        output_tokens_per_s=9000,
        itl_objective_ms=20,
        gpu_count=2,
        price_usd_per_gpu_hour=4.0,
    )
    by_method = {c.method: c for c in plans}
    # dflash: c=64 meets 20 ms -> 5000 tok/s per replica -> 2 replicas -> 4 GPUs
    assert (by_method["dflash"].replicas, by_method["dflash"].gpus) == (2, 4)
    assert by_method["dflash"].usd_per_month == pytest.approx(4 * 4.0 * HOURS_PER_MONTH)
    # eagle3: c=64 breaks 20 ms, c=16 gives 2000 -> 5 replicas; plain: 1000 -> 9 replicas
    assert (by_method["eagle3"].concurrency_per_replica, by_method["eagle3"].replicas) == (16, 5)
    assert by_method["plain"].replicas == 9
    assert [c.method for c in plans] == ["dflash", "eagle3", "plain"]  # cheapest first
    saved = savings(plans, "plain")
    assert saved["dflash"] == pytest.approx((18 - 4) * 4.0 * HOURS_PER_MONTH)
    assert savings(plans, "eagle3")["dflash"] == pytest.approx((10 - 4) * 4.0 * HOURS_PER_MONTH)


def test_a_method_that_never_meets_the_objective_is_left_out() -> None:
    plans = plan_capacity(
        POINTS, output_tokens_per_s=100, itl_objective_ms=9, gpu_count=1, price_usd_per_gpu_hour=1.0
    )
    assert [c.method for c in plans] == ["eagle3"]
    assert savings(plans, "plain") == {}


def test_zero_traffic_is_refused() -> None:
    with pytest.raises(ValueError, match="got 0"):
        plan_capacity(
            POINTS,
            output_tokens_per_s=0,
            itl_objective_ms=20,
            gpu_count=1,
            price_usd_per_gpu_hour=1.0,
        )
