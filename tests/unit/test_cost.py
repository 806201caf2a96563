"""$ per 1M tokens and throughput curves, by hand."""

from __future__ import annotations

import pytest

from planner.cost import ThroughputCurve, usd_per_mtok


@pytest.mark.parametrize(
    ("price", "gpus", "tps", "expected"),
    [
        (3.6, 1, 1000.0, 1.0),  # $0.001/s over 1000 tok/s = $1e-6 per token
        (6.0, 2, 500.0, 6.0 * 2 / 3600 / 500 * 1e6),
        (2.0, 8, 20000.0, 2.0 * 8 / 3600 / 20000 * 1e6),
    ],
)
def test_usd_per_mtok(price: float, gpus: int, tps: float, expected: float) -> None:
    assert usd_per_mtok(price, gpus, tps) == pytest.approx(expected)


def test_zero_throughput_is_refused() -> None:
    with pytest.raises(ValueError, match="output_tokens_per_s"):
        usd_per_mtok(3.0, 1, 0.0)


def test_curve_interpolates_in_log_concurrency_and_saturates() -> None:
    curve = ThroughputCurve.from_points([(1, 100.0), (4, 300.0), (16, 800.0), (4, 340.0)])
    assert curve.at(4) == pytest.approx(320.0)  # duplicates averaged
    assert curve.at(2) == pytest.approx(100 + 0.5 * (320 - 100))  # halfway in log2
    assert curve.at(64) == pytest.approx(800.0)  # beyond the last point: saturated
    assert curve.at(0.5) == pytest.approx(100.0)  # below one: one sequence's rate


def test_empty_curve_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        ThroughputCurve.from_points([(0, 10.0), (2, 0.0)])
