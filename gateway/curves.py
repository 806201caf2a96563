"""Throughput curves per (model, method, GPU type): measured where measured, planned elsewhere.

A curve drawn through measurements alone knows nothing past its highest measured
concurrency (it saturates there), so a method that has only seen exploration traffic would
look hopeless at high load and the selector could never move to it. For models and GPUs in
the planner's catalog, the planner's prediction fills the concurrencies no measurement
covers, scaled to agree with the nearest measured point; a method with a backend but no
measurement yet gets the prediction scaled by how far the planner is from the measured
methods of that model and GPU. Models outside the catalog keep curves from their
measurements only.

The prediction uses the planner's published calibration, not one refitted to these
measurements: a live fleet often has measured one method only, and four overhead and
bandwidth parameters fitted to one method's points bend the other methods' predictions
(a uniformly slower host reads as large drafter overheads and penalises sequential
drafters). Anchoring each curve to measurements corrects the level; the planner supplies
the shape. (`GET /admin/v1/plan` does fit, with its held-out error band.)
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from planner import calibration, catalog
from planner.calibration import EngineCalibration
from planner.catalog import UnknownCatalogEntry
from planner.cost import ThroughputCurve
from planner.fit_measurements import Hardware, MeasuredPoint, predict_point
from planner.recommend import CONCURRENCY

WORKLOAD = "chat"  # the traffic the planner assumes for live requests
CurveKey = tuple[str, str, str]  # (model, method, GPU type)


@dataclass(frozen=True, slots=True)
class Served:
    """A (method, K) some enabled backend of a model runs on a GPU type."""

    model: str
    method: str
    k: int
    gpu_type: str


@dataclass(frozen=True, slots=True)
class Aggregate:
    """The mean of a (model, method, GPU, concurrency)'s measurements, per GPU."""

    key: CurveKey
    k: int
    concurrency: float
    output_tokens_per_s: float
    acceptance_length: float | None


def build_curves(
    points: Iterable[Aggregate], served: Iterable[Served]
) -> dict[CurveKey, ThroughputCurve]:
    """Curves for every measured key and every served (model, method, GPU)."""
    by_key: dict[CurveKey, list[Aggregate]] = defaultdict(list)
    for p in points:
        by_key[p.key].append(p)
    wanted = {(s.model, s.method, s.gpu_type): s.k for s in served}
    for key, rows in by_key.items():
        wanted.setdefault(key, max(r.k for r in rows))
    curves = {}
    for key, k in wanted.items():
        curve = _curve(key, k, by_key)
        if curve is not None:
            curves[key] = curve
    return curves


def _curve(
    key: CurveKey, k: int, by_key: Mapping[CurveKey, list[Aggregate]]
) -> ThroughputCurve | None:
    rows = by_key.get(key, [])
    hardware = _hardware(key[0], key[2])
    if hardware is None:
        return ThroughputCurve.from_points(_pairs(rows)) if rows else None
    cal = calibration.engine_calibration()
    al = _mean_acceptance(rows)
    scale = 1.0  # with rows of its own, `extend` anchors the prediction to them
    if not rows:
        same = [r for (m, _, g), rs in by_key.items() if (m, g) == (key[0], key[2]) for r in rs]
        scale = _residual_scale(hardware, cal, same)
    predicted = {
        c: scale * predict_point(hardware, cal, MeasuredPoint(key[1], k, c, 0.0, al))
        for c in CONCURRENCY
    }
    return ThroughputCurve.from_points(extend(_pairs(rows), predicted))


def extend(
    measured_points: list[tuple[float, float]], predicted: Mapping[int, float]
) -> list[tuple[float, float]]:
    """Measured points, plus predictions outside their range scaled to meet them (pure)."""
    if not measured_points:
        return [(float(c), tps) for c, tps in predicted.items()]
    low, high = min(measured_points), max(measured_points)
    lows = [c for c in predicted if c < low[0]]
    highs = [c for c in predicted if c > high[0]]
    out = list(measured_points)
    if lows:
        scale = low[1] / _predicted_at(predicted, low[0])
        out += [(float(c), predicted[c] * scale) for c in lows]
    if highs:
        scale = high[1] / _predicted_at(predicted, high[0])
        out += [(float(c), predicted[c] * scale) for c in highs]
    return out


def _predicted_at(predicted: Mapping[int, float], c: float) -> float:
    """The prediction at c, interpolated on the predicted grid."""
    return ThroughputCurve.from_points([(float(x), y) for x, y in predicted.items()]).at(c)


def _residual_scale(hw: Hardware, cal: EngineCalibration, rows: Iterable[Aggregate]) -> float:
    """How far the fitted prediction is from this (model, GPU)'s measurements, as a factor.

    The geometric mean of measured over predicted: a method never measured is priced as off
    as the measured ones are, not in different units (a slower host, a simulator scaled in
    time, a calibration the fit could not fully reach).
    """
    logs = [math.log(r.output_tokens_per_s / predict_point(hw, cal, _point(r))) for r in rows]
    return math.exp(sum(logs) / len(logs)) if logs else 1.0


def _hardware(model: str, gpu: str) -> Hardware | None:
    try:
        spec, hardware = catalog.model(model), catalog.gpu(gpu)
    except UnknownCatalogEntry:
        return None
    return Hardware(spec, hardware, 1, calibration.workloads()[WORKLOAD])


def _pairs(rows: Iterable[Aggregate]) -> list[tuple[float, float]]:
    return [(r.concurrency, r.output_tokens_per_s) for r in rows if r.concurrency > 0]


def _point(r: Aggregate) -> MeasuredPoint:
    return MeasuredPoint(r.key[1], r.k, r.concurrency, r.output_tokens_per_s, r.acceptance_length)


def _mean_acceptance(rows: list[Aggregate]) -> float | None:
    seen = [r.acceptance_length for r in rows if r.acceptance_length is not None]
    return sum(seen) / len(seen) if seen else None
