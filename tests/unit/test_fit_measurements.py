"""Fitting to measurements: recovering a known calibration, and an honest error band."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner import calibration, catalog
from planner.fit_measurements import (
    Hardware,
    MeasuredPoint,
    fit_calibration,
    fit_measurements,
    held_out_predictions,
    pooled,
    predict_point,
)

HW = Hardware(
    catalog.model("Qwen/Qwen3-8B"), catalog.gpu("H100"), 1, calibration.workloads()["chat"]
)
BASE = calibration.engine_calibration()
# A "true" engine that differs from the shipped calibration: slower host, better bandwidth.
TRUTH = replace(BASE, step_overhead_s=BASE.step_overhead_s * 2.5, bandwidth_efficiency=0.72)
CONFIGS = [("plain", 0, c) for c in (1, 4, 16, 64)] + [("dflash", 7, c) for c in (1, 8, 32)]


def measured(cal: object = TRUTH) -> list[MeasuredPoint]:
    points = [MeasuredPoint(m, k, c, 1.0) for m, k, c in CONFIGS]
    return [replace(p, output_tokens_per_s=predict_point(HW, TRUTH, p)) for p in points]


def test_fit_reproduces_the_measurements_and_predicts_unmeasured_points() -> None:
    fitted = fit_measurements(HW, measured())
    for p in measured():
        assert predict_point(HW, fitted.calibration, p) == pytest.approx(
            p.output_tokens_per_s, rel=0.03
        )
    for unseen in (MeasuredPoint("dflash", 7, 2, 1.0), MeasuredPoint("plain", 0, 8, 1.0)):
        truth = predict_point(HW, TRUTH, unseen)
        fitted_error = abs(predict_point(HW, fitted.calibration, unseen) / truth - 1)
        shipped_error = abs(predict_point(HW, BASE, unseen) / truth - 1)
        assert fitted_error < 0.03
        assert fitted_error < shipped_error


def test_error_band_comes_from_leave_one_out() -> None:
    fitted = fit_measurements(HW, measured())
    assert fitted.points == len(CONFIGS)
    assert fitted.error_band is not None
    assert 0 <= fitted.error_band < 0.1
    noisy = [
        replace(p, output_tokens_per_s=p.output_tokens_per_s * (1.25 if i % 2 else 0.8))
        for i, p in enumerate(measured())
    ]
    rough = fit_measurements(HW, noisy)
    assert rough.error_band is not None
    assert rough.error_band > fitted.error_band


def test_too_few_points_have_no_band_and_none_keeps_the_base() -> None:
    assert fit_measurements(HW, measured()[:2]).error_band is None
    empty = fit_measurements(HW, [])
    assert (empty.calibration, empty.points, empty.error_band) == (BASE, 0, None)


def test_points_pool_per_method_k_and_quarter_octave() -> None:
    seen = ((16.0, 100.0, 3.0), (17.0, 400.0, None), (64.0, 50.0, 4.0))
    points = [MeasuredPoint("dflash", 7, c, tps, al) for c, tps, al in seen]
    points.append(MeasuredPoint("dflash", 5, 16.0, 80.0))
    pools = {(p.method, p.k, round(p.concurrency, 3)): (p, n) for p, n in pooled(points)}
    assert set(pools) == {("dflash", 7, 16.5), ("dflash", 7, 64.0), ("dflash", 5, 16.0)}
    pool, count = pools[("dflash", 7, 16.5)]
    assert count == 2
    assert pool.output_tokens_per_s == pytest.approx(200.0)  # geometric mean of 100 and 400
    assert pool.acceptance_length == 3.0  # only the points that have one


def test_many_windows_of_few_configurations_fit_as_those_configurations() -> None:
    """Hours of windows at the same loads cost a fit what those loads cost, and fit as well."""
    few = measured()
    many = few * 40
    assert len(pooled(many)) == len(few)
    cal = fit_calibration(HW, BASE, many)
    for p in few:
        assert predict_point(HW, cal, p) == pytest.approx(p.output_tokens_per_s, rel=0.03)
    held_out = held_out_predictions(HW, many)
    assert held_out is not None
    assert len(held_out) == len(many)
    for p, guess in zip(many, held_out, strict=True):  # other folds saw the same loads
        assert guess == pytest.approx(p.output_tokens_per_s, rel=0.03)
