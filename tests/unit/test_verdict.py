"""The overview's bill split adds up to the printed bill to the cent, whatever the rounding."""

import re

import pytest

from dashboard.schemas import Fleet
from dashboard.widgets.verdict import reconciled


def _fleet(bill: float, served: float, right_sized: float) -> Fleet:
    plain = {
        "method": "plain", "k": 0, "gpu_type": "H100", "gpu_count": 1,
        "concurrency_per_replica": 8.0, "output_tokens_per_s_per_replica": 900.0, "itl_ms": 20.0,
        "meets_objective": True, "source": "measured", "relative_95": 0.05, "peak_replicas": 1,
        "gpu_hours": 1.0, "bill_usd": right_sized, "bill_usd_95": None,
    }  # fmt: skip
    return Fleet.model_validate({
        "model": "m", "price_kind": "on_demand", "headroom": 0.2, "idle_pool_replicas": 0,
        "objective": {"itl_ms": None, "sized_for": "throughput"},
        "actual": {"gpu_hours": 2.0, "spend_usd": bill}, "methods": [plain], "best": "plain",
        "achievable_savings_usd": None, "achievable_savings_usd_95": None,
        "served_bill_usd": served, "over_provisioning_usd": bill - served,
        "over_provisioning_usd_95": None, "latency": [], "now": None,
    })  # fmt: skip


@pytest.mark.parametrize(
    ("bill", "served", "right_sized"),
    [(2.296, 0.454, 0.454), (2.304, 0.456, 0.4549), (1.005, 0.335, 0.105), (10.0, 10.0, 9.996)],
)
def test_the_printed_parts_add_up_to_the_printed_bill(
    bill: float, served: float, right_sized: float
) -> None:
    split = reconciled(_fleet(bill, served, right_sized))
    dollars = re.findall(r"-?\$([\d,.]+)", split)
    total, best, mix, over = (float(d.replace(",", "")) for d in dollars)
    assert round(best + mix + over, 2) == total, split
    assert total == round(bill, 2), split
