"""Throughput curves: measured points kept, the planner's prediction filling the rest."""

from __future__ import annotations

import pytest

from gateway.curves import Aggregate, Band, Sample, Served, build_curves, extend, pool
from gateway.registry import Snapshot
from planner.fit_measurements import concurrency_bin

MODEL, GPU = "openai/gpt-oss-20b", "B200"


def test_extend_keeps_measurements_and_scales_predictions_to_meet_them() -> None:
    predicted = {1: 100.0, 2: 180.0, 4: 300.0, 8: 480.0, 16: 640.0}
    measured = [(2.0, 90.0), (4.0, 150.0)]  # half what the planner predicts
    points = dict(extend(measured, predicted))
    assert points[2.0] == 90.0
    assert points[4.0] == 150.0
    assert points[1.0] == pytest.approx(100.0 * 90 / 180)  # scaled to the lowest measurement
    assert points[8.0] == pytest.approx(480.0 * 150 / 300)  # scaled to the highest
    assert points[16.0] == pytest.approx(640.0 * 150 / 300)


def test_extend_scales_to_every_measured_point_within_an_octave_of_its_end() -> None:
    """A noisy lowest bin (0.4x the prediction beside one at 0.5x an octave up) moves the
    estimates below it by its share only; a point further up has none."""
    predicted = {1: 100.0, 2: 200.0, 4: 400.0, 8: 800.0, 16: 1600.0}
    measured = [(2.0, 80.0), (4.0, 200.0), (8.0, 800.0)]
    points = dict(extend(measured, predicted))
    assert points[1.0] == pytest.approx(100.0 * (0.4 * 0.5) ** 0.5)
    assert points[16.0] == pytest.approx(1600.0 * (0.5 * 1.0) ** 0.5)  # 4 and 8 at that end


def test_extend_interpolates_the_prediction_between_grid_points() -> None:
    predicted = {1: 100.0, 4: 300.0, 16: 600.0}
    points = dict(extend([(2.0, 100.0)], predicted))  # predicted at 2: halfway in log = 200
    assert points[4.0] == pytest.approx(300.0 * 100 / 200)
    assert points[1.0] == pytest.approx(100.0 * 100 / 200)


def test_extend_without_measurements_is_the_prediction() -> None:
    assert extend([], {1: 10.0, 2: 15.0}) == [(1.0, 10.0), (2.0, 15.0)]


@pytest.mark.parametrize(
    ("concurrency", "expected"),
    [(0.4, 1.0), (1.0, 1.0), (1.08, 1.0), (2.0, 2.0), (3.0, 2 ** (6 / 4)), (64.0, 64.0)],
)
def test_concurrency_bins_are_quarter_octaves(concurrency: float, expected: float) -> None:
    assert concurrency_bin(concurrency) == pytest.approx(expected)


def test_unmeasured_catalog_methods_get_the_planners_curve() -> None:
    served = [Served(MODEL, "plain", 0, GPU), Served(MODEL, "p-eagle", 7, GPU)]
    curves = build_curves([], served).lines
    plain, peagle = curves[(MODEL, "plain", GPU)], curves[(MODEL, "p-eagle", GPU)]
    # The planner's published-calibrated view of GPT-OSS-20B on B200 at low load:
    # P-EAGLE (K=7) roughly doubles plain decoding.
    assert 1.6 < peagle.at(1) / plain.at(1) < 3.0
    assert plain.at(64) > 10 * plain.at(1)  # batching, not saturation at the first point


def test_measured_points_stand_and_the_prediction_continues_past_them() -> None:
    key = (MODEL, "eagle3", GPU)
    points = [Aggregate(key, 3, 1.0, 400.0, 2.5), Aggregate(key, 3, 4.0, 1400.0, 2.5)]
    curve = build_curves(points, [Served(MODEL, "eagle3", 3, GPU)]).lines[key]
    assert curve.at(1) == pytest.approx(400.0)
    assert curve.at(4) == pytest.approx(1400.0)
    assert curve.at(64) > 4 * curve.at(4)  # a measured-only curve would stay at 1400


def test_models_outside_the_catalog_use_measurements_only() -> None:
    key = ("acme/private-model", "plain", GPU)
    curve = build_curves([Aggregate(key, 0, 2.0, 100.0, None)], []).lines[key]
    assert curve.at(2) == pytest.approx(100.0)
    assert curve.at(64) == pytest.approx(100.0)  # saturates: nothing to predict with
    assert build_curves([], [Served("acme/private-model", "plain", 0, GPU)]).lines == {}


def test_an_unmeasured_method_is_priced_as_off_as_the_measured_ones() -> None:
    """Measurements 20x slower than the planner expects (a time-scaled simulator, say):
    a method never measured must not look 20x faster than the measured ones."""
    served = [Served(MODEL, "plain", 0, GPU), Served(MODEL, "eagle3", 3, GPU)]
    planned = build_curves([], served).lines
    key = (MODEL, "plain", GPU)
    slow = [Aggregate(key, 0, c, planned[key].at(c) / 20, None) for c in (1.0, 4.0, 16.0)]
    curves = build_curves(slow, served).lines
    ratio = curves[(MODEL, "eagle3", GPU)].at(4) / curves[key].at(4)
    planned_ratio = planned[(MODEL, "eagle3", GPU)].at(4) / planned[key].at(4)
    assert ratio == pytest.approx(planned_ratio, rel=0.15)


def test_the_planners_error_on_a_curves_measured_points() -> None:
    """Each point predicted from the other through the planner's shape: on the shape (at any
    scale) the error is 0; with the c=4 point twice the shape's, the c=1 point is guessed
    twice too high (error 1) and the c=4 point half too low (0.5): a mean of 0.75."""
    key = (MODEL, "plain", GPU)
    served = [Served(MODEL, "plain", 0, GPU)]
    shape = build_curves([], served).lines[key]  # the prediction itself, at the grid points

    def error(at_4: float) -> float | None:
        points = [Aggregate(key, 0, 1.0, shape.at(1) / 20, None)]
        points.append(Aggregate(key, 0, 4.0, at_4 * shape.at(4) / 20, None))
        return build_curves(points, served).bands[key].planner_error

    assert error(1.0) == pytest.approx(0.0, abs=1e-9)
    assert error(2.0) == pytest.approx(0.75)
    one_point = [Aggregate(key, 0, 1.0, 100.0, None)]
    assert build_curves(one_point, served).bands[key].planner_error is None
    private = ("acme/private-model", "plain", GPU)  # no spec: no prediction to judge
    two = [Aggregate(private, 0, c, 100.0 * c, None) for c in (1.0, 4.0)]
    assert build_curves(two, []).bands[private].planner_error is None


def test_a_models_planner_error_is_the_mean_over_its_judged_curves() -> None:
    bands = {
        ("m", "plain", GPU): Band((), 0.5, 0.1),
        ("m", "eagle3", GPU): Band((), 0.5, 0.3),
        ("m", "dflash", GPU): Band((), 0.49),  # fewer than two points: not judged
        ("n", "plain", GPU): Band((), 1.0),
    }
    assert Snapshot(bands=bands).planner_error() == {"m": pytest.approx(0.2)}


def test_points_weigh_by_the_requests_behind_them() -> None:
    key = (MODEL, "plain", GPU)
    steady = Sample(key, 0, 4.0, 1000.0, requests=990)
    burst = Sample(key, 0, 4.0, 500.0, requests=10)  # a few requests, half as fast
    [point], rejected = pool([steady, burst])
    assert point.output_tokens_per_s == pytest.approx(995.0)  # (990*1000 + 10*500) / 1000
    assert (point.requests, point.points, rejected) == (1000, 2, {})
    assert point.spread == pytest.approx((0.99 * 5**2 + 0.01 * 495**2) ** 0.5 / 995)


def test_another_k_never_mixes_into_a_curve() -> None:
    key = (MODEL, "eagle3", GPU)
    points, _ = pool([Sample(key, 3, 4.0, 1400.0, 2.5, 100), Sample(key, 1, 4.0, 900.0, 1.7, 100)])
    assert sorted((p.k, p.output_tokens_per_s) for p in points) == [(1, 900.0), (3, 1400.0)]
    curves = build_curves(points, [Served(MODEL, "eagle3", 3, GPU)])
    assert curves.lines[key].at(4) == pytest.approx(1400.0)
    assert [(p.k, p.concurrency) for p in curves.measured[key]] == [(3, 4.0)]
    assert curves.k[key] == 3


def test_a_bin_whose_spread_is_noise_is_kept_out_and_counted() -> None:
    """Three windows at c=4 of 100, 1,000 and 1,900 tokens/s (no one an outlier of the
    others): a spread of 0.73 of the mean says nothing; a bin at c=8 of 2,000 +- 5% stays."""
    key = (MODEL, "plain", GPU)
    wild = [Sample(key, 0, 4.0, tps, None, 50, 256) for tps in (100.0, 1000.0, 1900.0)]
    steady = [Sample(key, 0, 8.0, tps, None, 50, 256) for tps in (1900.0, 2000.0, 2100.0)]
    [point], rejected = pool([*wild, *steady])
    assert rejected == {(key, 0): {"noise": 3}}
    assert (point.concurrency, point.output_tokens_per_s) == (8.0, 2000.0)


def test_answers_of_another_shape_and_outliers_are_kept_out_and_counted() -> None:
    key = (MODEL, "plain", GPU)
    steady = [Sample(key, 0, 4.0, 1000.0 + i, None, 50, 256) for i in range(5)]
    short = Sample(key, 0, 4.0, 300.0, requests=10, mean_output_tokens=4)  # max_tokens: 4
    wild = Sample(key, 0, 4.0, 5000.0, requests=50, mean_output_tokens=256)
    unknown = Sample(key, 0, 4.0, 1002.0)  # an old row: no sample size or shape recorded
    [point], rejected = pool([*steady, short, wild, unknown])
    assert rejected == {(key, 0): {"shape": 1, "outlier": 1}}
    assert point.points == 6
    assert 1000 <= point.output_tokens_per_s <= 1004


def test_points_of_another_drafter_or_engine_version_are_superseded_and_counted() -> None:
    """After an upgrade to 0.33.1 the 0.32.0 windows no longer price the curve; a row that
    does not say (an import) still counts, and a curve no backend serves keeps every point."""
    key, drafter = (MODEL, "p-eagle", GPU), "amazon/GPT-OSS-20B-P-EAGLE"
    old = [Sample(key, 7, 4.0, 900.0, 3.4, 50, drafter=drafter, engine_version="0.32.0")] * 3
    new = [Sample(key, 7, 4.0, 1200.0, 3.9, 50, drafter=drafter, engine_version="0.33.1")] * 2
    retrained = Sample(key, 7, 4.0, 1500.0, 4.4, 50, drafter="mine/p-eagle-v2")
    unknown = Sample(key, 7, 4.0, 1200.0, 3.9, 50)
    samples = [*old, *new, retrained, unknown]
    [point], rejected = pool(samples, {key: {(drafter, "0.33.1")}})
    assert (point.points, point.output_tokens_per_s) == (3, 1200.0)
    assert rejected == {(key, 7): {"superseded": 4}}
    # the version not read yet: every version of the drafter matches, never another drafter
    [point], rejected = pool(samples, {key: {(drafter, None)}})
    assert (point.points, rejected) == (6, {(key, 7): {"superseded": 1}})
    _, rejected = pool(samples, {})
    assert rejected == {}
