"""Calibration data: engine coefficients, drafter shapes, workloads, published figures."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from planner.acceptance import AcceptanceProfile, fit_geometric
from planner.datafile import CatalogError, Fraction, NonNegative, load_entries

# Decay assumed for acceptance profiles published at one K only (the median of the
# two-point fits on GPT-OSS-20B, where conditional acceptance falls ~5% per position).
DEFAULT_DECAY = 0.95
DEFAULT_WORKLOAD = "chat"


@dataclass(frozen=True, slots=True)
class EngineCalibration:
    """Coefficients of the step-time model beyond the hardware's datasheet numbers."""

    name: str
    step_overhead_s: NonNegative
    per_seq_overhead_s: NonNegative
    per_token_overhead_s: NonNegative
    bandwidth_efficiency: Fraction
    compute_efficiency: Fraction
    drafter_pass_overhead_s: NonNegative
    drafter_per_seq_overhead_s: NonNegative
    drafter_per_token_layer_s: NonNegative
    routing_correlation: Fraction
    source: str
    notes: str = ""
    # Share of plain decoding's host overhead hidden behind the GPU's step by an overlap
    # scheduler (SGLang's; it is off for its speculative decoding, which pays both).
    plain_overlap: Fraction = 0.0
    # GPU seconds each token a step scores adds per layer of an MoE model, beyond the
    # roofline: routing, dispatch and combine, and expert GEMMs of a few rows each, which
    # run far below peak. It makes a long verification block cost what it does under load.
    moe_per_token_layer_s: NonNegative = 0.0
    # GPU seconds per layer of an MoE model per step, whatever its tokens: the routing and
    # dispatch kernels every MoE layer launches (what makes a small MoE slow at one sequence).
    moe_per_layer_s: NonNegative = 0.0
    # Seconds per layer per step of a model spread over GPUs: its collectives' latency (a
    # tensor-parallel all-reduce, an expert-parallel dispatch and combine).
    collective_per_layer_s: NonNegative = 0.0
    # And per token each step scores, per layer: what the collectives move grows with the
    # tokens (an expert-parallel dispatch sends each token's hidden state to its experts).
    collective_per_token_layer_s: NonNegative = 0.0


@dataclass(frozen=True, slots=True)
class DrafterShape:
    """A drafter's size and whether it drafts all K positions in one pass."""

    method: str
    layers: int
    parallel: bool
    draft_vocab_size: int | None
    source: str


@dataclass(frozen=True, slots=True)
class Workload:
    """Mean prompt and output lengths of a kind of traffic."""

    name: str
    prompt_tokens: int
    output_tokens: int
    source: str


@dataclass(frozen=True, slots=True)
class AcceptancePoint:
    """A published mean acceptance length (bonus token included)."""

    model: str
    method: str
    workload: str
    k: int
    acceptance_length: float
    source: str


@dataclass(frozen=True, slots=True)
class ThroughputPoint:
    """A published output throughput at a concurrency."""

    model: str
    gpu: str
    workload: str
    concurrency: int
    method: str
    output_tokens_per_s: float
    approximate: bool
    source: str


@dataclass(frozen=True, slots=True)
class RatioPoint:
    """A published P-EAGLE / EAGLE-3 throughput ratio (best K each) at a concurrency."""

    workload: str
    concurrency: int
    ratio: float
    source: str


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """A published output throughput of one configuration at one concurrency of a load
    sweep; `acceptance_length` None where the source publishes none (then the one its
    lowest concurrency implies is used)."""

    section: str
    model: str
    gpu: str
    gpu_count: int
    engine: str
    method: str
    k: int | None  # None for plain decoding
    dataset: str
    workload: str
    concurrency: int
    output_tokens_per_s: float
    acceptance_length: float | None
    source: str


def _file() -> Traversable:
    return resources.files("planner").joinpath("data", "calibration.yaml")


def load_engines(file: Traversable | Path) -> dict[str, EngineCalibration]:
    """Engine calibrations by name."""
    return {e.name: e for e in load_entries(file, "engines", EngineCalibration)}


DEFAULT_ENGINE = "vllm"


def engines() -> tuple[str, ...]:
    """The engines calibrated: vLLM (the default) and SGLang."""
    return tuple(load_engines(_file()))


@functools.cache
def engine_calibration(name: str = DEFAULT_ENGINE) -> EngineCalibration:
    """The named engine's calibration."""
    engines = load_engines(_file())
    if name not in engines:
        raise CatalogError(f"calibration.yaml: no engine {name!r}; known: {', '.join(engines)}")
    return engines[name]


@functools.cache
def drafters() -> Mapping[str, DrafterShape]:
    """Drafter shapes by method id."""
    return {d.method: d for d in load_entries(_file(), "drafters", DrafterShape)}


@functools.cache
def workloads() -> Mapping[str, Workload]:
    """Workloads by name."""
    return {w.name: w for w in load_entries(_file(), "workloads", Workload)}


@functools.cache
def acceptance_points() -> tuple[AcceptancePoint, ...]:
    """Every published acceptance length."""
    return load_entries(_file(), "acceptance", AcceptancePoint)


@functools.cache
def throughput_points() -> tuple[ThroughputPoint, ...]:
    """Every published throughput figure."""
    return load_entries(_file(), "throughput", ThroughputPoint)


@functools.cache
def sweep_points() -> tuple[SweepPoint, ...]:
    """Every point of the published load sweeps."""
    return load_entries(_file(), "sweeps", SweepPoint)


@functools.cache
def ratio_points() -> tuple[RatioPoint, ...]:
    """Every published P-EAGLE / EAGLE-3 throughput ratio."""
    return load_entries(_file(), "ratios", RatioPoint)


@functools.cache
def acceptance_profile(model: str, method: str, workload: str) -> AcceptanceProfile | None:
    """The profile fitted to published points, preferring this model, else any model.

    None for methods without published acceptance (plain, ngram, ...).
    """
    chosen = _acceptance_evidence(model, method, workload)
    if not chosen:
        return None
    points = {p.k: p.acceptance_length for p in chosen if p.workload == chosen[0].workload}
    first, decay = fit_geometric(points, None if len(points) > 1 else DEFAULT_DECAY)
    return AcceptanceProfile.geometric(first, decay)


def acceptance_borrowed_from(model: str, method: str, workload: str) -> str | None:
    """The other model whose published acceptance `acceptance_profile` uses for `model`
    when none is published for `model` with `method` (on any workload), else None: a
    borrowed profile prices a drafter nobody may have trained for this model."""
    if any(p.method == method and p.model in (model, "*") for p in acceptance_points()):
        return None
    chosen = _acceptance_evidence(model, method, workload)
    return chosen[0].model if chosen else None


def _acceptance_evidence(model: str, method: str, workload: str) -> list[AcceptancePoint]:
    candidates = [p for p in acceptance_points() if p.method == method and p.workload == workload]
    if not candidates:
        candidates = [p for p in acceptance_points() if p.method == method]
        candidates = [p for p in candidates if p.workload == DEFAULT_WORKLOAD] or candidates
    if not candidates:
        return []
    same_model = [p for p in candidates if p.model == model]
    return same_model or [p for p in candidates if p.model == candidates[0].model]
