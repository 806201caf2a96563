"""The prediction contract: validation, fitting to measurements, predictions."""

from __future__ import annotations

from typing import Any

import pytest

from planner.predict import PlanError, parse_scenario, predict

EXAMPLE: dict[str, Any] = {
    "model": "Qwen/Qwen3-8B",
    "gpu": "B200",
    "gpu_count": 1,
    "method": "dflash",
    "k": 15,
    "acceptance_length": 6.5,
    "measurements": [
        {"method": "plain", "k": 0, "concurrency": 1, "output_tokens_per_s": 229.0},
        {"method": "dflash", "k": 15, "concurrency": 1, "output_tokens_per_s": 955.0},
    ],
    "concurrency": [1, 4, 8, 16, 32],
}


def test_the_contract_example_fits_its_measurements_and_predicts_the_rest() -> None:
    predictions = predict(parse_scenario(EXAMPLE))
    assert [p.concurrency for p in predictions] == [1, 4, 8, 16, 32]
    first = predictions[0]
    assert first.source == "measured"
    assert first.plain_output_tokens_per_s == pytest.approx(229.0, rel=1e-3)
    assert first.method_output_tokens_per_s == pytest.approx(955.0)
    assert first.speedup == pytest.approx(955.0 / 229.0, rel=1e-3)
    assert first.itl_ms == pytest.approx(1000 / 955.0, rel=1e-3)  # one sequence: 1/tok rate
    assert all(p.source == "estimated" for p in predictions[1:])
    speedups = [p.speedup for p in predictions]
    assert speedups == sorted(speedups, reverse=True)  # gains shrink with load
    rates = [p.method_output_tokens_per_s for p in predictions]
    assert rates == sorted(rates)  # aggregate throughput still grows


def test_cost_follows_the_price_and_throughput() -> None:
    scenario = parse_scenario({**EXAMPLE, "price_usd_per_gpu_hour": 3.6})
    first = predict(scenario)[0]
    assert first.usd_per_mtok == pytest.approx(3.6 / 3600 / 955.0 * 1e6)


def test_per_position_acceptance_replaces_the_length() -> None:
    scenario = {**EXAMPLE, "k": 3, "per_position_acceptance": [0.8, 0.6, 0.4, 0.2]}
    scenario.pop("acceptance_length")
    assert parse_scenario(scenario).acceptance_length == pytest.approx(2.8)  # K=3 truncates


def test_without_measurements_it_predicts_from_the_catalogs() -> None:
    bare = {k: v for k, v in EXAMPLE.items() if k != "measurements"}
    predictions = predict(parse_scenario(bare))
    assert all(p.source == "estimated" for p in predictions)
    assert predictions[0].speedup > 2


def test_an_inline_model_is_accepted() -> None:
    inline = {"params_b": 8, "layers": 32, "hidden": 4096, "kv_heads": 8, "head_dim": 128}
    predictions = predict(parse_scenario({**EXAMPLE, "model": inline}))
    assert predictions[0].method_output_tokens_per_s == pytest.approx(955.0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model": "nope"}, "unknown model 'nope'"),
        ({"gpu": "X9"}, "unknown GPU 'X9'"),
        ({"k": 0}, "k must be a positive integer for method 'dflash', got 0"),
        ({"k": -2}, "got -2"),
        ({"acceptance_length": 17}, r"\[1, 16\], got 17"),
        ({"acceptance_length": 0.5}, "got 0.5"),
        ({"model": {"params_b": 8}}, "inline model needs numeric"),
        ({"concurrency": [1, 0]}, "concurrency must be a positive number, got 0"),
    ],
)
def test_bad_scenarios_name_the_value(change: dict[str, Any], message: str) -> None:
    with pytest.raises(PlanError, match=message):
        parse_scenario({**EXAMPLE, **change})
