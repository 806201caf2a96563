"""The lossless report's arithmetic: Wilson intervals, quantiles, first divergences, floors."""

from __future__ import annotations

import datetime as dt

import pytest

from gateway.schemas.reports import LosslessGroup
from gateway.services.lossless import first_divergence, floor_of, quantile, wilson_interval


@pytest.mark.parametrize(
    ("divergences", "samples", "low", "high"),
    [
        (0, 100, 0.0, 0.0370),  # none seen: the rate is still up to 3.7%, never a point
        (5, 100, 0.0215, 0.1118),
        (1, 10, 0.0179, 0.4042),
        # Newcombe (1998), "Two-sided confidence intervals for the single proportion"
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
        (100, 100, 0.9630, 1.0),  # all diverged: up to 1, never past it
    ],
)
def test_the_wilson_interval_at_known_values(
    divergences: int, samples: int, low: float, high: float
) -> None:
    interval = wilson_interval(divergences, samples)
    assert interval == pytest.approx((low, high), abs=5e-5)
    assert 0.0 <= interval[0] <= divergences / samples <= interval[1] <= 1.0


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([10, 20, 30, 40], 0.25, 17.5),
        ([10, 20, 30, 40], 0.5, 25.0),
        ([10, 20, 30, 40], 0.75, 32.5),
        ([10, 20, 30, 40], 1.0, 40.0),
        ([7], 0.5, 7.0),  # one divergence: every quantile is it
        ([1, 2, 3, 4, 5], 0.5, 3.0),
    ],
)
def test_quantiles_interpolate_between_ranks(values: list[int], q: float, expected: float) -> None:
    assert quantile(values, q) == pytest.approx(expected)


def test_first_divergence_names_its_unit_or_says_mixed() -> None:
    assert first_divergence([]) is None
    tokens = first_divergence([("token", 40), ("token", 10), ("token", 30), ("token", 20)])
    assert tokens is not None
    assert (tokens.unit, tokens.min, tokens.p25, tokens.p50, tokens.p75, tokens.max) == (
        "token",
        10,
        17.5,
        25.0,
        32.5,
        40,
    )
    mixed = first_divergence([("token", 3), ("char", 12)])
    assert mixed is not None
    assert mixed.unit == "mixed"


def _group(method: str, samples: int, divergences: int) -> LosslessGroup:
    at = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    return LosslessGroup(
        method=method,
        k=None,
        drafter=None,
        backend="b",
        engine_version=None,
        reference_method="plain",
        is_floor=method == "plain",
        samples=samples,
        divergences=divergences,
        by_tokens=samples,
        divergence_rate=divergences / samples,
        interval_95=wilson_interval(divergences, samples),
        first_divergence=None,
        first_seen=at,
        last_seen=at,
    )


def test_the_floor_pools_a_method_against_itself_only() -> None:
    floor = floor_of([_group("plain", 60, 3), _group("plain", 40, 2), _group("eagle3", 10, 9)])
    assert (floor.samples, floor.divergences, floor.divergence_rate) == (100, 5, 0.05)
    assert floor.interval_95 == pytest.approx((0.0215, 0.1118), abs=5e-5)
    none = floor_of([_group("eagle3", 10, 9)])
    assert (none.samples, none.divergence_rate, none.interval_95) == (0, None, None)
