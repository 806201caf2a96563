"""The most output tokens/s hardware can deliver: the ceiling a measured point must sit under.

The bound is an ideal engine: the datasheet's memory bandwidth and fastest dense tensor-core
peak (FP4 where the GPU has it) at 100%, no host overhead, no drafter, no KV cache read, and
experts touched as little as the tokens allow (each sequence's tokens routed alike). Each
step streams the weights once and computes the tokens it keeps; `concurrency` sequences keep
`tokens_per_step` each (1 for plain decoding, the mean acceptance length with speculation).
The rate `concurrency * tokens_per_step / step_s` is concave in the concurrency, so a
time-average of it stays under the bound at the mean concurrency: no real window of a real
engine can measure above it. One measured above it (times a margin for a catalog that is off
by a quantisation, say) is an artefact of how it was measured, not the hardware.
"""

from __future__ import annotations

from planner import catalog
from planner.catalog import GpuSpec, ModelSpec, UnknownCatalogEntry


def ideal_step_s(
    model: ModelSpec, gpu: GpuSpec, gpu_count: int, tokens: float, seqs: float
) -> float:
    """The least time a step that keeps `tokens` tokens of `seqs` sequences can take."""
    experts = model.expert_weight_bytes()
    weights = model.weight_bytes() - experts + experts * model.expert_fraction_read(seqs)
    memory_s = weights / (gpu.hbm_bytes_per_s * gpu_count)
    peak = max(p for p in (gpu.bf16_flops_per_s, gpu.fp8_flops_per_s, gpu.fp4_flops_per_s) if p)
    compute_s = tokens * model.flops_per_token() / (peak * gpu_count)
    return max(memory_s, compute_s)


def output_tokens_per_s_ceiling(
    model: str, gpu: str, gpu_count: int, concurrency: float, tokens_per_step: float
) -> float | None:
    """The ideal engine's output tokens/s at `concurrency` sequences keeping
    `tokens_per_step` tokens each per step; None for a model or GPU not in the catalog."""
    try:
        spec, gpu_spec = catalog.model(model), catalog.gpu(gpu)
    except UnknownCatalogEntry:
        return None
    seqs = max(concurrency, 1.0)
    tokens = seqs * max(tokens_per_step, 1.0)
    return tokens / ideal_step_s(spec, gpu_spec, max(gpu_count, 1), tokens, seqs)


def ceiling_exceeded(
    model: str,
    gpu: str,
    gpu_count: int,
    concurrency: float,
    acceptance_length: float | None,
    output_tokens_per_s: float,
    margin: float,
) -> float | None:
    """The ceiling a point's rate is above, `margin` times over (None: it is not, or the
    catalog does not know the model or GPU). Plain points keep one token per step."""
    ceiling = output_tokens_per_s_ceiling(
        model, gpu, gpu_count, concurrency, acceptance_length or 1.0
    )
    if ceiling is None or output_tokens_per_s <= margin * ceiling:
        return None
    return ceiling
