"""The plan's pure part: from measurements already read and a price, without a database."""

from __future__ import annotations

import pytest

from gateway.errors import ValidationFailed
from gateway.schemas.reports import PlanPrice
from gateway.services.plans import PlanRequest, plan_report
from planner import catalog
from planner.fit_measurements import MeasuredPoint

SPEC, B200 = catalog.model("openai/gpt-oss-20b"), catalog.gpu("B200")
PRICE = PlanPrice(usd_per_gpu_hour=3.6, kind="on-demand", source="test", date="2026-11-01",
                  origin="database")  # fmt: skip
REQUEST = PlanRequest(gpu_count=1, workload="chat", itl_objective_ms=None,
                      output_tokens_per_s=None, engine="vllm")  # fmt: skip


def test_without_measurements_every_choice_is_estimated_at_the_given_price() -> None:
    plan = plan_report(SPEC, B200, PRICE, [], REQUEST)
    assert (plan.model, plan.gpu, plan.price, plan.fit.measurements) == (
        "openai/gpt-oss-20b", "B200", PRICE, 0,
    )  # fmt: skip
    assert plan.choices[0].concurrency == 1
    assert {c.source for c in plan.choices} == {"estimated"}
    assert plan.capacity is None


def test_a_measured_point_is_chosen_at_its_measurement() -> None:
    first = plan_report(SPEC, B200, PRICE, [], REQUEST).choices[0]
    faster = first.output_tokens_per_s * 1.1
    seen = [MeasuredPoint(first.method, first.k, 1, faster)]
    again = plan_report(SPEC, B200, PRICE, seen, REQUEST).choices[0]
    assert (again.method, again.source) == (first.method, "measured")
    assert again.output_tokens_per_s == pytest.approx(faster)


def test_a_traffic_gets_a_capacity_plan_and_too_few_gpus_are_refused() -> None:
    sized = PlanRequest(1, "chat", 50.0, 5000.0, "vllm")
    assert plan_report(SPEC, B200, PRICE, [], sized).capacity is not None
    too_big = catalog.model("deepseek-ai/DeepSeek-R1")  # 671B: no room for a sequence
    with pytest.raises(ValidationFailed) as refused:
        plan_report(too_big, B200, PRICE, [], REQUEST)
    assert refused.value.param == "gpu_count"


@pytest.mark.parametrize("gpu_count", [1, 2])
def test_every_point_labelled_measured_is_priced_at_its_measurement(gpu_count: int) -> None:
    """Choices and every method's curve alike: a point says "measured" exactly where a
    measurement of its (method, K, concurrency) exists, and then its throughput and $/1M
    are the measurement's (per GPU times the GPUs), never the fit's value there."""
    seen = [
        MeasuredPoint("eagle3", 3, 8, 900.0),
        MeasuredPoint("plain", 0, 8, 700.0),
        MeasuredPoint("dflash", 7, 8, 1500.0),
        MeasuredPoint("dflash", 15, 64, 4000.0),
    ]
    by_config = {(p.method, p.k, p.concurrency): p.output_tokens_per_s for p in seen}
    request = PlanRequest(gpu_count, "chat", None, None, "vllm")
    plan = plan_report(SPEC, B200, PRICE, seen, request)
    points = [*plan.choices, *(p for curve in plan.methods.values() for p in curve)]
    labelled = 0
    for p in points:
        measured = by_config.get((p.method, p.k, p.concurrency))
        assert p.source == ("estimated" if measured is None else "measured"), p
        if measured is not None:
            labelled += 1
            assert p.output_tokens_per_s == pytest.approx(measured * gpu_count)
            usd = PRICE.usd_per_gpu_hour * gpu_count / (measured * gpu_count * 3600) * 1e6
            assert p.usd_per_mtok == pytest.approx(usd)
    assert labelled >= 1  # plain at c=8 at least: its curve has one K
