"""Pricing a request at its own context: the KV cache it reads at every step.

A curve's throughput is measured (else predicted) for its traffic's mean context `X` (the
prompt and half the answer a decoding sequence holds on average). A decode step reads each
sequence's KV cache once, whatever the step verifies, so a sequence of context `x` adds
`(x - X) * kv_s` GPU-seconds to each of its steps against the curve's mean one; `kv_s` is
the planner's step-time model's own slope (seconds of step per context token of one
sequence, at the curve's concurrency, K and drafter). Over the request's steps (its own
verify steps where the engine reported them, else its output over the method's acceptance;
one per token for plain) at the GPU's price this is the request's context correction: added
to its output cost, signed (a short context pays less), and never more negative than the
whole KV share of its steps (a sequence of no context still streams the weights). Plain's
baseline gets its own correction at plain's slope: speculation reads the KV cache once for
several tokens, so a long context's extra cost is smaller for it, which is why long
contexts favour speculation.

Where it holds: models and GPUs in the planner's catalog (elsewhere no correction). How
sure: the planner's slope, known to the planner's error on the figures it was calibrated
around (`CALIBRATED_ERROR`), which is added to the cost's half-width.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from planner import calibration, catalog
from planner.catalog import UnknownCatalogEntry
from planner.specdec import StepShape, StepTimeModel, mean_context_tokens

PROBE_TOKENS = 1024  # the slope's step: every sequence's context this much longer


@dataclass(frozen=True, slots=True)
class Context:
    """A curve's mean context, its method's tokens per step, and the step-time slope at
    each of its line's concurrencies: (concurrency, seconds per context token of one
    sequence per step, the share of a step that is the sequences' KV reads)."""

    mean_tokens: float
    acceptance: float  # output tokens per step of one sequence (1 for plain)
    slope: tuple[tuple[float, float, float], ...]
    concurrencies: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "concurrencies", tuple(p[0] for p in self.slope))

    def at(self, c: float) -> tuple[float, float]:
        """The slope and the KV share at concurrency c (log-linear between points)."""
        xs = self.concurrencies
        i = bisect.bisect_left(xs, c)
        if i == 0:
            return self.slope[0][1:]
        if i == len(xs):
            return self.slope[-1][1:]
        (c0, k0, f0), (c1, k1, f1) = self.slope[i - 1], self.slope[i]
        t = math.log(c / c0) / math.log(c1 / c0)
        return k0 + t * (k1 - k0), f0 + t * (f1 - f0)

    def usd(
        self, context: float, steps: float, c: float, usd_per_gpu_hour: float, output_usd: float
    ) -> float:
        """The signed correction of a request of mean context `context` over `steps` steps
        at concurrency c, whose output the curve priced at `output_usd`."""
        slope, kv_share = self.at(max(c, 1.0))
        extra = (context - self.mean_tokens) * slope * steps * usd_per_gpu_hour / 3600
        return max(extra, -kv_share * output_usd)


def context_model(
    model: str,
    method: str,
    gpu: str,
    k: int,
    concurrencies: Sequence[float],
    lengths: tuple[float, float] | None,
    acceptance: float | None,
) -> Context | None:
    """The context model of a curve: `lengths` (mean prompt, mean output tokens) of its
    traffic, else the planner's chat workload's; `acceptance` its measured acceptance
    length, else the published one (None for a model or GPU the planner does not know)."""
    try:
        spec, hardware = catalog.model(model), catalog.gpu(gpu)
    except UnknownCatalogEntry:
        return None
    workload = calibration.workloads()["chat"]
    mean = lengths[0] + lengths[1] / 2 if lengths else float(mean_context_tokens(workload))
    if acceptance is None:
        profile = calibration.acceptance_profile(model, method, workload.name) if k else None
        acceptance = profile.mean_acceptance_length(k) if profile else 1.0
    drafter = calibration.drafters().get(method) if k else None
    step = StepTimeModel(spec, hardware, 1, calibration.engine_calibration(), drafter, k)
    slope = []
    for c in sorted({max(round(c), 1) for c in concurrencies}):
        base = step.step_s(_shape(c, k, mean))
        per_token = (step.step_s(_shape(c, k, mean + PROBE_TOKENS)) - base) / (c * PROBE_TOKENS)
        slope.append((float(c), per_token, min(c * mean * per_token / base, 1.0)))
    return Context(mean, acceptance, tuple(slope))


def _shape(c: int, k: int, context: float) -> StepShape:
    return StepShape(c, c * (1 + k), c * k, 0, round(c * context))
