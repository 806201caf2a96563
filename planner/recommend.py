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
# More speculation (a longer block, or any over plain) must predict at least 2% more
# throughput to be chosen. The planner's speedup error on the sweeps is 7-12%
# (ACCURACY.md), so a smaller gap does not rank two configurations; and every published
# sweep (reference 5.6-5.8) loses long blocks first as load grows, where the model's
# error on them is largest (5.8 at c=256: K=3 +7%, K=6 +13%).
MORE_SPECULATION_MARGIN = 0.02


@dataclass(frozen=True)
class Point:
    """One method, K and concurrency, predicted."""

    method: str
    k: int
    concurrency: int
    output_tokens_per_s: float
    itl_ms: float
    usd_per_mtok: float
    # The model whose published acceptance priced this point, when none is published for
    # this one with this method: a drafter that may not exist for it.
    borrowed_from: str | None = None


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
        borrowed = calibration.acceptance_borrowed_from(spec.name, method, workload)
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
            points += [
                _point(step, method, k, c, al, load, price, fits, borrowed) for c in concurrency
            ]
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
    borrowed_from: str | None,
) -> Point:
    """Past `fits` sequences the engine runs `fits` and the rest wait: throughput stays,
    a client's time per token (the ITL the objective judges) grows with the queue."""
    running = min(c, fits)
    tps = running * al / mean_step_s(step, running, al, load)
    usd = usd_per_mtok(price, step.gpu_count, tps)
    return Point(method, k, c, tps, c / tps * 1000, usd, borrowed_from)


def best_per_concurrency(points: Sequence[Point], itl_objective_ms: float | None) -> list[Choice]:
    """The highest-throughput point within the ITL objective, at each concurrency.

    Methods priced with another model's acceptance compete only when no speculative method
    has this model's own; more speculation must pay by MORE_SPECULATION_MARGIN.
    """
    points = evidenced(points)
    choices = []
    for c in sorted({p.concurrency for p in points}):
        here = [p for p in points if p.concurrency == c]
        plain = next(p for p in here if p.method == "plain")
        ok = [p for p in here if itl_objective_ms is None or p.itl_ms <= itl_objective_ms]
        choices.append(Choice(c, leanest(ok or [plain]), plain))
    return choices


def evidenced(points: Sequence[Point]) -> list[Point]:
    """`points` without those priced with another model's acceptance, unless every
    speculative point is: a drafter published for this model beats a borrowed guess."""
    own = [p for p in points if p.borrowed_from is None]
    return own if any(p.method != "plain" for p in own) else list(points)


def borrowed_notes(points: Sequence[Point]) -> list[str]:
    """One line per method priced with another model's acceptance, saying whether it
    competed (see `evidenced`)."""
    borrowed = sorted({(p.method, p.borrowed_from) for p in points if p.borrowed_from})
    competes = len(evidenced(points)) == len(points)
    return [
        f"{method}: no acceptance published for this model; priced with {source}'s"
        + ("" if competes else ", so not ranked")
        for method, source in borrowed
    ]


def leanest(candidates: Sequence[Point]) -> Point:
    """The fastest candidate, or the one with the least speculation within
    MORE_SPECULATION_MARGIN of it: plain, else the same method at a smaller K."""
    best = max(candidates, key=lambda p: p.output_tokens_per_s)
    floor = best.output_tokens_per_s / (1 + MORE_SPECULATION_MARGIN)
    leaner = [
        p
        for p in candidates
        if p.output_tokens_per_s >= floor and (p.method == "plain" or p.method == best.method)
    ]
    return min(leaner, key=lambda p: p.k)


def best_per_method(
    points: Sequence[Point], itl_objective_ms: float | None
) -> dict[str, list[Point]]:
    """Each method's best K at each concurrency: its curve, for comparing methods.

    Best is the highest throughput within the ITL objective, else the highest at all;
    a longer block must pay by MORE_SPECULATION_MARGIN.
    """
    groups: dict[tuple[str, int], list[Point]] = {}
    for p in points:
        groups.setdefault((p.method, p.concurrency), []).append(p)
    curves: dict[str, list[Point]] = {}
    for (method, _), here in sorted(groups.items()):
        ok = [p for p in here if itl_objective_ms is None or p.itl_ms <= itl_objective_ms]
        curves.setdefault(method, []).append(leanest(ok or here))
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

    Each batch range gets the method's best K there, or 0 where plain decoding is faster
    (or the method does not pay by MORE_SPECULATION_MARGIN).
    """
    concurrencies = sorted({p.concurrency for p in points})
    schedule: list[tuple[int, int, int]] = []
    for i, c in enumerate(concurrencies):
        own = [p for p in points if p.method == method and p.concurrency == c]
        plain = next(p for p in points if p.method == "plain" and p.concurrency == c)
        k = leanest([*own, plain]).k
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
