"""The planner on published sweeps it was never calibrated on (planner/data/heldout.yaml).

Nothing else reads that file: calibration uses only the figures in calibration.yaml. Each
sweep (one family, model, GPU, engine, method, K and dataset across concurrencies) is given
to the prediction contract as a user would: the lowest concurrency's plain and method
throughput as measurements, and the acceptance length. Every other concurrency's speedup is
then predicted and compared with the published one, beside the naive baseline that the
speedup stays as it was at the lowest concurrency.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from typing import Any

from planner.datafile import load_entries
from planner.predict import parse_scenario, predict


@dataclass(frozen=True, slots=True)
class HeldOutPoint:
    """One published point of a concurrency sweep."""

    family: str
    model: str
    gpu: str
    gpu_count: int
    engine: str
    method: str
    k: int
    concurrency: int
    dataset: str
    approximate: bool
    source: str
    plain_output_tokens_per_s: float | None = None
    method_output_tokens_per_s: float | None = None
    speedup: float | None = None
    acceptance_length: float | None = None
    prompt_tokens: int | None = None  # mean lengths, where the source states or implies them
    output_tokens: int | None = None

    @property
    def published_speedup(self) -> float:
        if self.speedup is not None:
            return self.speedup
        if not (self.method_output_tokens_per_s and self.plain_output_tokens_per_s):
            raise ValueError(f"{self.family} c={self.concurrency}: no speedup or throughputs")
        return self.method_output_tokens_per_s / self.plain_output_tokens_per_s


@dataclass(frozen=True)
class Check:
    """One held-out point: the published speedup, the planner's, the naive one."""

    point: HeldOutPoint
    predicted: float
    naive: float

    @property
    def error(self) -> float:
        return abs(self.predicted / self.point.published_speedup - 1)

    @property
    def naive_error(self) -> float:
        return abs(self.naive / self.point.published_speedup - 1)


@functools.cache
def points() -> tuple[HeldOutPoint, ...]:
    """Every held-out published point."""
    file = resources.files("planner").joinpath("data", "heldout.yaml")
    return load_entries(file, "points", HeldOutPoint)


def sweeps() -> dict[tuple[str, ...], list[HeldOutPoint]]:
    """Points grouped by sweep, each sorted by concurrency."""
    out: dict[tuple[str, ...], list[HeldOutPoint]] = {}
    for p in points():
        key = (p.family, p.model, p.gpu, str(p.gpu_count), p.engine, p.method, str(p.k), p.dataset)
        out.setdefault(key, []).append(p)
    return {key: sorted(sweep, key=lambda p: p.concurrency) for key, sweep in out.items()}


def scenario(sweep: list[HeldOutPoint]) -> dict[str, Any]:
    """The contract's scenario for a sweep: the lowest concurrency's throughputs and
    acceptance as the user's measurements.

    Where a source publishes only speedups, plain's throughput there is the model's own
    and the method's that times the speedup; where it publishes no acceptance, the
    acceptance is the one at which the model meets that speedup (so only the trend with
    concurrency is predicted, as from throughputs).
    """
    first = sweep[0]
    raw: dict[str, Any] = {
        "model": first.model,
        "gpu": first.gpu,
        "gpu_count": first.gpu_count,
        "engine": first.engine,
        "method": first.method,
        "k": first.k,
        "concurrency": [p.concurrency for p in sweep],
    }
    if first.prompt_tokens and first.output_tokens:
        raw |= {"prompt_tokens": first.prompt_tokens, "output_tokens": first.output_tokens}
    plain = first.plain_output_tokens_per_s
    if plain is None:
        bare = predict(
            parse_scenario({**raw, "acceptance_length": 1.0, "concurrency": [first.concurrency]})
        )
        plain = bare.predictions[0].plain_output_tokens_per_s
    al = first.acceptance_length or _implied_acceptance(raw, first)
    c = first.concurrency
    method = first.method_output_tokens_per_s or plain * first.published_speedup
    raw["acceptance_length"] = al
    raw["measurements"] = [
        {"method": "plain", "k": 0, "concurrency": c, "output_tokens_per_s": plain},
        {"method": first.method, "k": first.k, "concurrency": c,
         "output_tokens_per_s": method},
    ]  # fmt: skip
    return raw


def _implied_acceptance(raw: dict[str, Any], first: HeldOutPoint) -> float:
    """The acceptance at which the uncalibrated model's speedup at the lowest concurrency
    is the published one (bisection in [1, K + 1])."""

    def speedup(al: float) -> float:
        bare = {**raw, "acceptance_length": al, "concurrency": [first.concurrency]}
        return predict(parse_scenario(bare)).predictions[0].speedup

    lo, hi = 1.0, first.k + 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if speedup(mid) < first.published_speedup else (lo, mid)
    return (lo + hi) / 2


def checks(sweep: list[HeldOutPoint]) -> Iterator[Check]:
    """The planner's and the naive speedup at every concurrency past the lowest."""
    forecast = predict(parse_scenario(scenario(sweep)))
    speedups = {p.concurrency: p.speedup for p in forecast.predictions}
    naive = sweep[0].published_speedup
    for p in sweep[1:]:
        yield Check(p, speedups[p.concurrency], naive)
