"""The step-time model on the published load sweeps (calibration.yaml `sweeps`: reference
sections 5.6-5.8): one configuration's output tokens/s at each concurrency.

A sweep is one (section, model, method, K, dataset) across concurrencies. Its acceptance is
the source's where published; where not (5.8), the one its lowest concurrency implies under
the coefficients being tried (tokens/s = c x acceptance / step time, solved for the
acceptance), so that point is met and the others test how a step's cost grows with load.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from planner import calibration, catalog
from planner.calibration import EngineCalibration, SweepPoint
from planner.specdec import StepTimeModel, mean_step_s, output_tokens_per_s

SweepKey = tuple[str, str, str, int, str]  # section, model, method, K, dataset


def sweep_key(p: SweepPoint) -> SweepKey:
    return (p.section, p.model, p.method, p.k or 0, p.dataset)


def step_model(cal: EngineCalibration, p: SweepPoint) -> StepTimeModel:
    """The step-time model of the point's configuration."""
    drafter = calibration.drafters().get(p.method) if p.k else None
    model, gpu = catalog.model(p.model), catalog.gpu(p.gpu)
    return StepTimeModel(model, gpu, p.gpu_count, cal, drafter, p.k or 0)


def implied_acceptance(cal: EngineCalibration, p: SweepPoint) -> float:
    """The acceptance at which the model meets `p`'s throughput (within [1, K + 1])."""
    step, workload = step_model(cal, p), calibration.workloads()[p.workload]
    al = 1.0 + (p.k or 0) / 2
    for _ in range(4):  # the prefill share of a step moves a little with the acceptance
        seconds = mean_step_s(step, p.concurrency, al, workload)
        al = min(max(p.output_tokens_per_s * seconds / p.concurrency, 1.0), (p.k or 0) + 1.0)
    return al


def acceptances(cal: EngineCalibration, points: Iterable[SweepPoint]) -> dict[SweepKey, float]:
    """Each sweep's acceptance: published, else implied by its lowest concurrency."""
    lowest: dict[SweepKey, SweepPoint] = {}
    for p in points:
        key = sweep_key(p)
        if key not in lowest or p.concurrency < lowest[key].concurrency:
            lowest[key] = p
    out = {}
    for key, p in lowest.items():
        if not p.k:
            out[key] = 1.0
        elif p.acceptance_length is not None:
            out[key] = p.acceptance_length
        else:
            out[key] = implied_acceptance(cal, p)
    return out


@dataclass(frozen=True)
class Modelled:
    """A published point beside the model's throughput for it."""

    point: SweepPoint
    acceptance_length: float
    output_tokens_per_s: float

    @property
    def log_error(self) -> float:
        return math.log(self.output_tokens_per_s / self.point.output_tokens_per_s)


def modelled(cal: EngineCalibration, points: Sequence[SweepPoint]) -> list[Modelled]:
    """Every point beside the model's throughput at its acceptance."""
    al = acceptances(cal, points)
    out = []
    for p in points:
        a = al[sweep_key(p)]
        workload = calibration.workloads()[p.workload]
        tps = output_tokens_per_s(step_model(cal, p), p.concurrency, a, workload)
        out.append(Modelled(p, a, tps))
    return out


def speedups(rows: Sequence[Modelled]) -> list[tuple[Modelled, float, float]]:
    """Each speculative point with its published and modelled speedup over the plain
    point of the same section, dataset and concurrency."""
    plain = {
        (r.point.section, r.point.dataset, r.point.concurrency): r
        for r in rows
        if r.point.method == "plain"
    }
    out = []
    for r in rows:
        base = plain.get((r.point.section, r.point.dataset, r.point.concurrency))
        if r.point.method == "plain" or base is None:
            continue
        published = r.point.output_tokens_per_s / base.point.output_tokens_per_s
        out.append((r, published, r.output_tokens_per_s / base.output_tokens_per_s))
    return out


def shape_errors(rows: Sequence[Modelled]) -> list[float]:
    """Log errors of each speculative point's speedup over plain, and of each plain point's
    throughput over its sweep's lowest concurrency."""
    out = [math.log(modelled / published) for _, published, modelled in speedups(rows)]
    plain = [r for r in rows if r.point.method == "plain"]
    lowest: dict[SweepKey, Modelled] = {}
    for r in plain:
        key = sweep_key(r.point)
        if key not in lowest or r.point.concurrency < lowest[key].point.concurrency:
            lowest[key] = r
    for r in plain:
        base = lowest[sweep_key(r.point)]
        if r is not base:
            out.append(r.log_error - base.log_error)
    return out
