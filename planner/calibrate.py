"""Fitting the engine coefficients to published throughput figures (GPT-OSS-20B on B200).

`bench/fit_calibration.py` prints a fit for the data file; `planner.accuracy` refits with
figures held out to measure how well the model predicts what it did not see.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import fields, replace
from typing import Any

from planner import calibration, catalog, sweeps
from planner.calibration import EngineCalibration, RatioPoint, SweepPoint, ThroughputPoint
from planner.fit import nelder_mead
from planner.specdec import StepTimeModel, output_tokens_per_s

MODEL, GPU = "openai/gpt-oss-20b", "B200"
K_CHOICES = (3, 5, 7)
FRACTIONS = {"bandwidth_efficiency", "compute_efficiency", "routing_correlation", "plain_overlap"}
# Compute efficiency is not identifiable from these figures (decode at c <= 64 is memory- and
# overhead-bound), so it stays at its datasheet-typical value in the data file.
# plain_overlap is an engine's scheduling (SGLang's overlap scheduler), not a fitted value.
FIXED = {"compute_efficiency", "plain_overlap"}
NAMES = [
    f.name
    for f in fields(EngineCalibration)
    if f.type in ("NonNegative", "Fraction") and f.name not in FIXED
]


# The search's box: a coefficient that runs off to 0 (or 1) stays where a step can bring
# it back, so a restart can leave a local minimum.
LOG_FLOOR, LOGIT_BOUND = math.log(1e-10), 12.0


def decode(
    x: Sequence[float], base: EngineCalibration, names: Sequence[str] = NAMES
) -> EngineCalibration:
    """Coefficients from the unconstrained search vector (log or logistic per field)."""
    values: dict[str, Any] = {
        name: 1 / (1 + math.exp(-min(max(v, -LOGIT_BOUND), LOGIT_BOUND)))
        if name in FRACTIONS
        else math.exp(min(max(v, LOG_FLOOR), 0.0))  # 1e-10 s to 1 s
        for name, v in zip(names, x, strict=True)
    }
    return replace(base, **values)


def encode(cal: EngineCalibration, names: Sequence[str] = NAMES) -> list[float]:
    """The search vector of a calibration."""
    out = []
    for name in names:
        v = getattr(cal, name)
        if name in FRACTIONS:
            v = min(max(v, 1e-3), 1 - 1e-3)
            out.append(math.log(v / (1 - v)))
        else:
            out.append(math.log(max(v, 1e-10)))
    return out


def tps(cal: EngineCalibration, method: str, workload: str, c: int, k: int | None) -> float:
    """Modelled output tokens/s; k=None takes the best of K_CHOICES."""
    if k is None and method != "plain":
        return max(tps(cal, method, workload, c, kk) for kk in K_CHOICES)
    k = k or 0
    model = catalog.model(MODEL)
    drafter = calibration.drafters().get(method)
    step_model = StepTimeModel(model, catalog.gpu(GPU), 1, cal, drafter, k)
    profile = calibration.acceptance_profile(MODEL, method, workload)
    al = profile.mean_acceptance_length(k) if profile else 1.0
    return output_tokens_per_s(step_model, c, al, calibration.workloads()[workload])


def residuals(
    cal: EngineCalibration,
    throughput: Sequence[ThroughputPoint] | None = None,
    ratios: Sequence[RatioPoint] | None = None,
) -> list[tuple[str, float, float]]:
    """(label, weight, log error) of each published figure (all of them by default)."""
    throughput = calibration.throughput_points() if throughput is None else throughput
    ratios = calibration.ratio_points() if ratios is None else ratios
    out = []
    for p in throughput:
        got = tps(cal, p.method, p.workload, p.concurrency, None)
        weight = 0.5 if p.approximate else 3.0
        label = f"{p.method} {p.workload} c={p.concurrency}"
        out.append((label, weight, math.log(got / p.output_tokens_per_s)))
    for r in ratios:
        pe = tps(cal, "p-eagle", r.workload, r.concurrency, None)
        e3 = tps(cal, "eagle3", r.workload, r.concurrency, None)
        out.append((f"P/E {r.workload} c={r.concurrency}", 2.0, math.log(pe / e3 / r.ratio)))
    for workload in ("code", "chat", "mixed"):  # best K at low concurrency: E 3, P 7
        best_p = tps(cal, "p-eagle", workload, 1, 7) / tps(cal, "p-eagle", workload, 1, 5)
        best_e = tps(cal, "eagle3", workload, 1, 3) / tps(cal, "eagle3", workload, 1, 5)
        out.append((f"P K=7 best {workload}", 10.0, min(0.0, math.log(best_p))))
        out.append((f"E K=3 best {workload}", 10.0, min(0.0, math.log(best_e))))
    return out


BAR = 0.09  # keep calibrated figures inside the 10% bar, with a margin


def objective(
    cal: EngineCalibration,
    throughput: Sequence[ThroughputPoint] | None = None,
    ratios: Sequence[RatioPoint] | None = None,
) -> float:
    """Weighted squared log errors, plus a steep wall at the bar for calibrated figures."""
    total = 0.0
    for _, weight, error in residuals(cal, throughput, ratios):
        total += (weight * error) ** 2
        if weight >= 2.0:
            total += 100 * max(0.0, abs(error) - BAR) ** 2
    return total


def sweep_objective(cal: EngineCalibration, points: Sequence[SweepPoint]) -> float:
    """Squared log errors of the sweeps' throughputs (what the planner predicts unmeasured)
    and of what the prediction contract predicts from one measured load: each speculative
    point's speedup over plain, and plain's throughput over its lowest concurrency's."""
    rows = sweeps.modelled(cal, points)
    return sum(r.log_error**2 for r in rows) + sum(e**2 for e in sweeps.shape_errors(rows))


# Seeds for coefficients a data file leaves at 0, so the search (in log space) can reach
# them: about what one layer's MoE kernels and collectives take.
SEEDS = {
    "moe_per_layer_s": 2e-5,
    "moe_per_token_layer_s": 1e-7,
    "collective_per_layer_s": 2e-5,
    "collective_per_token_layer_s": 1e-7,
}


def shown(names: Sequence[str], sweep_points: Sequence[SweepPoint]) -> list[str]:
    """The coefficients of `names` that the data can show: collectives need a sweep on more
    than one GPU."""
    multi_gpu = any(p.gpu_count > 1 for p in sweep_points)
    return [n for n in names if not n.startswith("collective_") or multi_gpu]


def fit_engine(
    base: EngineCalibration,
    throughput: Sequence[ThroughputPoint] | None = None,
    ratios: Sequence[RatioPoint] | None = None,
    restarts: int = 4,
    sweep_points: Sequence[SweepPoint] = (),
    free: Sequence[str] = NAMES,
) -> tuple[EngineCalibration, float]:
    """Engine coefficients fitted to published figures (all, or the ones given) and to
    load sweeps; with `throughput` and `ratios` both empty, to the sweeps alone. A
    coefficient the data cannot show stays as it is: collectives without a sweep on more
    than one GPU. Only the `free` coefficients move."""
    figures = not (throughput == [] and ratios == [])
    names = shown(free, sweep_points)
    seeds: dict[str, Any] = {n: v for n, v in SEEDS.items() if n in names and not getattr(base, n)}
    seeded = replace(base, **seeds)

    def total(v: Sequence[float]) -> float:
        cal = decode(v, seeded, names)
        return (objective(cal, throughput, ratios) if figures else 0.0) + (
            sweep_objective(cal, sweep_points) if sweep_points else 0.0
        )

    x, best = encode(seeded, names), float("inf")
    for restart in range(restarts):  # restarts help Nelder-Mead out of a collapsed simplex
        step = 1.0 if restart % 2 and sweep_points else 0.3  # wide, then fine
        x, best = nelder_mead(total, x, step=step, max_evaluations=3000)
    return decode(x, seeded, names), best


# Which load sweeps each engine is fitted to, and what they move. vLLM's other coefficients
# come from the GPT-OSS-20B figures and stay: 5.8 adds what only it shows (an MoE's cost by
# tokens per step, collectives across eight GPUs), fitted with those figures kept in view.
# SGLang had no figures of its own: 5.6 and 5.7 fit its coefficients, all but how alike a
# sequence's tokens route, which is the model's traffic and not the engine (vLLM's value).
SWEEP_SECTIONS = {"vllm": ("5.8",), "sglang": ("5.6", "5.7")}
SWEEP_TERMS = {
    "vllm": (
        "moe_per_layer_s",
        "moe_per_token_layer_s",
        "collective_per_layer_s",
        "collective_per_token_layer_s",
    ),
    "sglang": tuple(n for n in NAMES if n != "routing_correlation"),
}


def fit_engine_to_sweeps(engine: str, restarts: int = 8) -> tuple[EngineCalibration, float]:
    """`engine`'s coefficients fitted to its load sweeps (and vLLM's to its figures too),
    from the same start whatever the data file holds now: the seeds, and vLLM's values
    for the rest of what moves. A term its sweeps cannot show is vLLM's: SGLang's sweeps
    are on one GPU, and collectives are the GPUs' and their interconnect's, not the
    scheduler's (5.8 is the only sweep across GPUs)."""
    points = [p for p in calibration.sweep_points() if p.section in SWEEP_SECTIONS[engine]]
    figures: list[Any] | None = None if engine == "vllm" else []
    vllm = calibration.engine_calibration("vllm")
    free = shown(SWEEP_TERMS[engine], points)
    start: dict[str, Any] = {
        n: SEEDS[n] if n in free and n in SEEDS else getattr(vllm, n) for n in SWEEP_TERMS[engine]
    }
    return fit_engine(
        replace(calibration.engine_calibration(engine), **start),
        figures,
        figures,
        restarts=restarts,
        sweep_points=points,
        free=free,
    )
