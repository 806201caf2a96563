"""Method and K per load: the grid of predictions, the best choice per concurrency, crossovers.

For a model on a GPU, every method with an acceptance profile is evaluated at each K and
concurrency; the best (highest output tokens/s, i.e. lowest $/1M tokens on the same GPUs)
within an inter-token-latency objective wins. Adjacent concurrency ranges with different
choices are the crossover points; the K per range is vLLM's
`num_speculative_tokens_per_batch_size` schedule.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from planner import calibration, catalog
from planner.calibration import EngineCalibration, Workload
from planner.cost import usd_per_mtok
from planner.memory import max_concurrency
from planner.specdec import StepTimeModel, mean_step_s

METHODS = ("plain", "eagle3", "p-eagle", "dflash", "dspark")
K_CHOICES = (1, 2, 3, 4, 5, 6, 7, 8)
# Parallel drafters verify long blocks: DFlash ships block 16 (K = 15).
PARALLEL_K_CHOICES = (*K_CHOICES, 10, 12, 15)
CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CLIFF_RATIO = 0.85  # a K change that loses more than 15% of throughput at the boundary


@dataclass(frozen=True)
class Point:
    """One method, K and concurrency, predicted."""

    method: str
    k: int
    concurrency: int
    output_tokens_per_s: float
    itl_ms: float
    usd_per_mtok: float


@dataclass(frozen=True)
class Choice:
    """The best point at one concurrency."""

    concurrency: int
    best: Point
    plain: Point


def grid(
    model: str,
    gpu: str,
    *,
    gpu_count: int = 1,
    workload: str = "chat",
    price_usd_per_gpu_hour: float | None = None,
    concurrency: Sequence[int] = CONCURRENCY,
    cal: EngineCalibration | None = None,
) -> list[Point]:
    """Every method, K and concurrency predicted for `model` on `gpu`."""
    spec, hardware = catalog.model(model), catalog.gpu(gpu)
    price = price_usd_per_gpu_hour or catalog.default_price(hardware.name).usd_per_gpu_hour
    cal = cal or calibration.engine_calibration()
    load = calibration.workloads()[workload]
    points = []
    for method in METHODS:
        profile = calibration.acceptance_profile(spec.name, method, workload)
        if method != "plain" and profile is None:
            continue
        shape = calibration.drafters().get(method)
        choices = PARALLEL_K_CHOICES if shape is not None and shape.parallel else K_CHOICES
        for k in (0,) if method == "plain" else choices:
            drafter = shape if k else None
            step = StepTimeModel(spec, hardware, gpu_count, cal, drafter, k)
            fits = max_concurrency(step, load)
            if not fits:
                if method == "plain":
                    raise DoesNotFit(spec.name, hardware.name, gpu_count)
                continue  # its drafter leaves no room for a sequence
            al = profile.mean_acceptance_length(k) if profile else 1.0
            points += [_point(step, method, k, c, al, load, price, fits) for c in concurrency]
    return points


class DoesNotFit(ValueError):
    """The model's weights leave no KV cache for one sequence on these GPUs."""

    def __init__(self, model: str, gpu: str, gpu_count: int) -> None:
        super().__init__(
            f"{model} does not fit on {gpu_count} x {gpu}: its weights leave no room for "
            "one sequence's KV cache; use more GPUs"
        )


def _point(
    step: StepTimeModel,
    method: str,
    k: int,
    c: int,
    al: float,
    load: Workload,
    price: float,
    fits: int,
) -> Point:
    """Past `fits` sequences the engine runs `fits` and the rest wait: throughput stays,
    a client's time per token (the ITL the objective judges) grows with the queue."""
    running = min(c, fits)
    tps = running * al / mean_step_s(step, running, al, load)
    return Point(method, k, c, tps, c / tps * 1000, usd_per_mtok(price, step.gpu_count, tps))


def best_per_concurrency(points: Sequence[Point], itl_objective_ms: float | None) -> list[Choice]:
    """The highest-throughput point within the ITL objective, at each concurrency."""
    choices = []
    for c in sorted({p.concurrency for p in points}):
        here = [p for p in points if p.concurrency == c]
        plain = next(p for p in here if p.method == "plain")
        ok = [p for p in here if itl_objective_ms is None or p.itl_ms <= itl_objective_ms]
        best = max(ok or [plain], key=lambda p: p.output_tokens_per_s)
        choices.append(Choice(c, best, plain))
    return choices


def best_per_method(
    points: Sequence[Point], itl_objective_ms: float | None
) -> dict[str, list[Point]]:
    """Each method's best K at each concurrency: its curve, for comparing methods.

    Best is the highest throughput within the ITL objective, else the highest at all.
    """
    groups: dict[tuple[str, int], list[Point]] = {}
    for p in points:
        groups.setdefault((p.method, p.concurrency), []).append(p)
    curves: dict[str, list[Point]] = {}
    for (method, _), here in sorted(groups.items()):
        ok = [p for p in here if itl_objective_ms is None or p.itl_ms <= itl_objective_ms]
        curves.setdefault(method, []).append(max(ok or here, key=lambda p: p.output_tokens_per_s))
    return curves


def crossovers(choices: Sequence[Choice]) -> list[tuple[int, str, str]]:
    """(concurrency, from, to) wherever the best method changes."""
    out = []
    for before, after in itertools.pairwise(choices):
        if before.best.method != after.best.method:
            out.append((after.concurrency, before.best.method, after.best.method))
    return out


def k_schedule(points: Sequence[Point], method: str) -> list[tuple[int, int, int]]:
    """vLLM's `num_speculative_tokens_per_batch_size` for a backend running `method`.

    Each batch range gets the method's best K there, or 0 where plain decoding is faster.
    """
    concurrencies = sorted({p.concurrency for p in points})
    schedule: list[tuple[int, int, int]] = []
    for i, c in enumerate(concurrencies):
        own = [p for p in points if p.method == method and p.concurrency == c]
        plain = next(p for p in points if p.method == "plain" and p.concurrency == c)
        best = max(own, key=lambda p: p.output_tokens_per_s)
        k = best.k if best.output_tokens_per_s > plain.output_tokens_per_s else 0
        lo = concurrencies[i - 1] + 1 if i else 1
        if schedule and schedule[-1][2] == k:
            schedule[-1] = (schedule[-1][0], c, k)
        else:
            schedule.append((lo, c, k))
    return schedule


def cliffs(
    points: Sequence[Point], schedule: Sequence[tuple[int, int, int]], method: str
) -> list[str]:
    """Warnings where a schedule's K changes with a big throughput step at the boundary."""
    by_key = {(p.method, p.k, p.concurrency): p for p in points}
    warnings = []
    for (_, hi, k_left), (_, _, k_right) in itertools.pairwise(schedule):
        left = by_key.get((method if k_left else "plain", k_left, hi))
        right = by_key.get((method if k_right else "plain", k_right, hi))
        if left and right and right.output_tokens_per_s < CLIFF_RATIO * left.output_tokens_per_s:
            warnings.append(
                f"at batch {hi}: K {k_left} -> {k_right} drops throughput "
                f"{left.output_tokens_per_s:.0f} -> {right.output_tokens_per_s:.0f} tok/s"
            )
    return warnings
