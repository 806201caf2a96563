"""Fitting the performance model to one (model, GPU)'s measurements, with its own error.

The free parameters are the host overheads and the achieved bandwidth; the roofline terms
come from the catalogs. Each measured point uses its measured acceptance length when it has
one, else the calibration's profile. The error band is the mean absolute relative error of
leave-one-out predictions: each point predicted by a fit that did not see it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from planner import calibration
from planner.calibration import EngineCalibration, Workload
from planner.catalog import GpuSpec, ModelSpec
from planner.fit import nelder_mead
from planner.specdec import StepTimeModel, output_tokens_per_s

FREE = ("step_overhead_s", "per_seq_overhead_s", "bandwidth_efficiency", "drafter_pass_overhead_s")
MAX_EVALUATIONS = 600


@dataclass(frozen=True)
class MeasuredPoint:
    """One measured throughput of a method at a concurrency."""

    method: str
    k: int
    concurrency: float
    output_tokens_per_s: float  # aggregate, for the backend's GPUs
    acceptance_length: float | None = None


@dataclass(frozen=True)
class FittedModel:
    """A calibration fitted to measurements, and how wrong it is on points it did not see."""

    calibration: EngineCalibration
    points: int
    error_band: float | None  # mean |prediction / measurement - 1| under leave-one-out


@dataclass(frozen=True)
class Hardware:
    """What the measurements ran on, and the traffic they saw."""

    model: ModelSpec
    gpu: GpuSpec
    gpu_count: int
    workload: Workload


def predict_point(hw: Hardware, cal: EngineCalibration, p: MeasuredPoint) -> float:
    """The model's output tokens/s for a measured configuration."""
    drafter = calibration.drafters().get(p.method) if p.k else None
    step = StepTimeModel(hw.model, hw.gpu, hw.gpu_count, cal, drafter, p.k)
    return output_tokens_per_s(step, max(round(p.concurrency), 1), _acceptance(hw, p),
                               hw.workload)  # fmt: skip


def _acceptance(hw: Hardware, p: MeasuredPoint) -> float:
    if not p.k:
        return 1.0
    if p.acceptance_length is not None:
        return p.acceptance_length
    profile = calibration.acceptance_profile(hw.model.name, p.method, hw.workload.name)
    return profile.mean_acceptance_length(p.k) if profile else 1.0


def _decode(x: Sequence[float], base: EngineCalibration) -> EngineCalibration:
    values: dict[str, Any] = {}
    for name, v in zip(FREE, x, strict=True):
        values[name] = 1 / (1 + math.exp(-v)) if name == "bandwidth_efficiency" else math.exp(v)
    return replace(base, **values)


def _encode(cal: EngineCalibration) -> list[float]:
    out = []
    for name in FREE:
        v = getattr(cal, name)
        if name == "bandwidth_efficiency":
            v = min(max(v, 1e-3), 1 - 1e-3)
            out.append(math.log(v / (1 - v)))
        else:
            out.append(math.log(max(v, 1e-9)))
    return out


def fit_calibration(
    hw: Hardware, base: EngineCalibration, points: Sequence[MeasuredPoint]
) -> EngineCalibration:
    """Least squares in log throughput, with a weak pull towards the base (few points)."""
    start = _encode(base)

    def loss(x: Sequence[float]) -> float:
        cal = _decode(x, base)
        fit_error = sum(math.log(predict_point(hw, cal, p) / p.output_tokens_per_s) ** 2
                        for p in points)  # fmt: skip
        prior = 0.01 * sum((a - b) ** 2 for a, b in zip(x, start, strict=True))
        return fit_error + prior

    best, _ = nelder_mead(loss, start, step=0.2, max_evaluations=MAX_EVALUATIONS)
    return _decode(best, base)


def fit_measurements(
    hw: Hardware, points: Sequence[MeasuredPoint], base: EngineCalibration | None = None
) -> FittedModel:
    """Fit to the points; the error band needs at least three of them."""
    base = base or calibration.engine_calibration()
    usable = [p for p in points if p.output_tokens_per_s > 0 and p.concurrency > 0]
    if not usable:
        return FittedModel(base, 0, None)
    predictions = held_out_predictions(hw, usable, base)
    band = None
    if predictions is not None:
        errors = [
            abs(q / p.output_tokens_per_s - 1) for q, p in zip(predictions, usable, strict=True)
        ]
        band = sum(errors) / len(errors)
    return FittedModel(fit_calibration(hw, base, usable), len(usable), band)


def held_out_predictions(
    hw: Hardware, points: Sequence[MeasuredPoint], base: EngineCalibration | None = None
) -> list[float] | None:
    """Each point's throughput as predicted by a fit to the others (None below 3 points)."""
    if len(points) < 3:
        return None
    base = base or calibration.engine_calibration()
    out = []
    for i, held_out in enumerate(points):
        cal = fit_calibration(hw, base, [p for j, p in enumerate(points) if j != i])
        out.append(predict_point(hw, cal, held_out))
    return out
