"""Fitting the performance model to one (model, GPU)'s measurements, with its own error.

The free parameters are the host overheads and the achieved fractions of the GPU's memory
bandwidth and tensor-core peak (each below a ceiling no real kernel passes); the roofline
terms come from the catalogs. A fit that could only add overhead could never honour a
measurement faster than the calibration's bandwidth allows. Each measured point uses its
measured acceptance length when it has one, else the calibration's profile. The error band
is the mean absolute relative error of held-out predictions: each point predicted by a fit
that did not see it (leave-one-out up to `FOLDS` points, then that many folds).

A collector stores a point per backend per window, so a busy fleet holds thousands. Fits
run on points pooled per (method, K, quarter octave of concurrency), weighted by how many
each pools: a fit's cost follows the configurations seen, not the hours they were watched.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from planner import calibration
from planner.calibration import EngineCalibration, Workload
from planner.catalog import GpuSpec, ModelSpec
from planner.fit import nelder_mead
from planner.specdec import StepTimeModel, output_tokens_per_s

FREE = (
    "step_overhead_s",
    "per_seq_overhead_s",
    "bandwidth_efficiency",
    "compute_efficiency",
    "drafter_pass_overhead_s",
    "routing_correlation",
)
# Ceilings of the achieved fractions of datasheet peaks: decode GEMVs stream weights at up
# to ~90% of HBM bandwidth on H100/B200, large bf16 GEMMs reach ~80% of dense peak.
CEILINGS = {"bandwidth_efficiency": 0.92, "compute_efficiency": 0.85, "routing_correlation": 1.0}
MAX_EVALUATIONS = 600
FOLDS = 5  # held-out fits: leave-one-out up to this many points, then this many folds


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
    error_band: float | None  # mean |prediction / measurement - 1| on held-out points


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
    return output_tokens_per_s(step, max(round(p.concurrency), 1), _acceptance(hw, p), hw.workload)


def prefill_s_per_token(hw: Hardware, cal: EngineCalibration, prompt_tokens: int) -> float:
    """GPU-seconds per prompt token on the hardware's GPUs (the same for every method)."""
    step = StepTimeModel(hw.model, hw.gpu, hw.gpu_count, cal)
    return step.prefill_s_per_token(max(prompt_tokens, 1)) * hw.gpu_count


def _acceptance(hw: Hardware, p: MeasuredPoint) -> float:
    if not p.k:
        return 1.0
    if p.acceptance_length is not None:
        return p.acceptance_length
    profile = calibration.acceptance_profile(hw.model.name, p.method, hw.workload.name)
    return profile.mean_acceptance_length(p.k) if profile else 1.0


def _decode(x: Sequence[float], base: EngineCalibration) -> EngineCalibration:
    """Overheads are exp(v); efficiencies a logistic under their ceiling."""
    values: dict[str, Any] = {}
    for name, v in zip(FREE, x, strict=True):
        ceiling = CEILINGS.get(name)
        values[name] = math.exp(v) if ceiling is None else ceiling / (1 + math.exp(-v))
    return replace(base, **values)


def _encode(cal: EngineCalibration) -> list[float]:
    out = []
    for name in FREE:
        v, ceiling = getattr(cal, name), CEILINGS.get(name)
        if ceiling is None:
            out.append(math.log(max(v, 1e-9)))
        else:
            share = min(max(v / ceiling, 1e-3), 1 - 1e-3)
            out.append(math.log(share / (1 - share)))
    return out


def concurrency_bin(concurrency: float) -> float:
    """Concurrency rounded to a quarter octave, so nearby windows pool."""
    return float(2 ** (round(math.log2(max(concurrency, 1.0)) * 4) / 4))


def pooled(points: Sequence[MeasuredPoint]) -> list[tuple[MeasuredPoint, int]]:
    """The points pooled per (method, K, concurrency bin), each with how many it holds.

    A pool's concurrency is its points' mean, its throughput their geometric mean (the fit
    is least squares in log throughput), its acceptance the mean of those that have one.
    """
    pools: dict[tuple[str, int, float], list[MeasuredPoint]] = defaultdict(list)
    for p in points:
        pools[(p.method, p.k, concurrency_bin(p.concurrency))].append(p)
    return [(_pool(members), len(members)) for members in pools.values()]


def _pool(members: list[MeasuredPoint]) -> MeasuredPoint:
    n = len(members)
    log_tps = sum(math.log(p.output_tokens_per_s) for p in members) / n
    seen = [p.acceptance_length for p in members if p.acceptance_length is not None]
    return MeasuredPoint(
        members[0].method,
        members[0].k,
        sum(p.concurrency for p in members) / n,
        math.exp(log_tps),
        sum(seen) / len(seen) if seen else None,
    )


def fit_calibration(
    hw: Hardware, base: EngineCalibration, points: Sequence[MeasuredPoint]
) -> EngineCalibration:
    """Least squares in log throughput, with a weak pull towards the base (few points)."""
    start = _encode(base)
    pools = pooled(points)

    def loss(x: Sequence[float]) -> float:
        cal = _decode(x, base)
        fit_error = sum(
            n * math.log(predict_point(hw, cal, p) / p.output_tokens_per_s) ** 2 for p, n in pools
        )
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
    """Each point's throughput as predicted by a fit that did not see it (None below 3
    points): point i is held out in fold i mod `FOLDS`, so up to `FOLDS` points this is
    leave-one-out."""
    if len(points) < 3:
        return None
    base = base or calibration.engine_calibration()
    folds = min(len(points), FOLDS)
    out: list[float] = [0.0] * len(points)
    for fold in range(folds):
        seen = [p for i, p in enumerate(points) if i % folds != fold]
        cal = fit_calibration(hw, base, seen)
        for i in range(fold, len(points), folds):
            out[i] = predict_point(hw, cal, points[i])
    return out
